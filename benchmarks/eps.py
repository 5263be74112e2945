"""EPS of the real trainer against the floor (the plainest loop over the same host work).

For each task and n_envs: a warm-up, then ``--repeats`` rounds of measurements in which
the variants alternate (which goes first rotates), and the median of each is reported
with its ratio to the floor. Variants: ``trainer`` (per-env host passes), ``batched``
(the trainer with ``run.batch_envs``: same-structure envs as one vmapped graph) and
``floor``; ``--variants`` picks some. The trainer runs at telemetry
level ``normal`` by default (``--level``), writing a real run directory. The workloads
are the presets of :mod:`_trainer` (see ``benchmarks/README.md`` for the sizes).

    python benchmarks/eps.py                      # digits + synthetic, n_envs 1,4,8
    python benchmarks/eps.py --tasks digits --n-envs 4 --repeats 5
    python benchmarks/eps.py --profile            # + cProfile of one trainer run
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _trainer as T

from esper.config import with_overrides

DEFAULT_TASKS = ["digits", "synthetic"]
DEFAULT_N_ENVS = [1, 4, 8]
DEFAULT_REPEATS = 3
#: Rows of the cProfile summary kept in the JSON results.
PROFILE_ROWS = 30
#: Floor ratios below this get a "where the time goes" explanation (issue 8).
FLOOR_RATIO_TARGET = 0.8
VARIANTS = ("trainer", "batched", "floor")
COLUMNS = (
    "task",
    "n_envs",
    "epochs",
    "rounds",
    "trainer EPS",
    "batched EPS",
    "floor EPS",
    "ratio",
    "batched ratio",
    "paired",
    "CPU",
)


def parse_args(argv: list[str] | None) -> Any:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--tasks", type=C.csv_list(str), default=DEFAULT_TASKS, help="presets")
    p.add_argument("--n-envs", type=C.csv_list(int), default=DEFAULT_N_ENVS)
    p.add_argument("--level", default="normal", help="telemetry level of the trainer")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (both)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--profile", action="store_true", help="cProfile one trainer run per task")
    p.add_argument(
        "--episode-length", type=int, default=None, help="epochs per episode (default: the preset)"
    )
    p.add_argument(
        "--variants",
        type=C.csv_list(str),
        default=list(VARIANTS),
        help=f"which of {','.join(VARIANTS)} to run (the floor always runs)",
    )
    args = p.parse_args(argv)
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        p.error(f"unknown variant(s) {bad}; choose from {list(VARIANTS)}")
    args.variants = [v for v in VARIANTS if v in args.variants or v == "floor"]
    unknown = [t for t in args.tasks if t not in T.PRESETS]
    if unknown:
        p.error(f"unknown task preset(s) {unknown}; choose from {sorted(T.PRESETS)}")
    if args.quick:
        args.tasks, args.n_envs = ["digits"], [1, 2]
    args.repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)
    return args


def _episode(args: Any) -> dict[str, Any]:
    """The ``--episode-length`` override, if given (per-round setup is amortised over it)."""
    return {} if args.episode_length is None else {"run.episode_length": args.episode_length}


def _measure(variant: str, cfg: Any, data: Any) -> T.Measurement:
    if variant == "floor":
        return T.run_floor(cfg, data)
    return T.run_trainer(with_overrides(cfg, {"run.batch_envs": variant == "batched"}), data)


def _warm_up(cfg: Any, data: Any, variants: list[str]) -> None:
    """One short unmeasured run of each (first-call kernel setup, allocator growth)."""
    tiny = with_overrides(cfg, {"run.episode_length": 2, "run.rounds": 1})
    for variant in variants:
        _measure(variant, tiny, data)


def measure_config(task: str, n_envs: int, args: Any) -> dict[str, Any]:
    cfg = T.bench_config(
        task,
        n_envs=n_envs,
        level=args.level,
        threads=args.threads,
        device=args.device,
        quick=args.quick,
        overrides=_episode(args),
    )
    data = T.load_data(cfg)
    if not args.quick:
        _warm_up(cfg, data, args.variants)
    samples: dict[str, list[T.Measurement]] = {v: [] for v in args.variants}
    for rep in range(args.repeats):
        for variant in C.alternate(args.variants, rep):
            m = _measure(variant, cfg, data)
            samples[variant].append(m)
            print(f"  {task} n_envs={n_envs} rep {rep}: {variant} {m.eps:.2f} EPS", flush=True)
    out: dict[str, Any] = {"task": task, "config": T.describe(cfg)}
    for variant in args.variants:
        eps = [m.eps for m in samples[variant]]
        mid = sorted(samples[variant], key=lambda m: m.eps)[len(eps) // 2]
        out[variant] = {
            "eps": C.median(eps),
            "samples": eps,
            "cpu_eps": C.median([m.cpu_eps for m in samples[variant]]),
            "phases_ms": mid.phases_ms,
        }
    floor = out["floor"]
    for variant, key in (("trainer", "ratio"), ("batched", "batched_ratio")):
        if variant in out:
            out[key] = C.ratio(out[variant]["eps"], floor["eps"])
    if "trainer" in out:
        pairs = zip(samples["trainer"], samples["floor"], strict=True)
        out["paired_ratios"] = [C.ratio(t.eps, f.eps) for t, f in pairs]
        out["cpu_ratio"] = C.ratio(out["trainer"]["cpu_eps"], floor["cpu_eps"])
    return out


def _cell(result: dict[str, Any], *keys: str) -> Any:
    """A nested value of a result, or "-" for a variant that was not run."""
    value: Any = result
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return "-"
        value = value[key]
    return value


def profile_trainer(task: str, args: Any) -> list[dict[str, Any]]:
    """cProfile of one trainer run (n_envs 4): the functions with the most cumulative time."""
    cfg = T.bench_config(
        task,
        n_envs=4,
        level=args.level,
        threads=args.threads,
        device=args.device,
        quick=args.quick,
    )
    data = T.load_data(cfg)
    prof = cProfile.Profile()
    prof.enable()
    T.run_trainer(cfg, data)
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO()).sort_stats("cumulative")
    rows = []
    for (file, line, fn), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{Path(file).name}:{line}({fn})",
                "calls": ncalls,
                "tottime_s": tottime,
                "cumtime_s": cumtime,
            }
        )
    rows.sort(key=lambda r: r["cumtime_s"], reverse=True)
    return rows[:PROFILE_ROWS]


def _phase_text(phases: dict[str, float]) -> str:
    total = sum(phases.values())
    if not total:
        return "-"
    return " ".join(f"{k} {100 * v / total:.0f}%" for k, v in phases.items())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = C.machine_info(threads=args.threads)
    C.print_machine(info)
    results = [measure_config(t, n, args) for t in args.tasks for n in args.n_envs]
    rows = [
        [
            r["task"],
            r["config"]["n_envs"],
            r["config"]["episode_length"],
            r["config"]["rounds"],
            _cell(r, "trainer", "eps"),
            _cell(r, "batched", "eps"),
            r["floor"]["eps"],
            _cell(r, "ratio"),
            _cell(r, "batched_ratio"),
            C.median(r["paired_ratios"]) if "paired_ratios" in r else "-",
            _cell(r, "cpu_ratio"),
        ]
        for r in results
    ]
    print(
        "ratio = median trainer EPS / median floor EPS (batched ratio: the same for "
        "run.batch_envs); paired = median of the per-repeat "
        "ratios (adjacent runs); CPU = the same from process CPU time (steadier under load)"
    )
    C.print_table(
        f"EPS: trainer (telemetry {args.level}) vs floor, median of {args.repeats}",
        COLUMNS,
        rows,
    )
    C.print_table(
        "Where the time goes (median run; trainer phases from its round_finished events)",
        ["task", "n_envs", *args.variants],
        [
            [r["task"], r["config"]["n_envs"]]
            + [_phase_text(r[v]["phases_ms"]) for v in args.variants]
            for r in results
        ],
    )
    payload: dict[str, Any] = {
        "benchmark": "eps",
        "machine": info,
        "repeats": args.repeats,
        "level": args.level,
        "quick": args.quick,
        "results": results,
        "below_target": [
            f"{r['task']}/n_envs={r['config']['n_envs']}"
            for r in results
            if r.get("ratio", FLOOR_RATIO_TARGET) < FLOOR_RATIO_TARGET
        ],
    }
    if args.profile:
        payload["profile"] = {t: profile_trainer(t, args) for t in args.tasks}
        for task, prof_rows in payload["profile"].items():
            C.print_table(
                f"cProfile of one trainer run ({task}, n_envs 4), by cumulative time",
                ["function", "calls", "tottime s", "cumtime s"],
                [list(r.values()) for r in prof_rows],
            )
    C.write_results(args.out, "eps", payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
