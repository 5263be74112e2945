"""Analysis throughput: every analysis on a synthetic 10-million-event run, against one
plain polars scan of the same columns; peak RSS of each.

The run is written once by ``esper_analysis.synth.synthesize_run`` (the telemetry demo's
simulator through the real writer: a few minutes for 10M events) into
``benchmarks/.cache/`` (git-ignored) and reused by later invocations. Each measurement
runs in a fresh subprocess (this script with ``--worker``), so its peak RSS
(``ru_maxrss``) is its own and nothing is cached in memory between measurements (the
OS page cache stays warm: the run is read from memory, not disk, after the first pass).

- ``analyses``: ``load_run`` + ``event_counts`` + baseline capture and
  ``check_baseline`` (the run against its own baseline) + ``reward_breakdown`` +
  ``rollback_audit`` + ``seed_lifecycles``, each timed.
- ``scan``: for every event type, ``pl.scan_parquet(parts).select(columns).collect()``
  of the columns those analyses read, all types collected in parallel
  (``pl.collect_all``), i.e. the cost of merely reading the data once.

    python benchmarks/analysis.py                 # 10,000,000 events
    python benchmarks/analysis.py --events 1000000 --repeats 5
"""

from __future__ import annotations

import hashlib
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

DEFAULT_EVENTS = 10_000_000
QUICK_EVENTS = 100_000
DEFAULT_REPEATS = 3
SEED = 0
KIB = 1024
#: A worker that takes longer than this has hung (10M events take well under a minute).
WORKER_TIMEOUT_S = 1_800
WORKERS = ("analyses", "scan")
#: Columns every count reads (grouped by round/env and by step; rank/seq for dedup).
ENVELOPE_COLUMNS = ("rank", "seq", "round", "env", "step")
#: Payload columns the analyses read, per event type (intersected with the schema).
PAYLOAD_COLUMNS: dict[str, tuple[str, ...]] = {
    "reward_computed": ("op", "total"),  # + every reward component (added below)
    "episode_finished": ("run_id", "episode_reward", "rollbacks", "rollback_penalty"),
    "governor_rollback": (
        "reason",
        "loss",
        "threshold",
        "restored_to_step",
        "penalized_step",
        "seeds_pruned",
        "transitions_affected",
        "penalty",
    ),
    "seed_germinated": ("run_id", "slot", "seed_id", "blueprint", "params"),
    "seed_stage_changed": (
        "run_id",
        "slot",
        "seed_id",
        "from_stage",
        "to_stage",
        "epochs_in_prev_stage",
    ),
    "seed_fossilized": ("run_id", "slot", "seed_id", "contribution"),
    "seed_pruned": (
        "run_id",
        "slot",
        "seed_id",
        "reason",
        "initiator",
        "stage_at_prune",
        "contribution",
    ),
    "run_finished": ("status", "env_steps"),
}


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB.

    ``VmHWM`` of /proc/self/status is the high-water mark of the current address space,
    so it starts afresh at exec. ``ru_maxrss`` does not: Linux carries the parent's
    high-water mark across fork and exec, so a worker started by a big parent would
    report the parent's peak. It is only the fallback where /proc is missing.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / KIB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB


def scan_columns(event_type: str) -> list[str]:
    from esper_analysis.baseline import FINGERPRINT_FIELDS
    from esper_analysis.schema import polars_schema

    from esper.telemetry.events import REWARD_COMPONENTS

    wanted = [*ENVELOPE_COLUMNS, *PAYLOAD_COLUMNS.get(event_type, ())]
    if event_type == "reward_computed":
        wanted += list(REWARD_COMPONENTS)
    if event_type == "run_started":
        wanted += list(FINGERPRINT_FIELDS)
    names = polars_schema(event_type).names()
    return [c for c in dict.fromkeys(wanted) if c in names]


def worker_scan(run_dir: Path) -> dict[str, Any]:
    import polars as pl

    from esper.telemetry.paths import TYPE_DIR_PREFIX

    events = (run_dir / "events").iterdir()
    columns = {d.name: scan_columns(d.name.removeprefix(TYPE_DIR_PREFIX)) for d in events}
    t0 = time.perf_counter()
    plans, types = [], []
    for type_dir in sorted((run_dir / "events").iterdir()):
        parts = sorted(str(p) for p in type_dir.rglob("*.parquet"))
        if parts:
            types.append(type_dir.name)
            plans.append(pl.scan_parquet(parts).select(columns[type_dir.name]))
    frames = pl.collect_all(plans)
    seconds = time.perf_counter() - t0
    rows = sum(f.height for f in frames)
    values = sum(f.height * f.width for f in frames)
    return {"seconds": seconds, "rows": rows, "values": values, "types": len(types)}


