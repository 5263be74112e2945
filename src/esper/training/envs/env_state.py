"""Per-environment state: one host network in training plus its bookkeeping.

Device-side accumulators are preallocated and zeroed in place each epoch so the hot
path allocates nothing and never synchronises; host-side counters are plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from esper.config import HostConfig
from esper.core.columns import RowField
from esper.core.host_family import HostDescriptor
from esper.core.layout import Layout
from esper.training.envs.env_table import EnvTable, EpisodeStats

#: ``EnvState.train_accum``: the train pass's running sums, on device.
TRAIN_ACCUM = Layout(("loss_sum", 1), ("correct", 1), ("count", 1))

if TYPE_CHECKING:
    from esper.model import MorphogeneticModel
    from esper.policy.signals import SignalTracker
    from esper.training.envs.governor import Governor


@dataclass(frozen=True)
class SgdSettings:
    """What a parameter's SGD step needs (dampening 0, no Nesterov): one home for the
    per-env optimizers and the batched step, which must step alike."""

    lr: float
    momentum: float
    weight_decay: float


def host_sgd(cfg: HostConfig) -> SgdSettings:
    return SgdSettings(cfg.lr, cfg.momentum, cfg.weight_decay)


def seed_sgd(cfg: HostConfig) -> SgdSettings:
    return SgdSettings(cfg.seed_lr, cfg.momentum, 0.0)


def _sgd(params: Any, s: SgdSettings) -> torch.optim.Optimizer:
    # foreach on every device: a few multi-tensor kernels per step instead of three per
    # parameter (torch picks foreach only on CUDA; on a CPU the results are identical).
    return torch.optim.SGD(
        params, lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay, foreach=True
    )


def make_host_optimizer(model: MorphogeneticModel, cfg: HostConfig) -> torch.optim.Optimizer:
    return _sgd(model.host_parameters(), host_sgd(cfg))


def make_seed_optimizer(params: list[torch.nn.Parameter], cfg: HostConfig) -> torch.optim.Optimizer:
    return _sgd(params, seed_sgd(cfg))


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
    governor: Governor
    tracker: SignalTracker
    #: The round's :class:`~esper.training.envs.env_table.EnvTable` and this env's row of it:
    #: where its metrics, signals, reward memory and episode totals live.
    table: EnvTable
    row: int
    seed_optimizers: dict[str, torch.optim.Optimizer] = field(default_factory=dict)
    #: The host's optimizer, made when first used (a batched round steps its hosts in
    #: the store, and reads this only for its settings and on a rollback).
    _host_optimizer: torch.optim.Optimizer | None = None
    #: The host's training settings (``[host]``): seed optimizers are made from it.
    host_cfg: HostConfig = field(default_factory=HostConfig)
    #: The host's shape and family member (what the policy observes with a family).
    host: HostDescriptor | None = None
    stream: torch.cuda.Stream | None = None
    scaler: torch.amp.GradScaler | None = None
    # Device accumulators for one train epoch: [loss_sum, correct, count].
    train_accum: torch.Tensor | None = None
    # Gradient norms of the last train batch (device tensor from ``model.grad_norms()``).
    last_grad_norms: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    #: The batched group's stacked storage this env's tensors live in (``run.batch_envs``;
    #: :class:`esper.training.passes.host_store.HostStore`), or None.
    store: Any = None

    # Host-side signals of the previous step, used by rewards and features.
    val_acc = RowField("val_acc", float)
    val_loss = RowField("val_loss", float)
    prev_val_acc = RowField("prev_val_acc", float)
    prev_val_loss = RowField("prev_val_loss", float)
    last_op = RowField("last_op", int)
    last_success = RowField("last_success", bool)
    seed_counter = RowField("seed_counter", int)

    @property
    def host_optimizer(self) -> torch.optim.Optimizer:
        if self._host_optimizer is None:
            self._host_optimizer = make_host_optimizer(self.model, self.host_cfg)
        return self._host_optimizer

    @host_optimizer.setter
    def host_optimizer(self, opt: torch.optim.Optimizer) -> None:
        self._host_optimizer = opt

    @property
    def stats(self) -> EpisodeStats:
        return EpisodeStats(self.table, self.row)

    @property
    def reward_memory(self) -> RewardMemory:
        """The previous step's reward memory (see :mod:`esper.training.envs.step_rewards`)."""
        t, i = self.table, self.row
        if not t.memory_set[i]:
            return RewardMemory()
        return RewardMemory(
            alphas=tuple(t.memory_alphas[i].tolist()),
            potential=float(t.memory_potential[i]),
            seed_params=int(t.memory_seed_params[i]),
        )

    @reward_memory.setter
    def reward_memory(self, memory: RewardMemory) -> None:
        t, i = self.table, self.row
        t.memory_set[i] = bool(memory.alphas)
        if memory.alphas:
            t.memory_alphas[i] = memory.alphas
        t.memory_potential[i] = memory.potential
        t.memory_seed_params[i] = memory.seed_params

    def __post_init__(self) -> None:
        if self.train_accum is None:
            self.train_accum = torch.zeros(TRAIN_ACCUM.width, device=self.device)

    def clear_optimizers(self) -> None:
        """Rollback: momentum from the discarded trajectory must not leak into the restore."""
        self.host_optimizer.state.clear()
        self.seed_optimizers.clear()
        self.table.seed_sgd[self.row] = False
        self.table.changed.add(self.row)
        self.table.unadopted.add(self.row)  # a restore may bring back a fossil
        if self.store is not None:
            self.store.clear_momentum(self)

    def next_seed_id(self) -> str:
        counter = self.seed_counter + 1
        self.seed_counter = counter
        return f"e{self.index}s{counter}"
