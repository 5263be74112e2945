"""Writer throughput: events/s from ``emit`` to closed Parquet, and bytes per event on disk,
side by side with a plain JSON-lines writer on the same events.

- ``parquet``: ``open_run`` (level normal, default queue and flush interval), ``emit``
  every event, ``close`` (final drain, compaction into one file per type, final
  manifest). Time from before ``open_run`` to after ``close``; bytes = every Parquet
  file and manifest of the run directory.
- ``jsonl``: ``json.dumps(msgspec.to_builtins(event))`` per event, one line each, into a
  buffered text file, closed. The events are the very ones the first Parquet pass
  stamped (same ``run_id``/``seq``/``ts_ns``), so both writers store the same content.

Events are unstamped copies of a real normal-level run's per-round events (see
:mod:`_events`). Repeats alternate which writer goes first; medians are reported.
Targets: Parquet >= 10x the JSON-lines events/s, and <= 1/5 of its bytes per event.

    python benchmarks/writer.py
    python benchmarks/writer.py --events 1000000 --repeats 5
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _events as E
import msgspec

from esper.core.enums import TelemetryLevel
from esper.telemetry.events import Event
from esper.telemetry.hub import TelemetryHub, open_run

DEFAULT_EVENTS = 200_000
QUICK_EVENTS = 2_000
DEFAULT_REPEATS = 3
TARGET_SPEEDUP = 10.0
TARGET_BYTES_FRACTION = 0.2
#: CPU the writer may spend per event (its manifest's ``cpu_ns``), microseconds.
TARGET_WRITER_CPU_US = 1.0
WRITERS = ("parquet", "jsonl")
#: The bounded-memory pass streams this many times the benchmark's events ...
MEMORY_FACTOR = 5
#: ... and samples RSS at this many evenly spaced points.
MEMORY_MARKS = 10


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def write_parquet(events: list[Event], root: Path, name: str) -> tuple[float, int, dict[str, Any]]:
    """(seconds, bytes on disk, writer counters) from open_run to a closed run."""
    t0 = time.perf_counter()
    hub = open_run(root, name, level=TelemetryLevel.NORMAL)
    emit = hub.emit
    for event in events:
        emit(event)
    hub.close()
    seconds = time.perf_counter() - t0
    assert isinstance(hub, TelemetryHub)
    counters = msgspec.to_builtins(hub.manifest_counters)
    return seconds, dir_bytes(root / name), counters


def write_jsonl(events: list[Event], path: Path) -> tuple[float, int]:
    """(seconds, bytes) of the plain JSON-lines writer, file closed."""
    t0 = time.perf_counter()
    to_builtins, dumps = msgspec.to_builtins, json.dumps
    with path.open("w", encoding="utf-8") as fh:
        write = fh.write
        for event in events:
            write(dumps(to_builtins(event)) + "\n")
    seconds = time.perf_counter() - t0
    return seconds, path.stat().st_size


def rss_mb() -> float:
    """Current resident set size (VmRSS) in MiB; NaN where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def memory_profile(mix: list[Event], n: int, root: Path) -> dict[str, Any]:
    """RSS while ``n`` events stream through a hub, made one at a time (untimed).

    Nothing outside the hub holds the events, so a flat profile after the queue has
    filled once shows the writer's memory is bounded by its queue, not the run length.
    """
    hub = open_run(root, "memory", level=TelemetryLevel.NORMAL)
    marks = {n * k // MEMORY_MARKS for k in range(1, MEMORY_MARKS + 1)}
    samples: list[float] = []
    cycle = E.fresh_copies(mix, len(mix))
    for i in range(1, n + 1):
        hub.emit(msgspec.structs.replace(cycle[i % len(cycle)]))
        if i in marks:
            samples.append(rss_mb())
    hub.close()
    shutil.rmtree(root / "memory", ignore_errors=True)
    settled = samples[len(samples) // 2 :]
    return {
        "events": n,
        "rss_mb_at_marks": samples,
        "growth_second_half_mb": max(settled) - min(settled) if settled else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=None, help="events per pass")
    args = p.parse_args(argv)
    n = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)
    repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)
    info = C.machine_info(threads=1)
    C.print_machine(info)
    mix = E.record_mix(quick=args.quick)
    root = Path(tempfile.mkdtemp(prefix="esper-writer-"))
    samples: dict[str, list[tuple[float, int]]] = {w: [] for w in WRITERS}
    counters: list[dict[str, Any]] = []
    try:
        stamped = E.fresh_copies(mix, n)
        write_parquet(stamped, root, "warmup")  # unmeasured; stamps the JSON-lines events
        shutil.rmtree(root / "warmup")
        for rep in range(repeats):
            for writer in C.alternate(WRITERS, rep):
                if writer == "parquet":
                    name = f"parquet-{rep}"
                    secs, size, ctr = write_parquet(E.fresh_copies(mix, n), root, name)
                    counters.append(ctr)
                    shutil.rmtree(root / name)
                else:
                    path = root / f"events-{rep}.jsonl"
                    secs, size = write_jsonl(stamped, path)
                    path.unlink()
                samples[writer].append((secs, size))
                print(f"  rep {rep}: {writer:7s} {n / secs:,.0f} events/s", flush=True)
        del stamped  # the memory pass must not share the heap with 200k kept events
        memory = memory_profile(mix, n * MEMORY_FACTOR, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results: dict[str, Any] = {}
    for writer in WRITERS:
        rates = [n / s for s, _ in samples[writer]]
        median_bytes = C.median([float(b) for _, b in samples[writer]])
        results[writer] = {
            "events_per_s": C.median(rates),
            "samples": rates,
            "bytes_per_event": median_bytes / n,
        }
    writer_cpu_us = C.median([c["cpu_ns"] / 1e3 / n for c in counters])
    results["parquet"]["writer_cpu_us_per_event"] = writer_cpu_us
    speedup = C.ratio(results["parquet"]["events_per_s"], results["jsonl"]["events_per_s"])
    bytes_fraction = C.ratio(
        results["parquet"]["bytes_per_event"], results["jsonl"]["bytes_per_event"]
    )
    C.print_table(
        f"Writer throughput, {n:,} events x {repeats} repeats (median)",
        ["writer", "events/s", "bytes/event"],
        [[w, r["events_per_s"], r["bytes_per_event"]] for w, r in results.items()],
    )
    print(
        f"writer thread CPU: {writer_cpu_us:.2f} us per event "
        f"(target <= {TARGET_WRITER_CPU_US:g} us; conversion, Parquet, merges, manifests)"
    )
    marks = ", ".join(f"{v:.0f}" for v in memory["rss_mb_at_marks"])
    print(f"RSS (MB) while {memory['events']:,} events stream through the hub: {marks}")
    print(
        f"parquet/jsonl: {speedup:.1f}x events/s (target >= {TARGET_SPEEDUP:g}x), "
        f"{bytes_fraction:.3f} of the bytes (target <= {TARGET_BYTES_FRACTION:g})",
        flush=True,
    )
    C.write_results(
        args.out,
        "writer",
        {
            "benchmark": "writer",
            "machine": info,
            "quick": args.quick,
            "events": n,
            "repeats": repeats,
            "mix": E.composition(mix),
            "writers": results,
            "speedup": speedup,
            "bytes_fraction": bytes_fraction,
            "targets": {
                "speedup": TARGET_SPEEDUP,
                "bytes_fraction": TARGET_BYTES_FRACTION,
                "writer_cpu_us_per_event": TARGET_WRITER_CPU_US,
            },
            "parquet_writer_counters": counters,
            "memory": memory,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
