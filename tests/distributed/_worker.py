"""Test worker: one rank of a torchrun launch (or one plain process) calling ``train``.

Used where the CLI cannot reach: a greedy (deterministic) policy, so a 2-rank x N-env
run and a 1-rank x 2N-env run collect the same data; a data-loader fault on one rank
only. Exits 0 on success and 1 on a failed run, like ``esper train``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from esper.config import Config, with_overrides
from esper.data.tasks import load_task
from esper.training.learning.policy_factory import build_policy
from esper.training.loop.distributed import init_collective
from esper.training.loop.faults import FaultPlan, parse_fault
from esper.training.loop.run_setup import action_space_for
from esper.training.run import train


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--envs", type=int, required=True)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--episode-length", type=int, default=4)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args()
    cfg = with_overrides(
        Config(),
        {
            "run.n_envs": args.envs,
            "run.rounds": args.rounds,
            "run.episode_length": args.episode_length,
            "run.seed": 3,
            "run.run_id": args.run_id,
            "telemetry.dir": args.dir,
            # One minibatch of the whole rollout, advantages not re-standardised per
            # minibatch: the gradient of 2 x N envs averaged equals that of 2N envs.
            "ppo.minibatches": 1,
            "ppo.normalize_advantages": False,
            "ppo.update_epochs": 2,
        },
    )
    collective = init_collective("cpu", timeout_s=args.timeout)
    rank = collective.rank if collective is not None else 0
    data = load_task(cfg.task, seed=cfg.run.seed)
    policy = build_policy(cfg, action_space_for(cfg, data))
    # Greedy decisions: the same observations give the same actions on any batch split
    # (forced: the Learner passes ``deterministic`` itself, False unless evaluating).
    act = policy.act

    def greedy(*args: Any, **kwargs: Any) -> Any:
        return act(*args, **{**kwargs, "deterministic": True})

    policy.act = greedy  # type: ignore[method-assign]
    faults = None
    if rank == args.fail_rank:
        faults = FaultPlan([parse_fault(f"data_error:round={args.rounds - 1},step=1")])
    try:
        train(cfg, data=data, policy=policy, faults=faults, collective=collective)
    except Exception as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if collective is not None:
            collective.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
