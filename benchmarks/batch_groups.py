"""How far the batched host path batches: graph pieces per train epoch in real runs.

``run.batch_envs`` trains the envs of a device as one ``slot_groups.HostBatch``: every
host in one vmapped graph, and at each slot one vmapped call per seed kind. This
script runs training with it and records every epoch's batch by wrapping ``HostBatch``
(the measurement's only instrumentation). It reports:
- the seed kinds per epoch, summed over slots: the extra vmapped calls the seeds cost;
- the share of in-forward seeds that share their kind with another env;
- for comparison, the whole-structure groups the same envs would form
  (``host_batching.group_envs``, the first design: one graph per group), and the share
  of envs such groups would batch.
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
    "seed kinds / epoch",
    "seeds in forward",
    "sharing a kind",
    "structure groups",
    "envs batched by them",
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


class BatchRecorder:
    """Wraps ``host_batching.HostBatch`` for one run and records each epoch's batch."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, Any]] = []
        self._original = host_batching.HostBatch

    def __enter__(self) -> BatchRecorder:
        epochs, original = self.epochs, self._original

        class Recorded(original):  # type: ignore[misc, valid-type]
            def __init__(self, envs: Sequence[EnvState], *, train: bool = True) -> None:
                super().__init__(envs, train=train)
                if not train:
                    return  # validation batches: only the train epochs are recorded
                kinds = [len(k.rows) for slot in self.kinds.values() for k in slot]
                groups = host_batching.group_envs(envs)
                epochs.append(
                    {
                        "envs": len(envs),
                        "seed_kinds": kinds,
                        "structure_groups": [len(g) for g in groups],
                    }
                )

        host_batching.HostBatch = Recorded
        return self

    def __exit__(self, *_exc: object) -> None:
        host_batching.HostBatch = self._original


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
    with BatchRecorder() as rec:
        train(cfg, data=data, telemetry=MemoryHub(run_id="groups", level=TelemetryLevel.OFF))
    wall = time.perf_counter() - t0
    n = cfg.run.n_envs
    epochs = rec.epochs
    if any(e["envs"] != n for e in epochs):
        raise SystemExit("an epoch's batch did not hold every env (mixed devices or fp16?)")
    kinds = [e["seed_kinds"] for e in epochs]
    groups = [e["structure_groups"] for e in epochs]
    seeds = sum(sum(k) for k in kinds)
    shared = sum(size for k in kinds for size in k if size > 1)
    return {
        "config": config,
        "policy": policy,
        "n_envs": n,
        "epochs": len(epochs),
        "seed_kinds_per_epoch": statistics.mean(len(k) for k in kinds),
        "seeds_in_forward_per_epoch": seeds / len(epochs),
        "seeds_sharing_a_kind": shared / seeds if seeds else None,
        "structure_groups_per_epoch": statistics.mean(len(g) for g in groups),
        "structure_batched_share": statistics.mean(
            sum(size for size in g if size > 1) / n for g in groups
        ),
        "wall_s": wall,
        "epochs_detail": epochs,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = C.machine_info(threads=1)
    C.print_machine(info)
    tmp = C.CACHE_DIR / "batch_groups"
    tmp.mkdir(parents=True, exist_ok=True)
    results = [measure(c, p, args, tmp) for c in args.configs for p in args.policies]
    C.print_table(
        "Per train epoch with run.batch_envs: every host in one graph, plus one vmapped "
        "call per seed kind and slot; whole-structure groups for comparison",
        COLUMNS,
        [
            [
                r["config"],
                r["policy"],
                r["n_envs"],
                r["epochs"],
                r["seed_kinds_per_epoch"],
                r["seeds_in_forward_per_epoch"],
                "-" if r["seeds_sharing_a_kind"] is None else r["seeds_sharing_a_kind"],
                r["structure_groups_per_epoch"],
                r["structure_batched_share"],
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
