"""Typed records that cross subsystem boundaries.

The model reports lifecycle changes with these (it never imports the telemetry hub);
rewards, the governor and PPO return them; the trainer turns them into events. All are
plain msgspec Structs so they are cheap to build and have no torch dependency.

Missing measurements are ``float('nan')`` rather than 0 so that "not measured" never
masquerades as "measured zero".
"""

from __future__ import annotations

import math
from typing import Final

import msgspec

from esper.core.enums import (
    AlphaMode,
    BlendOp,
    CounterfactualUnavailable,
    GateId,
    Initiator,
    PruneReason,
    RollbackReason,
    SeedStage,
)
from esper.telemetry.events import REWARD_COMPONENTS as REWARD_COMPONENTS
from esper.telemetry.events import PpoUpdate, RewardComputed

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


class GateResult(msgspec.Struct, frozen=True, kw_only=True):
    gate: GateId
    target_stage: SeedStage
    passed: bool
    checks_passed: tuple[str, ...] = ()
    checks_failed: tuple[str, ...] = ()
    message: str = ""
    strict: bool = False


# --- Lifecycle records reported by the model -------------------------------------------


class SeedGerminatedRecord(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    slot: str
    seed_id: str
    blueprint: str
    style: int
    blend_op: BlendOp
    tempo: int
    alpha_target: float
    params: int
    acc_at_germination: float


class StageChangedRecord(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    slot: str
    seed_id: str
    blueprint: str
    from_stage: SeedStage
    to_stage: SeedStage
    epochs_in_prev_stage: int
    alpha: float
    initiator: Initiator


class GateRecord(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    slot: str
    seed_id: str
    result: GateResult


class SeedFossilizedRecord(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    slot: str
    seed_id: str
    blueprint: str
    contribution: float
    params: int
    age_epochs: int


class SeedPrunedRecord(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    slot: str
    seed_id: str
    blueprint: str
    reason: PruneReason
    initiator: Initiator
    age_epochs: int
    stage_at_prune: SeedStage
    contribution: float
    scheduled: bool


LifecycleRecord = (
    SeedGerminatedRecord | StageChangedRecord | GateRecord | SeedFossilizedRecord | SeedPrunedRecord
)


# --- Learning components ---------------------------------------------------------------


#: A step's reward: one field per component, and ``total``, always their exact sum. It
#: is the ``reward_computed`` event itself (the recorder adds the family, op and
#: normalized value, and the envelope), so its fields are declared once. Build it with
#: :func:`make_breakdown` so the invariant cannot be broken by hand.
RewardBreakdown = RewardComputed
#: One PPO update's metrics: the ``ppo_update`` event itself (the recorder sets its round).
PPOMetrics = PpoUpdate


def make_breakdown(**components: float) -> RewardBreakdown:
    """Build a breakdown whose total is the sum of the given components (in field order)."""
    unknown = set(components) - set(REWARD_COMPONENTS)
    if unknown:
        raise ValueError(f"unknown reward component(s): {sorted(unknown)}")
    total = 0.0
    for name in REWARD_COMPONENTS:
        total += components.get(name, 0.0)
    return msgspec.structs.replace(_ZERO, **components, total=total)


_ZERO: Final = RewardComputed()


class RollbackRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the governor did; becomes a ``governor_rollback`` event."""

    reason: RollbackReason
    loss: float
    threshold: float
    panic_step: int
    restored_to_step: int
    seeds_pruned: tuple[str, ...]
    transitions_affected: int
    penalty: float


class CounterfactualRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Per-env attribution from one fused validation pass (accuracies in percent)."""

    slots: tuple[str, ...]
    contributions: tuple[float, ...]
    unavailable: tuple[CounterfactualUnavailable, ...]
    shapley: tuple[float, ...] = ()
    interaction: float = NAN
    real_acc: float = NAN
    all_off_acc: float = NAN
    n_configs: int = 1
    exact_shapley: bool = False
