"""Shared test helper: reward inputs of a plain step, with any field overridden."""

from __future__ import annotations

import math

from esper.core.enums import LifecycleOp
from esper.training.envs.rewards import RewardInputs


def reward_inputs(**kw: object) -> RewardInputs:
    """A WAIT step on a 10k-parameter host that gained 1 pp; ``kw`` overrides fields."""
    base: dict[str, object] = {
        "op": LifecycleOp.WAIT,
        "val_acc": 80.0,
        "prev_val_acc": 79.0,
        "val_loss": 0.6,
        "prev_val_loss": 0.65,
        "random_guess_loss": math.log(10),
        "host_params": 10_000,
        "effective_params": 10_000,
    }
    base.update(kw)
    return RewardInputs(**base)  # type: ignore[arg-type]
