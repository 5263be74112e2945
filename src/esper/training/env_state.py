"""Per-environment state: one host network in training plus its bookkeeping.

Device-side accumulators are preallocated and zeroed in place each epoch so the hot
path allocates nothing and never synchronises; host-side counters are plain Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from esper.config import HostConfig
from esper.core.host_family import HostDescriptor
from esper.core.layout import Layout
from esper.core.records import (
    LifecycleRecord,
    SeedFossilizedRecord,
    SeedGerminatedRecord,
    SeedPrunedRecord,
)

#: ``EnvState.train_accum``: the train pass's running sums, on device.
TRAIN_ACCUM = Layout(("loss_sum", 1), ("correct", 1), ("count", 1))

if TYPE_CHECKING:
    from esper.model import MorphogeneticModel
    from esper.policy.signals import SignalTracker
    from esper.training.governor import Governor


@dataclass
class EpisodeStats:
    """What ``episode_finished`` reports; reset with each fresh env."""

    reward_sum: float = 0.0
    seeds_germinated: int = 0
    seeds_fossilized: int = 0
    seeds_pruned: int = 0
    rollbacks: int = 0
    rollback_penalty: float = 0.0

    def count(self, rec: LifecycleRecord) -> None:
        if isinstance(rec, SeedGerminatedRecord):
            self.seeds_germinated += 1
        elif isinstance(rec, SeedFossilizedRecord):
            self.seeds_fossilized += 1
        elif isinstance(rec, SeedPrunedRecord):
            self.seeds_pruned += 1


@dataclass(frozen=True)
class RewardMemory:
    """What the next step's reward needs of this one: alphas, stage potential (shaping
    telescopes) and live seed parameters (the accuracy reward's parameter cost)."""

    alphas: tuple[float, ...] = ()
    potential: float = 0.0
    seed_params: int = 0


@dataclass
class EnvState:
    index: int
    device: torch.device
    model: MorphogeneticModel
    host_optimizer: torch.optim.Optimizer
    governor: Governor
    tracker: SignalTracker
    seed_optimizers: dict[str, torch.optim.Optimizer] = field(default_factory=dict)
    #: The host's training settings (``[host]``): seed optimizers are made from it.
    host_cfg: HostConfig = field(default_factory=HostConfig)
    #: The host's shape and family member (what the policy observes with a family).
    host: HostDescriptor | None = None
    stream: torch.cuda.Stream | None = None
    scaler: torch.amp.GradScaler | None = None
    #: Lifecycle records reported by the model since the last drain (the model's callback).
    pending: list[LifecycleRecord] = field(default_factory=list)
    stats: EpisodeStats = field(default_factory=EpisodeStats)
    # Device accumulators for one train epoch: [loss_sum, correct, count].
    train_accum: torch.Tensor | None = None
    # Gradient norms of the last train batch (device tensor from ``model.grad_norms()``).
    last_grad_norms: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    # Host-side signals of the previous step, used by rewards and features.
    prev_val_acc: float = math.nan
    prev_val_loss: float = math.nan
    val_acc: float = math.nan
    val_loss: float = math.nan
    #: The previous step's reward memory (see :func:`step_rewards.build_reward_inputs`).
    reward_memory: RewardMemory = field(default_factory=RewardMemory)
    last_op: int = 0
    last_success: bool = True
    seed_counter: int = 0
    #: The batched group's stacked storage this env's tensors live in (``run.batch_envs``;
    #: :class:`esper.training.host_store.HostStore`), or None.
    store: Any = None
    #: :func:`esper.training.slot_groups.host_key`'s host part, once computed: the host,
    #: its optimizer and device are fixed for an env's life (a round), so it is not
    #: recomputed twice a step. A 1-tuple (the part may be None: not batchable).
    host_signature: tuple[Any] | None = None

    def __post_init__(self) -> None:
        if self.train_accum is None:
            self.train_accum = torch.zeros(TRAIN_ACCUM.width, device=self.device)

    def clear_optimizers(self) -> None:
        """Rollback: momentum from the discarded trajectory must not leak into the restore."""
        self.host_optimizer.state.clear()
        self.seed_optimizers.clear()
        if self.store is not None:
            self.store.clear_momentum(self)

    def drain_records(self) -> list[LifecycleRecord]:
        """The lifecycle records since the last drain, counted into the episode."""
        # Cleared in place: the model's reporter holds a bound ``pending.append``.
        records = list(self.pending)
        self.pending.clear()
        for rec in records:
            self.stats.count(rec)
        return records

    def next_seed_id(self) -> str:
        self.seed_counter += 1
        return f"e{self.index}s{self.seed_counter}"
