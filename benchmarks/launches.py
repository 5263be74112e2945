"""Kernel launches and host syncs per env-step: the GPU proxy that runs on any CPU.

With hosts this small a GPU is bound by kernel launches and host syncs, not arithmetic,
so their count per env-step predicts GPU speed without a GPU. Each variant (``trainer``:
per-env host passes; ``batched``: ``run.batch_envs``; ``floor``: the plainest per-env
loop of :mod:`_trainer`) runs one round under :class:`esper.training.launch_count.
LaunchCounter`, telemetry off, and the counts are split by phase (train, validation
with the counterfactuals, policy with features and masks, action with rewards and the
rollout buffer, the PPO update, other: env creation, snapshots, round bookkeeping).

What counts as a launch: every aten op that reaches the dispatcher except views and
aliases and allocation/metadata ops (``empty``, ``set_``, size queries); a host sync is
an ``aten._local_scalar_dense`` (``.item()``, ``float(t)``, library checks), a
``.tolist()``/``.numpy()`` outside :func:`~esper.training.launch_count.host_copy`, or
on CUDA a device-to-host copy; reads through ``host_copy`` (the one sanctioned
transfer per phase) are counted apart as transfers. Counts are deterministic: one run
per configuration is enough, and the numbers do not depend on the machine's load.

    python benchmarks/launches.py                                  # the issue's matrix
    python benchmarks/launches.py --tasks synthetic_ref --n-envs 16 --sites
    python benchmarks/launches.py --device cuda --n-envs 16         # on a GPU
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _trainer as T

from esper.config import with_overrides
from esper.training.launch_count import PHASE_NAMES, LaunchCounter

DEFAULT_TASKS = ["synthetic_ref", "digits"]
DEFAULT_N_ENVS = [4, 16, 64]
VARIANTS = ("trainer", "batched", "floor")
EPISODE_LENGTH = 20
#: Call sites kept per run in the JSON (with --sites).
TOP_SITES = 40


def parse_args(argv: list[str] | None) -> Any:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--tasks", type=C.csv_list(str), default=DEFAULT_TASKS, help="presets")
    p.add_argument("--n-envs", type=C.csv_list(int), default=DEFAULT_N_ENVS)
    p.add_argument("--variants", type=C.csv_list(str), default=list(VARIANTS))
    p.add_argument("--episode-length", type=int, default=EPISODE_LENGTH)
    p.add_argument("--device", default="cpu")
    p.add_argument("--policy", default="ppo", help="policy of the trainer variants")
    p.add_argument("--sites", action="store_true", help="also count launches by call site")
    args = p.parse_args(argv)
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        p.error(f"unknown variant(s) {bad}; choose from {list(VARIANTS)}")
    unknown = [t for t in args.tasks if t not in T.PRESETS]
    if unknown:
        p.error(f"unknown task preset(s) {unknown}; choose from {sorted(T.PRESETS)}")
    if args.quick:
        args.tasks, args.n_envs, args.episode_length = ["digits"], [2], 2
    return args


def count_one(variant: str, task: str, n_envs: int, args: Any) -> dict[str, Any]:
    """One round of ``variant`` under the counter: per env-step counts by phase."""
    cfg = T.bench_config(
        task, n_envs=n_envs, level="off", threads=1, device=args.device, quick=args.quick
    )
    cfg = with_overrides(
        cfg,
        {
            "run.episode_length": args.episode_length,
            "run.rounds": 1,
            "run.batch_envs": variant == "batched",
            "policy.kind": args.policy,
        },
    )
    data = T.load_data(cfg)
    t0 = time.perf_counter()
    with LaunchCounter(device=args.device.split(":")[0], sites=args.sites) as counter:
        if variant == "floor":
            T.run_floor(cfg, data)
        else:
            T.run_trainer(cfg, data)
    tally = counter.tally
    steps = n_envs * args.episode_length
    out: dict[str, Any] = {
        "task": task,
        "n_envs": n_envs,
        "variant": variant,
        "env_steps": steps,
        "launches": tally.total() / steps,
        "syncs": tally.total("syncs") / steps,
        "transfers": tally.total("transfers") / steps,
        "collection": (tally.total() - tally.launches["ppo"]) / steps,
        "by_phase": {p: tally.launches[p] / steps for p in PHASE_NAMES},
        "syncs_by_phase": {p: tally.syncs[p] / steps for p in PHASE_NAMES},
        "transfers_by_phase": {p: tally.transfers[p] / steps for p in PHASE_NAMES},
        "sync_sites": dict(tally.sync_sites.most_common()),
        "config": T.describe(cfg),
        "seconds": time.perf_counter() - t0,
    }
    if args.sites:
        out["sites"] = {k: v / steps for k, v in tally.sites.most_common(TOP_SITES)}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = C.machine_info(threads=1)
    C.print_machine(info)
    results = []
    for task in args.tasks:
        for n in args.n_envs:
            for variant in args.variants:
                r = count_one(variant, task, n, args)
                print(
                    f"  {task} n_envs={n} {variant}: {r['launches']:.1f} launches, "
                    f"{r['syncs']:.2f} syncs per env-step ({r['seconds']:.0f} s)",
                    flush=True,
                )
                results.append(r)
    phases = [p for p in PHASE_NAMES]
    C.print_table(
        f"Kernel-launching ops per env-step ({args.device}, {args.episode_length}-step "
        f"episodes, 1 round, telemetry off, policy {args.policy})",
        ["task", "n_envs", "variant", "all", "collection", *phases, "syncs", "transfers"],
        [
            [r["task"], r["n_envs"], r["variant"], r["launches"], r["collection"]]
            + [r["by_phase"][p] for p in phases]
            + [r["syncs"], r["transfers"]]
            for r in results
        ],
    )
    if args.sites:
        for r in results:
            C.print_table(
                f"Top call sites, {r['task']} n_envs={r['n_envs']} {r['variant']}",
                ["phase: site", "launches / env-step"],
                [[k, v] for k, v in r["sites"].items()],
            )
    payload = {
        "benchmark": "launches",
        "machine": info,
        "device": args.device,
        "episode_length": args.episode_length,
        "policy": args.policy,
        "results": results,
    }
    C.write_results(args.out, "launches", payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
