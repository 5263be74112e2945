"""How far the batched host path can batch: structure groups per epoch in real runs.

``run.batch_envs`` stacks envs whose networks share one structure
(``host_batching.structure_key``). As seeds are germinated, pruned and blended, envs
drift apart and the groups split. This script runs training with ``run.batch_envs``
on and records the groups of every train epoch (by wrapping ``group_envs``, the
measurement's only instrumentation). It reports how many groups an epoch has, the
largest group, and the share of envs that train batched (in a group of two or more).
It runs on CPU, and the figures do not depend on the device.

    python benchmarks/batch_groups.py                       # 16 envs, PPO + heuristic
    python benchmarks/batch_groups.py --n-envs 64 --configs configs/learning_guided.toml
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

import esper.training.host_batching as host_batching
from esper.config import Config, load_config, with_overrides
from esper.core.enums import TelemetryLevel
from esper.data.tasks import load_task
from esper.telemetry.hub import MemoryHub
from esper.training.env_state import EnvState
from esper.training.run import train

DEFAULT_N_ENVS = 16
DEFAULT_ROUNDS = 3
DEFAULT_POLICIES = ["ppo", "heuristic"]
#: "default" is the built-in config (the README demo's task and settings).
DEFAULT_CONFIGS = ["default", "configs/learning_guided.toml"]
QUICK = {"run.rounds": 1, "run.episode_length": 3, "task.train_samples_per_env": 64}
COLUMNS = (
    "config",
    "policy",
    "n_envs",
    "epochs",
    "groups / epoch",
    "max groups",
    "largest group",
    "envs batched",
    "wall s",
)


def parse_args(argv: list[str] | None) -> Any:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--n-envs", type=int, default=DEFAULT_N_ENVS)
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    p.add_argument("--policies", type=C.csv_list(str), default=DEFAULT_POLICIES)
    p.add_argument("--configs", type=C.csv_list(str), default=DEFAULT_CONFIGS)
    args = p.parse_args(argv)
    if args.quick:
        args.n_envs, args.configs = 2, ["default"]
    return args


class GroupRecorder:
    """Wraps ``host_batching.group_envs`` for one run; records each epoch's group sizes."""

    def __init__(self) -> None:
        self.sizes: list[list[int]] = []
        self._original = host_batching.group_envs

    def __enter__(self) -> GroupRecorder:
        def recorded(envs: Sequence[EnvState]) -> list[list[EnvState]]:
            groups: list[list[EnvState]] = self._original(envs)
            self.sizes.append([len(g) for g in groups])
            return groups

        host_batching.group_envs = recorded
        return self

    def __exit__(self, *_exc: object) -> None:
        host_batching.group_envs = self._original


def measure(config: str, policy: str, args: Any, tmp: Path) -> dict[str, Any]:
    base = Config() if config == "default" else load_config(config)
    values: dict[str, Any] = {
        "run.n_envs": args.n_envs,
        "run.rounds": args.rounds,
        "run.batch_envs": True,
        "policy.kind": policy,
        "telemetry.dir": str(tmp),
        "run.run_id": f"groups-{policy}-{len(list(tmp.iterdir()))}",
    }
    if args.quick:
        values.update(QUICK)
    cfg = with_overrides(base, values)
    data = load_task(cfg.task, seed=cfg.run.seed)
    t0 = time.perf_counter()
    with GroupRecorder() as rec:
        train(cfg, data=data, telemetry=MemoryHub(run_id="groups", level=TelemetryLevel.OFF))
    wall = time.perf_counter() - t0
    sizes = rec.sizes
    n = cfg.run.n_envs
    return {
        "config": config,
        "policy": policy,
        "n_envs": n,
        "epochs": len(sizes),
        "groups_per_epoch": statistics.mean(len(s) for s in sizes),
        "max_groups": max(len(s) for s in sizes),
        "largest_group": statistics.mean(max(s) for s in sizes),
        "batched_share": statistics.mean(sum(g for g in s if g > 1) / n for s in sizes),
        "wall_s": wall,
        "sizes": sizes,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = C.machine_info(threads=1)
    C.print_machine(info)
    tmp = C.CACHE_DIR / "batch_groups"
    tmp.mkdir(parents=True, exist_ok=True)
    results = [measure(c, p, args, tmp) for c in args.configs for p in args.policies]
    C.print_table(
        "Structure groups per train epoch with run.batch_envs (envs batched = share of envs "
        "in a group of two or more)",
        COLUMNS,
        [
            [
                r["config"],
                r["policy"],
                r["n_envs"],
                r["epochs"],
                r["groups_per_epoch"],
                r["max_groups"],
                r["largest_group"],
                r["batched_share"],
                r["wall_s"],
            ]
            for r in results
        ],
    )
    payload = {"benchmark": "batch_groups", "machine": info, "quick": args.quick}
    payload["results"] = results
    C.write_results(args.out, "batch_groups", payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
