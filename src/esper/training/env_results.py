"""What :class:`~esper.training.envs.HostEnvs` hands back to the trainer: plain data.

Everything here is host-side (numbers already transferred, lifecycle records already
drained), so the trainer, the learner and the :class:`~esper.training.recorder.Recorder`
consume the results of a step without touching an env or a device tensor. Rollbacks and
their penalties travel as :class:`Rollback` values, not as mutations of pending state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from esper.core.records import (
    CounterfactualRecord,
    LifecycleRecord,
    RewardBreakdown,
    RollbackRecord,
    SlotReport,
)
from esper.model.metrics import ParamCounts
from esper.policy.actions import DecodedAction
from esper.policy.masks import ActionMasks
from esper.policy.signals import SignalTracker
from esper.training.batch_ops import EnvStepStats
from esper.training.env_state import EpisodeStats


@dataclass
class PhaseTimes:
    """Wall-clock milliseconds per phase, accumulated over a step or a round."""

    train_ms: float = 0.0
    val_ms: float = 0.0
    features_ms: float = 0.0
    policy_ms: float = 0.0
    action_ms: float = 0.0
    ppo_ms: float = 0.0

    def add(self, other: PhaseTimes) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class Rollback:
    """One env's governor rollback: the host is restored; the buffer is the learner's.

    ``record.transitions_affected`` is filled in by the trainer once the learner has
    rewritten the env's buffer segment (:meth:`Learner.rollback_transitions`).
    """

    local: int  # the env's position in this rank's batch (its buffer row)
    from_step: int  # the snapshot's step: the segment after it is undone
    to_step: int  # the panic step
    record: RollbackRecord
    pruned_records: list[LifecycleRecord]  # the seeds the rollback pruned

    @property
    def penalty(self) -> float:
        return self.record.penalty


@dataclass
class EnvEpoch:
    """One env after one host epoch: metrics, attribution, rollback, lifecycle records."""

    index: int  # global env index
    stats: EnvStepStats
    counterfactual: CounterfactualRecord
    records: list[LifecycleRecord]  # what the epoch's ticks reported (after any rollback)
    rollback: Rollback | None = None
    layer_names: list[str] = field(default_factory=list)  # debug level only


@dataclass
class Observation:
    """What the policy sees of all envs at one step (device tensors, one batch)."""

    obs: torch.Tensor
    blueprint_ids: torch.Tensor
    masks: ActionMasks
    reports: list[tuple[SlotReport, ...]]
    trackers: list[SignalTracker]


@dataclass
class EnvTransition:
    """One env's response to its action: outcome, reward, lifecycle records."""

    index: int
    action: DecodedAction
    executed: bool
    reward: RewardBreakdown
    records: list[LifecycleRecord]


@dataclass
class EnvSummary:
    """One env's current metrics and episode totals (env_step / episode_finished)."""

    index: int
    val_acc: float
    val_loss: float
    params: ParamCounts
    active_seeds: int
    episode: EpisodeStats
    #: The env's host family member ("" without a family).
    host: str = ""
