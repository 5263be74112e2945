"""A slot's report: what the policy features, masks, rewards and rule-based policies read
of one slot, as a plain msgspec Struct (no torch).

What the model, the governor, rewards and PPO report are the events themselves
(:mod:`esper.telemetry.events`: the lifecycle events, ``governor_rollback``,
``reward_computed``, ``ppo_update``), declared once there; the recorder adds their
round, env and step. So this module imports no telemetry.

Missing measurements are ``float('nan')`` rather than 0 so that "not measured" never
masquerades as "measured zero".
"""

from __future__ import annotations

import math

import msgspec

from esper.core.enums import (
    AlphaMode,
    BlendOp,
    SeedStage,
)

NAN = math.nan


class SlotReport(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the policy features, masks and rewards need to know about one slot."""

    slot_id: str
    stage: SeedStage
    seed_id: str = ""
    blueprint: str = ""
    blend_op: BlendOp = BlendOp.ADD
    alpha: float = 0.0
    alpha_target: float = 0.0
    alpha_mode: AlphaMode = AlphaMode.HOLD
    alpha_curve: int = 0
    alpha_steps_total: int = 0
    alpha_steps_done: int = 0
    alpha_velocity: float = 0.0
    tempo: int = 0
    age_epochs: int = 0
    epochs_in_stage: int = 0
    acc_at_germination: float = NAN
    acc_at_stage_start: float = NAN
    improvement: float = NAN
    contribution: float = NAN
    contribution_velocity: float = 0.0
    epochs_since_contribution: int = -1
    grad_norm_ratio: float = NAN
    grad_health: float = NAN
    params: int = 0
    embargo_remaining: int = 0
    scheduled_prune: bool = False

    @property
    def active(self) -> bool:
        """A seed occupies the slot (not DORMANT and not in the post-prune cooldown)."""
        return occupies(self.stage)

    @property
    def alpha_at_rest(self) -> bool:
        return self.alpha_mode == AlphaMode.HOLD


_INACTIVE_STAGES = frozenset(
    {SeedStage.DORMANT, SeedStage.PRUNED, SeedStage.EMBARGOED, SeedStage.RESETTING}
)


def occupies(stage: SeedStage) -> bool:
    """Whether a slot at ``stage`` holds a seed (:attr:`SlotReport.active`)."""
    return stage not in _INACTIVE_STAGES