def worker_analyses(run_dir: Path) -> dict[str, Any]:
    import esper_analysis as ea

    steps: dict[str, float] = {}

    def timed(name: str, fn: Any, *args: Any) -> Any:
        t = time.perf_counter()
        out = fn(*args)
        steps[name] = time.perf_counter() - t
        return out

    t0 = time.perf_counter()
    run = timed("load_run", ea.load_run, run_dir)
    counts = timed("event_counts", ea.event_counts, run)
    baseline = timed("capture_baseline", ea.capture_baseline, run, counts)
    check = timed("check_baseline", ea.check_baseline, run, baseline, counts)
    rewards = timed("reward_breakdown", ea.reward_breakdown, run)
    audit = timed("rollback_audit", ea.rollback_audit, run)
    lifecycles = timed("seed_lifecycles", ea.seed_lifecycles, run)
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "steps": steps,
        "events": counts.total,
        "baseline_ok": check.ok,
        "reward_rows": rewards.rows,
        "reward_flagged_rows": rewards.flagged_rows,
        "rollbacks": audit.count,
        "seeds": lifecycles.germinated,
    }


def run_worker(kind: str, run_dir: Path) -> dict[str, Any]:
    """One measurement in a fresh interpreter; returns its JSON line."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        kind,
        "--run-dir",
        str(run_dir),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"worker {kind} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def file_layout() -> str:
    """A short digest of the options merged files are written with."""
    import pyarrow as pa

    from esper.telemetry import sink

    options = sink.merged_options(pa.schema([]))
    facts = (sorted(options.items()), sink.DICTIONARY_INTEGERS, sink.ROW_GROUP_ROWS)
    return hashlib.sha256(repr(facts).encode()).hexdigest()[:8]


def ensure_run(events: int, cache: Path) -> tuple[Path, float | None]:
    """The cached synthetic run (written now if absent); seconds spent writing it."""
    from esper_analysis.synth import synthesize_run

    from esper.telemetry.events import SCHEMA_VERSION

    # A new schema or new file options (the writer's), a new run.
    run_dir = cache / f"synth-{events}-s{SEED}-v{SCHEMA_VERSION}-{file_layout()}"
    if (run_dir / "manifest.json").exists():  # the manifest is written last
        return run_dir, None
    shutil.rmtree(run_dir, ignore_errors=True)  # an interrupted earlier write
    cache.mkdir(parents=True, exist_ok=True)
    print(f"writing a synthetic run of {events:,} events to {run_dir} ...", flush=True)
    t0 = time.perf_counter()
    synthesize_run(run_dir, events, seed=SEED)
    return run_dir, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=None, help="events in the synthetic run")
    p.add_argument("--cache", type=Path, default=C.CACHE_DIR, help="where the run is kept")
    p.add_argument("--worker", choices=WORKERS, help=argparse_hidden())
    p.add_argument("--run-dir", type=Path, help=argparse_hidden())
    args = p.parse_args(argv)
    if args.worker:
        fn = worker_scan if args.worker == "scan" else worker_analyses
        result = fn(args.run_dir)
        result["peak_rss_mb"] = peak_rss_mb()
        print(json.dumps(result))
        return 0
    n = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)
    repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)
    info = C.machine_info()
    C.print_machine(info)
    run_dir, synth_s = ensure_run(n, args.cache)
    samples: dict[str, list[dict[str, Any]]] = {w: [] for w in WORKERS}
    for rep in range(repeats):
        for kind in C.alternate(WORKERS, rep):
            r = run_worker(kind, run_dir)
            samples[kind].append(r)
            print(
                f"  rep {rep}: {kind:8s} {r['seconds']:.2f} s, peak RSS {r['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    summary = {
        kind: {
            "seconds": C.median([r["seconds"] for r in rs]),
            "samples_s": [r["seconds"] for r in rs],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
        }
        for kind, rs in samples.items()
    }
    mid = sorted(samples["analyses"], key=lambda r: r["seconds"])[repeats // 2]
    ratio = C.ratio(summary["analyses"]["seconds"], summary["scan"]["seconds"])
    events = mid["events"]
    C.print_table(
        f"Analyses vs one plain scan, {events:,} events, median of {repeats}",
        ["measurement", "seconds", "events/s", "peak RSS MB"],
        [[k, v["seconds"], events / v["seconds"], v["peak_rss_mb"]] for k, v in summary.items()],
    )
    C.print_table(
        "Analyses step by step (median run)",
        ["step", "seconds"],
        [[k, v] for k, v in mid["steps"].items()],
    )
    print(f"analyses / scan = {ratio:.2f}x the time of one plain scan", flush=True)
    C.write_results(
        args.out,
        "analysis",
        {
            "benchmark": "analysis",
            "machine": info,
            "quick": args.quick,
            "events": events,
            "run_dir": str(run_dir),
            "synthesis_s": synth_s,
            "repeats": repeats,
            "measurements": summary,
            "ratio_to_scan": ratio,
            "median_analyses_run": mid,
            "scan_rows": samples["scan"][0]["rows"],
            "scan_values": samples["scan"][0]["values"],
        },
    )
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    raise SystemExit(main())
