"""Cost of ``esper watch`` to the trainer: EPS with and without a watcher attached.

The same trainer workload (a preset of :mod:`_trainer`, telemetry level normal) runs
alone and with a watcher process following its run directory, alternating the order
from repeat to repeat. The watcher is a separate process (as a user would run it in
another terminal) calling :func:`esper_analysis.watch.watch` with the default 1 s
refresh, started (imports done) before the trainer; its CPU time after start-up is
its own ``process_time`` (``wait4`` gives the total with start-up).
The trainer's figure is its own EPS (wall) and CPU EPS; on a machine shared with other
work only the paired ratios mean much.

    python benchmarks/watch_overhead.py
    python benchmarks/watch_overhead.py --repeats 7 --interval 0.5
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _trainer as T

from esper.config import with_overrides

DEFAULT_REPEATS = 5
VARIANTS = ("alone", "watched")
#: The watcher: wait for the run directory, follow it until it stops running, print
#: how many reads it made. The trainer deletes its directory right after finishing,
#: so a read that finds it gone ends the watch too.
WATCHER = """
import io, sys, time
from pathlib import Path
from rich.console import Console
from esper_analysis.watch import watch
scratch, interval = Path(sys.argv[1]), float(sys.argv[2])
print("ready", flush=True)  # imports done: start-up is not charged to the trainer
cpu0 = time.process_time()
while not (found := list(scratch.glob("*/bench/manifest.json"))):
    if (scratch / "trainer-done").exists():  # a run shorter than this start-up
        print(0, 0.0)
        sys.exit(0)
    time.sleep(0.05)
reads = []
def pause(s):
    reads.append(s)
    time.sleep(s)
try:
    watch(found[0].parent, Console(file=io.StringIO(), width=100), refresh_s=interval, sleep=pause)
except Exception as exc:
    print(f"stopped: {type(exc).__name__}", file=sys.stderr)
print(len(reads) + 1, time.process_time() - cpu0)  # CPU after start-up
"""


def parse_args(argv: list[str] | None) -> Any:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--task", default="digits", choices=sorted(T.PRESETS))
    p.add_argument("--n-envs", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--interval", type=float, default=1.0, help="watch refresh (s)")
    args = p.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)
    return args


def _watched_run(cfg: Any, data: Any, interval: float) -> tuple[T.Measurement, dict[str, Any]]:
    scratch = Path(tempfile.mkdtemp(prefix="esper-watch-bench-"))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", WATCHER, str(scratch), str(interval)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        try:
            m = T.run_trainer(cfg, data, scratch=scratch)
        finally:
            (scratch / "trainer-done").touch()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        reads_text, cpu_text = proc.stdout.read().split()
        reads, cpu = int(reads_text), float(cpu_text)
        per_read = 1e3 * cpu / reads if reads else float("nan")
        return m, {
            "watcher_cpu_s": cpu,
            "watcher_cpu_with_startup_s": usage.ru_utime + usage.ru_stime,
            "reads": reads,
            "cpu_per_read_ms": per_read,
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def measure(args: Any, cfg: Any) -> tuple[dict[str, list[T.Measurement]], list[dict[str, Any]]]:
    data = T.load_data(cfg)
    if not args.quick:  # one unmeasured short run: first-call kernel setup
        T.run_trainer(with_overrides(cfg, {"run.episode_length": 2}), data)
    samples: dict[str, list[T.Measurement]] = {v: [] for v in VARIANTS}
    watchers: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        for variant in C.alternate(VARIANTS, rep):
            if variant == "watched":
                m, w = _watched_run(cfg, data, args.interval)
                watchers.append(w)
            else:
                m = T.run_trainer(cfg, data)
            samples[variant].append(m)
            print(f"  rep {rep}: {variant:8s} {m.eps:.2f} EPS", flush=True)
    return samples, watchers


def summarise(samples: dict[str, list[T.Measurement]], watchers: list[dict[str, Any]]) -> Any:
    alone, watched = samples["alone"], samples["watched"]
    paired = [C.ratio(w.eps, a.eps) for w, a in zip(watched, alone, strict=True)]
    return {
        "alone_eps": C.median([m.eps for m in alone]),
        "watched_eps": C.median([m.eps for m in watched]),
        "samples": {v: [m.eps for m in ms] for v, ms in samples.items()},
        "ratio": C.ratio(C.median([m.eps for m in watched]), C.median([m.eps for m in alone])),
        "paired_ratios": paired,
        "paired_ratio": C.median(paired),
        "cpu_ratio": C.ratio(
            C.median([m.cpu_eps for m in watched]), C.median([m.cpu_eps for m in alone])
        ),
        "watcher": watchers,
        "watcher_cpu_per_read_ms": C.median([w["cpu_per_read_ms"] for w in watchers]),
        "watcher_cpu_share": C.median(
            [w["watcher_cpu_s"] / m.wall_s for w, m in zip(watchers, watched, strict=True)]
        ),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = C.machine_info(threads=args.threads)
    C.print_machine(info)
    cfg = T.bench_config(
        args.task, n_envs=args.n_envs, level="normal", threads=args.threads, quick=args.quick
    )
    result = summarise(*measure(args, cfg))
    C.print_table(
        f"esper watch overhead ({args.task}, n_envs {args.n_envs}, refresh {args.interval} s), "
        f"median of {args.repeats}",
        ["EPS alone", "EPS watched", "ratio", "paired", "CPU ratio", "watcher CPU/read ms"],
        [
            [
                result["alone_eps"],
                result["watched_eps"],
                result["ratio"],
                result["paired_ratio"],
                result["cpu_ratio"],
                result["watcher_cpu_per_read_ms"],
            ]
        ],
    )
    print(
        f"watcher CPU: {100 * result['watcher_cpu_share']:.1f}% of one core while watching "
        "(it competes for cores with the trainer on a small machine)",
        flush=True,
    )
    C.write_results(
        args.out,
        "watch_overhead",
        {
            "benchmark": "watch_overhead",
            "machine": info,
            "config": T.describe(cfg),
            "repeats": args.repeats,
            "interval_s": args.interval,
            "quick": args.quick,
            **result,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
