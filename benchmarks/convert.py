"""The writer's conversion, events -> Arrow tables: CPU ns per event on freshly made
events.

Each repeat makes a batch of fresh unstamped copies of a real normal-level run's events
(see :mod:`_events`), the size of a full writer queue, groups it by type as the writer
does, evicts the CPU caches (a pass over a buffer larger than them: the writer meets
events another thread wrote a moment ago, not warm ones), and converts it with
``events_to_tables``. Variants:

- ``pyarrow``: without the native converter (``native=False``).
- ``native, GIL held``: the native converter, every value read with the GIL held.
- ``native, GIL released``: the native converter as the writer uses it for a batch:
  scalars read with the GIL released, lists and non-ASCII strings after, with it.

``ns/event`` is the converting thread's CPU time (median of the repeats). Releasing the
GIL costs about the same CPU; what it buys, the producer emitting while the writer
converts, shows in ``writer.py``'s events/s (and is tested in
``tests/telemetry/test_native_columns.py``).

    python benchmarks/convert.py
    python benchmarks/convert.py --events 65536 --repeats 11
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _events as E
import numpy as np

from esper.telemetry.arrow_schema import events_to_tables
from esper.telemetry.events import EVENT_TYPES, Event
from esper.telemetry.hub import DEFAULT_QUEUE_CAPACITY
from esper.telemetry.journal import group_by_type

DEFAULT_EVENTS = DEFAULT_QUEUE_CAPACITY
QUICK_EVENTS = 2_000
DEFAULT_REPEATS = 7
#: Bytes written between batch and conversion to push the batch out of the caches.
EVICT_BYTES = 64 * 1024 * 1024
#: Options of ``events_to_tables`` per variant.
VARIANTS: dict[str, dict[str, bool]] = {
    "pyarrow": {"native": False},
    "native, GIL held": {"native": True, "release_gil": False},
    "native, GIL released": {"native": True, "release_gil": True},
}
NS_PER_S = 1e9


def convert_once(mix: list[Event], n: int, options: dict[str, bool], evict: np.ndarray) -> float:
    """Thread CPU ns per event to convert one fresh batch."""
    events = E.fresh_copies(mix, n)
    groups = {EVENT_TYPES[tag]: found for tag, found in group_by_type(events).items()}
    evict += 1
    cpu = time.thread_time()
    events_to_tables(groups, **options)
    return (time.thread_time() - cpu) * NS_PER_S / n


def main(argv: list[str] | None = None) -> int:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=None, help="events per batch")
    args = p.parse_args(argv)
    n = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)
    repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)
    info = C.machine_info(threads=1)
    C.print_machine(info)
    mix = E.record_mix(quick=args.quick)
    evict = np.zeros(EVICT_BYTES, dtype=np.uint8)
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rep in range(repeats):
        for variant in C.alternate(list(VARIANTS), rep):
            samples[variant].append(convert_once(mix, n, VARIANTS[variant], evict))
    results: dict[str, Any] = {
        v: {"ns_per_event": C.median(ns), "samples_ns_per_event": ns} for v, ns in samples.items()
    }
    C.print_table(
        f"events -> tables, {n:,} fresh events x {repeats} repeats (median)",
        ["variant", "ns/event"],
        [[v, r["ns_per_event"]] for v, r in results.items()],
    )
    C.write_results(
        args.out,
        "convert",
        {
            "benchmark": "convert",
            "machine": info,
            "quick": args.quick,
            "events": n,
            "repeats": repeats,
            "variants": results,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
