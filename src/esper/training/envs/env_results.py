"""What :class:`~esper.training.envs.host_envs.HostEnvs` hands back to the trainer: plain data.

Everything here is host-side (numbers already transferred, lifecycle records already
drained) and, for what every env has, columns: one array per quantity with the env as
its first dimension. The trainer, the learner and the
:class:`~esper.training.loop.recorder.Recorder` consume a step's results without a Python
call per env. Rollbacks and their penalties travel as :class:`Rollback` values (a few
per round), not as mutations of pending state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Generic, TypeVar, overload

import numpy as np
import torch

from esper.core.records import SlotReport
from esper.policy.masks import ActionMasks
from esper.policy.signals import SignalTracker
from esper.telemetry.events import GovernorRollback, LifecycleEvent
from esper.training.envs.counterfactual import Attribution
from esper.training.passes.batch_ops import StepStats

#: Lifecycle records, placed (round, global env, step: ``EnvTable.reporter``), in order.
Records = list[LifecycleEvent]


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
    record: GovernorRollback
    pruned_records: Records  # the seeds the rollback pruned

    @property
    def penalty(self) -> float:
        return self.record.penalty


@dataclass
class Epoch:
    """Every env after one host epoch: metrics, attribution, rollbacks, lifecycle records."""

    stats: StepStats
    attribution: Attribution
    slot_ids: tuple[str, ...]  # the attribution's slot order
    records: Records  # what the epoch's ticks reported (after any rollback)
    rollbacks: list[Rollback] = field(default_factory=list)
    #: Debug level: each env's layer names (its ``stats.extra`` values, in order).
    layer_names: list[list[str]] | None = None


T = TypeVar("T")


class Lazy(Sequence[T], Generic[T]):
    """A per-env sequence whose items are made only when read (what a rule-based policy
    reads of each env; the learned policy never does)."""

    def __init__(self, n: int, item: Callable[[int], T]) -> None:
        self._n = n
        self._item = item

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...

    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        if isinstance(i, slice):
            return [self._item(j) for j in range(self._n)[i]]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return self._item(i % self._n)

    def __iter__(self) -> Iterator[T]:
        return (self._item(j) for j in range(self._n))


@dataclass
class Observation:
    """What the policy sees of all envs at one step (device tensors, one batch), and
    the host-side context a rule-based policy reads, made on demand."""

    obs: torch.Tensor
    blueprint_ids: torch.Tensor
    masks: ActionMasks
    reports: Sequence[tuple[SlotReport, ...]]
    trackers: Sequence[SignalTracker]


@dataclass
class Transitions:
    """Every env's response to its action: head indices, whether it took effect, the
    reward breakdown ``[N, len(REWARD_COMPONENTS) + 1]`` (total last), and the lifecycle
    records the actions reported."""

    heads: np.ndarray  # [N, H] the actions' head indices
    executed: np.ndarray  # [N] bool
    rewards: np.ndarray  # [N, C + 1]
    records: Records

    @property
    def totals(self) -> np.ndarray:
        out: np.ndarray = self.rewards[:, -1]
        return out


@dataclass
class Summaries:
    """Every env's current metrics and episode totals (env_step / episode_finished)."""

    index: np.ndarray  # global env indices
    val_acc: np.ndarray
    val_loss: np.ndarray
    host_params: np.ndarray
    seed_params: np.ndarray
    effective_params: np.ndarray
    active_seeds: np.ndarray
    episode: dict[str, np.ndarray]
    #: Each env's host family member ("" without a family).
    hosts: list[str]
