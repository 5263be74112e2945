"""The writer on a long run: the telemetry demo's stream of N events (default 10M) through
a real hub at level normal with the default flush interval.

Measured: the writer's own CPU per event (its manifest's ``cpu_ns``: conversion, parts,
merges, manifests and the close), the most part files on disk while the run was written
(sampled every :data:`SAMPLE_S`), and the close (``hub.close()``: last flush, every type
merged into one zstd file, fsync, final manifest), in seconds; bytes per event of the
closed run. The producer (the demo simulator, which runs the model's real lifecycle
code) emits as fast as it can: a stress of the writer's batches, not a training run's
pace (``telemetry_overhead.py`` measures that).

    python benchmarks/writer.py                   # 10,000,000 events
    python benchmarks/writer.py --events 1000000
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

from esper.core.enums import TelemetryLevel
from esper.telemetry.demo import DemoSettings, emit_demo
from esper.telemetry.hub import open_run
from esper.telemetry.manifest import read_manifest
from esper.telemetry.paths import manifest_path

DEFAULT_EVENTS = 10_000_000
QUICK_EVENTS = 20_000
#: How often the sampler counts the files on disk while the run is written.
SAMPLE_S = 0.5
ENVS, STEPS = 4, 25
#: Upper bound of the demo's rounds (it stops once it has emitted the events asked for).
MIN_EVENTS_PER_ROUND = ENVS * STEPS * 4


def count_files(run_dir: Path) -> int:
    return sum(1 for _ in (run_dir / "events").rglob("*.parquet"))


def measure(n: int, root: Path) -> dict[str, Any]:
    hub = open_run(root, "writer", level=TelemetryLevel.NORMAL)
    assert hub.run_dir is not None
    run_dir = hub.run_dir
    most = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_S):
            most[0] = max(most[0], count_files(run_dir))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    settings = DemoSettings(
        envs=ENVS, rounds=n // MIN_EVENTS_PER_ROUND + 1, steps=STEPS, seed=0,
        level=TelemetryLevel.NORMAL, rollback_p=0.02, max_events=n,
    )  # fmt: skip
    t0 = time.perf_counter()
    emit_demo(hub, settings)
    emit_s = time.perf_counter() - t0
    done.set()
    sampler.join()
    at_close = count_files(run_dir)
    t1 = time.perf_counter()
    hub.close()
    close_s = time.perf_counter() - t1
    manifest = read_manifest(manifest_path(run_dir, 0))
    events = sum(manifest.counts.values())
    size = sum(p.stat().st_size for p in (run_dir / "events").rglob("*.parquet"))
    return {
        "events": events,
        "emit_s": emit_s,
        "close_s": close_s,
        "writer_cpu_s": manifest.writer.cpu_ns / 1e9,
        "writer_cpu_us_per_event": manifest.writer.cpu_ns / 1e3 / events,
        "flushes": manifest.writer.flushes,
        "merges": manifest.writer.compactions,
        "most_files_while_running": max(most[0], at_close),
        "files_at_close": at_close,
        "files_after_close": count_files(run_dir),
        "bytes_per_event": size / events,
    }


def main(argv: list[str] | None = None) -> int:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=None, help="events in the run")
    args = p.parse_args(argv)
    n = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)
    info = C.machine_info()
    C.print_machine(info)
    root = Path(tempfile.mkdtemp(prefix="esper-writer-"))
    try:
        r = measure(n, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    C.print_table(
        f"Writer on the demo stream, {r['events']:,} events",
        ["figure", "value"],
        [[k, v] for k, v in r.items()],
    )
    print(
        f"close: {r['close_s']:.2f} s to merge {r['files_at_close']} files into "
        f"{r['files_after_close']}; writer CPU {r['writer_cpu_us_per_event']:.2f} us per event",
        flush=True,
    )
    C.write_results(
        args.out,
        "writer",
        {"benchmark": "writer", "machine": info, "quick": args.quick, "result": r},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
