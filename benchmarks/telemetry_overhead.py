"""Telemetry overhead: trainer EPS at levels off, lifecycle, normal and debug, in one run.

The same trainer workload (a preset of :mod:`_trainer`, digits with 4 envs by default)
runs once per level per repeat; the order of the levels rotates from repeat to repeat,
and the median of each level is compared with the median at ``off`` (no hub at all:
``open_run`` returns a ``NullHub``). Targets, by process CPU (steady on a loaded
machine): normal / off >= 0.98 and debug / off >= 0.96; the writer thread's own CPU at
normal <= 0.5 % of the process's.

    python benchmarks/telemetry_overhead.py
    python benchmarks/telemetry_overhead.py --task synthetic --n-envs 4 --repeats 7

Runs write their telemetry under the system temp directory (``$TMPDIR``, recorded in
the JSON): what a file's creation and an fsync cost depends on that file system.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _trainer as T

from esper.config import with_overrides

LEVELS = ("off", "lifecycle", "normal", "debug")
DEFAULT_REPEATS = 5
#: Targets: process-CPU ratio to off per level, and the writer's share at normal.
CPU_TARGETS = {"normal": 0.98, "debug": 0.96}
WRITER_SHARE_TARGET = 0.005


def parse_args(argv: list[str] | None) -> Any:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--task", default="digits", choices=sorted(T.PRESETS))
    p.add_argument("--n-envs", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:k (the trainer's device)")
    p.add_argument("--levels", type=C.csv_list(str), default=list(LEVELS))
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="PPO rounds per run (default: the preset's); more rounds spread the writer's "
        "start and close over a longer run, towards its steady-state share",
    )
    args = p.parse_args(argv)
    if "off" not in args.levels:
        p.error("--levels must include off (the reference)")
    if args.rounds is not None and args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    args.repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)
    return args


def measure(args: Any, configs: dict[str, Any]) -> dict[str, list[T.Measurement]]:
    """Runs of every level, alternating the order per repeat (median-friendly)."""
    data = T.load_data(configs["off"])
    if not args.quick:  # one unmeasured short run: first-call kernel setup
        T.run_trainer(with_overrides(configs["off"], {"run.episode_length": 2}), data)
    samples: dict[str, list[T.Measurement]] = {level: [] for level in args.levels}
    for rep in range(args.repeats):
        for level in C.alternate(args.levels, rep):
            m = T.run_trainer(configs[level], data)
            samples[level].append(m)
            print(f"  rep {rep}: {level:9s} {m.eps:.2f} EPS, {m.events} events", flush=True)
    return samples


def summarise(samples: dict[str, list[T.Measurement]]) -> dict[str, Any]:
    """Per level: median EPS, ratios to ``off`` (medians and paired), events and bytes."""
    off = C.median([m.eps for m in samples["off"]])
    off_cpu = C.median([m.cpu_eps for m in samples["off"]])
    per_level: dict[str, Any] = {}
    for level, ms in samples.items():
        eps = C.median([m.eps for m in ms])
        cpu_eps = C.median([m.cpu_eps for m in ms])
        steps = ms[0].env_steps
        paired = [C.ratio(m.eps, o.eps) for m, o in zip(ms, samples["off"], strict=True)]
        per_level[level] = {
            "eps": eps,
            "samples": [m.eps for m in ms],
            "ratio_to_off": C.ratio(eps, off),
            "paired_ratios": paired,
            "paired_ratio": C.median(paired),
            "cpu_eps": cpu_eps,
            "cpu_ratio_to_off": C.ratio(cpu_eps, off_cpu),
            "writer_cpu_share": C.median([m.writer_cpu_s / m.cpu_s for m in ms]),
            "writer_cpu_us_per_event": C.median(
                [1e6 * m.writer_cpu_s / m.events if m.events else 0.0 for m in ms]
            ),
            "writer_flushes": ms[0].writer_flushes,
            "writer_cpu_ms_per_flush": C.median(
                [1e3 * m.writer_cpu_s / m.writer_flushes if m.writer_flushes else 0.0 for m in ms]
            ),
            "events": ms[0].events,
            "events_per_env_step": ms[0].events / steps if steps else None,
            "bytes_on_disk": ms[0].bytes_on_disk,
            "bytes_per_env_step": ms[0].bytes_on_disk / steps if steps else None,
        }
    return per_level


def report(args: Any, per_level: dict[str, Any]) -> None:
    C.print_table(
        f"Telemetry overhead ({args.task}, n_envs {args.n_envs}), median of {args.repeats}",
        [
            "level",
            "EPS",
            "ratio to off",
            "paired",
            "CPU ratio",
            "writer CPU",
            "us/event",
            "ms/flush",
            "min..max EPS",
            "events/env-step",
            "bytes/env-step",
        ],
        [
            [
                level,
                r["eps"],
                r["ratio_to_off"],
                r["paired_ratio"],
                r["cpu_ratio_to_off"],
                f"{100 * r['writer_cpu_share']:.2f} %",
                r["writer_cpu_us_per_event"],
                r["writer_cpu_ms_per_flush"],
                f"{min(r['samples']):.2f}..{max(r['samples']):.2f}",
                r["events_per_env_step"] or 0.0,
                r["bytes_per_env_step"] or 0.0,
            ]
            for level, r in per_level.items()
        ],
    )
    print(
        "ratio = median EPS / median EPS at off; paired = median of the per-repeat ratios; "
        "CPU ratio = the same from process CPU time (every thread, steadier under load); "
        "writer CPU = the writer's own CPU time (per thread) as a share of the process's, "
        "and per event written; ms/flush = the writer's CPU (start and close included) per "
        "batch it wrote (one part per event type)"
    )
    for level, target in CPU_TARGETS.items():
        ratio = per_level.get(level, {}).get("cpu_ratio_to_off")
        if ratio is not None:
            verdict = "meets" if ratio >= target else "MISSES"
            print(f"{level}/off CPU = {ratio:.3f}: {verdict} the >= {target} target", flush=True)
    share = per_level.get("normal", {}).get("writer_cpu_share")
    if share is not None:
        verdict = "meets" if share <= WRITER_SHARE_TARGET else "MISSES"
        print(
            f"writer at normal = {100 * share:.2f} % of the process: {verdict} the <= 0.5 % target"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = C.machine_info(threads=args.threads)
    C.print_machine(info)
    configs = {
        level: T.bench_config(
            args.task,
            n_envs=args.n_envs,
            level=level,
            threads=args.threads,
            device=args.device,
            quick=args.quick,
            overrides=None if args.rounds is None else {"run.rounds": args.rounds},
        )
        for level in args.levels
    }
    per_level = summarise(measure(args, configs))
    report(args, per_level)
    C.write_results(
        args.out,
        "telemetry_overhead",
        {
            "benchmark": "telemetry_overhead",
            "machine": info,
            "config": T.describe(configs["off"]),
            "repeats": args.repeats,
            "quick": args.quick,
            "telemetry_dir": tempfile.gettempdir(),
            "targets": {"cpu_ratio_to_off": CPU_TARGETS, "writer_cpu_share": WRITER_SHARE_TARGET},
            "levels": per_level,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
