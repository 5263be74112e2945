"""Cost of ``emit()`` on the hot path: ns per call (median, p99) for a real event mix.

Variants, each on fresh unstamped copies of a real normal-level run's events (see
:mod:`_events`):

- ``recorded``: the real ``TelemetryHub`` from ``open_run`` at level normal, its
  background writer running (draining to Parquet while we emit). The queue is sized to
  hold every event of a repeat, so the figure is the emit path itself, not back-pressure
  (blocked emits are reported and should be 0).
- ``filtered``: the same hub type at level lifecycle, fed the mix's normal-level events
  (env_step, action_taken, reward_computed, counterfactual_computed): the cost of an
  event that is filtered out.
- ``null``: ``NullHub`` (level off).

Per-call times come from ``perf_counter_ns`` around each call; the timer's own cost
(median of back-to-back reads) is reported and subtracted in the ``net`` columns. The
``bulk`` column times a plain loop of emits without per-call timers (mean per call).

    python benchmarks/emit.py
    python benchmarks/emit.py --events 500000 --repeats 7
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _events as E

from esper.core.enums import TelemetryLevel
from esper.telemetry.events import Event, event_tag
from esper.telemetry.hub import Hub, NullHub, TelemetryHub, open_run

DEFAULT_EVENTS = 100_000
QUICK_EVENTS = 2_000
DEFAULT_REPEATS = 5
#: Emit stays under about a microsecond (median): it only stamps and appends.
TARGET_MEDIAN_NS = 1_000
#: Back-to-back timer reads used to estimate the timer's own cost.
TIMER_PROBES = 100_000
#: Spare queue slots beyond the events of a repeat (the close adds a writer_stats event).
QUEUE_SLACK = 1_024


def timer_overhead_ns() -> float:
    pc = time.perf_counter_ns
    samples = []
    for _ in range(TIMER_PROBES):
        t0 = pc()
        samples.append(pc() - t0)
    return C.median(samples)


def per_call_ns(emit: Callable[[Event], None], events: list[Event]) -> list[int]:
    pc = time.perf_counter_ns
    out = [0] * len(events)
    for i, event in enumerate(events):
        t0 = pc()
        emit(event)
        out[i] = pc() - t0
    return out


def bulk_mean_ns(emit: Callable[[Event], None], events: list[Event]) -> float:
    t0 = time.perf_counter_ns()
    for event in events:
        emit(event)
    return (time.perf_counter_ns() - t0) / max(len(events), 1)


def _open(root: Path, name: str, level: TelemetryLevel, capacity: int) -> Hub:
    return open_run(root, name, level=level, queue_capacity=capacity)


def run_variant(variant: str, mix: list[Event], n: int, repeats: int, root: Path) -> dict[str, Any]:
    source = E.of_level(mix, TelemetryLevel.NORMAL) if variant == "filtered" else mix
    level = TelemetryLevel.LIFECYCLE if variant == "filtered" else TelemetryLevel.NORMAL
    timed: list[int] = []
    by_type: dict[str, list[int]] = {}
    bulk: list[float] = []
    blocked = 0
    for rep in range(repeats):
        for phase in ("per_call", "bulk"):
            events = E.fresh_copies(source, n)
            name = f"emit-{variant}-{rep}-{phase}"
            if variant == "null":
                hub: Hub = NullHub(name)
            else:
                hub = _open(root, name, level, n + QUEUE_SLACK)
            if phase == "per_call":
                ns = per_call_ns(hub.emit, events)
                timed += ns
                for event, t in zip(events, ns, strict=True):
                    by_type.setdefault(event_tag(type(event)), []).append(t)
            else:
                bulk.append(bulk_mean_ns(hub.emit, events))
            if isinstance(hub, TelemetryHub):
                blocked += hub.manifest_counters.blocked_emits
            hub.close()
            shutil.rmtree(root / name, ignore_errors=True)
    return {
        "events_per_repeat": n,
        "median_ns": C.median(timed),
        "p99_ns": C.percentile(timed, C.PERCENTILE_99),
        "bulk_mean_ns": C.median(bulk),
        "bulk_samples_ns": bulk,
        "blocked_emits": blocked,
        "mix": E.composition(source),
        "median_ns_by_type": {t: C.median(v) for t, v in sorted(by_type.items())},
    }


def main(argv: list[str] | None = None) -> int:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=None, help="events emitted per repeat")
    args = p.parse_args(argv)
    n = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)
    repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)
    info = C.machine_info(threads=1)
    C.print_machine(info)
    mix = E.record_mix(quick=args.quick)
    timer = timer_overhead_ns()
    root = Path(tempfile.mkdtemp(prefix="esper-emit-"))
    try:
        results = {
            v: run_variant(v, mix, n, repeats, root) for v in ("recorded", "filtered", "null")
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    C.print_table(
        f"ns per emit(), {n:,} events x {repeats} repeats (timer cost {timer:.0f} ns)",
        ["variant", "median", "p99", "net median", "net p99", "bulk mean", "blocked"],
        [
            [
                v,
                r["median_ns"],
                r["p99_ns"],
                r["median_ns"] - timer,
                r["p99_ns"] - timer,
                r["bulk_mean_ns"],
                r["blocked_emits"],
            ]
            for v, r in results.items()
        ],
    )
    median = results["recorded"]["median_ns"]
    verdict = "meets" if median < TARGET_MEDIAN_NS else "MISSES"
    print(f"recorded median {median:.0f} ns: {verdict} the < {TARGET_MEDIAN_NS} ns target")
    C.write_results(
        args.out,
        "emit",
        {
            "benchmark": "emit",
            "machine": info,
            "quick": args.quick,
            "repeats": repeats,
            "timer_overhead_ns": timer,
            "target_median_ns": TARGET_MEDIAN_NS,
            "variants": results,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
