"""What the per-flush typed parts cost the writer in a burst: an experiment, not a mode.

A burst (``writer.py``'s 200,000 events emitted back to back) reaches the writer in
batches of thousands; each batch becomes one lz4 Parquet part per type (durable at
once), and the close merges each type's parts into one zstd file, so every event is
Parquet-encoded twice. This script injects part sinks (``open_run(sink=...)``) to
measure what a cheaper first encoding would buy, by turns in one process:

- ``parquet``: the shipped sink (lz4 Parquet parts, zstd Parquet merge);
- ``parquet-held``: the same, with the writer's fresh-table budget raised so that every
  merge is built from the tables it still holds (the setting the next two need);
- ``ipc``: the parts written as uncompressed Arrow IPC files (the merge stays zstd
  Parquet). Not crash-proof as written here: IPC has no page checksums, and no reader
  of this package reads such parts;
- ``no-parts``: nothing written until the merge: the lower bound (not durable at all).

    python benchmarks/writer_parts.py              # 200,000 events x 3 repeats
    python benchmarks/writer_parts.py --quick
"""

from __future__ import annotations

import os
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
import pyarrow as pa
import pyarrow.parquet as pq

from esper.core.enums import TelemetryLevel
from esper.telemetry import writer as writer_module
from esper.telemetry.events import Event
from esper.telemetry.hub import TelemetryHub, open_run
from esper.telemetry.paths import tmp_path_for
from esper.telemetry.sink import ParquetSink

DEFAULT_EVENTS = 200_000
QUICK_EVENTS = 5_000
DEFAULT_REPEATS = 3
#: A fresh-table budget no burst of this benchmark reaches (every merge from memory).
HELD_BUDGET_BYTES = 1 << 40


class IpcPartSink(ParquetSink):
    """Parts as uncompressed Arrow IPC files (atomic); compacted files as shipped."""

    def write_table(self, table: pa.Table, path: Path) -> int:
        tmp = tmp_path_for(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with pa.OSFile(str(tmp), "wb") as out, pa.ipc.new_file(out, table.schema) as ipc:
            ipc.write_table(table)
        os.replace(tmp, path)
        return path.stat().st_size


class NoPartSink(ParquetSink):
    """No part on disk at all: what the merge alone costs."""

    def write_table(self, table: pa.Table, path: Path) -> int:
        return 0


VARIANTS: dict[str, tuple[type[ParquetSink], int]] = {
    "parquet": (ParquetSink, writer_module.FRESH_CACHE_BYTES),
    "parquet-held": (ParquetSink, HELD_BUDGET_BYTES),
    "ipc": (IpcPartSink, HELD_BUDGET_BYTES),
    "no-parts": (NoPartSink, HELD_BUDGET_BYTES),
}


def burst(events: list[Event], root: Path, name: str, variant: str) -> tuple[float, float, int]:
    """(events/s from open_run to a closed run, writer CPU us per event, rows in the
    closed run's files) of one burst."""
    sink_class, budget = VARIANTS[variant]
    shipped = writer_module.FRESH_CACHE_BYTES
    writer_module.FRESH_CACHE_BYTES = budget
    try:
        t0 = time.perf_counter()
        hub = open_run(root, name, level=TelemetryLevel.NORMAL, sink=sink_class())
        emit = hub.emit
        for event in events:
            emit(event)
        hub.close()
        seconds = time.perf_counter() - t0
    finally:
        writer_module.FRESH_CACHE_BYTES = shipped
    assert isinstance(hub, TelemetryHub)
    counters: dict[str, Any] = msgspec.to_builtins(hub.manifest_counters)
    rows = sum(pq.read_metadata(f).num_rows for f in (root / name).rglob("*.parquet"))
    return len(events) / seconds, counters["cpu_ns"] / len(events) / 1000, rows


def main(argv: list[str] | None = None) -> int:
    p = C.base_parser(__doc__.splitlines()[0])
    args = p.parse_args(argv)
    n = QUICK_EVENTS if args.quick else DEFAULT_EVENTS
    repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)
    info = C.machine_info(threads=1)
    C.print_machine(info)
    mix = E.record_mix(quick=args.quick)
    root = Path(tempfile.mkdtemp(prefix="esper-writer-parts-"))
    samples: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    rows_kept: dict[str, list[int]] = {v: [] for v in VARIANTS}
    try:
        burst(E.fresh_copies(mix, n), root, "warmup", "parquet")  # unmeasured
        for rep in range(repeats):
            for variant in C.alternate(tuple(VARIANTS), rep):
                name = f"{variant}-{rep}"
                rate, cpu_us, rows = burst(E.fresh_copies(mix, n), root, name, variant)
                rows_kept[variant].append(rows)
                shutil.rmtree(root / name)
                samples[variant].append((rate, cpu_us))
                print(
                    f"  rep {rep}: {variant:12s} {rate:,.0f} events/s, {cpu_us:.2f} us", flush=True
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = {
        v: {
            "events_per_s": C.median([r for r, _ in s]),
            "writer_cpu_us_per_event": C.median([c for _, c in s]),
            "samples": [{"events_per_s": r, "writer_cpu_us_per_event": c} for r, c in s],
            "rows_in_closed_run": rows_kept[v],
        }
        for v, s in samples.items()
    }
    rows = [
        [v, f"{r['events_per_s']:,.0f}", f"{r['writer_cpu_us_per_event']:.2f}"]
        for v, r in results.items()
    ]
    C.print_table(
        f"Writer burst by part format, {n:,} events, median of {repeats}",
        ["parts", "events/s", "writer CPU us/event"],
        rows,
    )
    C.write_results(
        args.out,
        "writer_parts",
        {"machine": info, "quick": args.quick, "events": n, "results": results},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
