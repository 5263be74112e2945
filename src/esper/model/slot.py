"""A seed slot: one insertion point in the host, with its seed module, lifecycle and alpha.

The lifecycle operations (gates, stage moves, alpha, metrics, events) are
:class:`~esper.model.slot_state.SlotState`'s, torch-free; this class adds what needs
torch: the seed module and its blend gate (submodules only while a seed is present),
the forward pass, and building, freezing and restoring those modules.

Forward semantics by stage:
- no seed / GERMINATED / cooldown: the host activation passes through unchanged;
- TRAINING: isolated and straight-through: the seed reads ``h.detach()`` and the output
  is numerically ``h`` while the seed still receives gradients;
- BLENDING / HOLDING / FOSSILIZED: ``blend(op, h, seed(h), alpha)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from esper.core.enums import GerminationStyle, Initiator, SeedStage
from esper.model.alpha import ALPHA_MAX
from esper.model.blending import BlendGate, blend, straight_through
from esper.model.lifecycle import BLENDED_STAGES, SeedLifecycle
from esper.model.metrics import SeedMetrics
from esper.model.slot_state import SlotState
from esper.model.slot_table import LIFECYCLE_COLUMNS, METRICS_COLUMNS, SlotTable

#: Where a removed seed's modules go (blueprint, slot width, seed, gate): the owner's
#: :class:`~esper.model.seed_pool.SeedPool`, for a later germination to reuse.
Release = Callable[[str, int, nn.Module, "BlendGate | None"], None]


def _forget(_blueprint: str, _width: int, _seed: nn.Module, _gate: BlendGate | None) -> None:
    pass


class SeedSlot(SlotState, nn.Module):
    """One slot; ``seed`` and ``gate`` are submodules only while a seed is present."""

    seed: nn.Module | None
    gate: BlendGate | None

    def __init__(
        self,
        slot_id: str,
        width: int,
        *,
        strict: bool = False,
        auto_advance: bool = False,
        table: SlotTable | None = None,
        row: int = 0,
        col: int = 0,
    ) -> None:
        nn.Module.__init__(self)
        self.width = width
        self.register_module("seed", None)
        self.register_module("gate", None)
        self.release: Release = _forget
        SlotState.__init__(
            self, slot_id, strict=strict, auto_advance=auto_advance, table=table, row=row,
            col=col,
        )  # fmt: skip

    # --- forward ---------------------------------------------------------------------

    def forward(self, h: Tensor, alpha: Tensor | None = None) -> Tensor:
        """Apply the seed; ``alpha`` (per-sample, broadcastable) overrides the controller."""
        seed = self.seed
        if seed is None:
            return h
        stage = self.life.stage
        if stage == SeedStage.TRAINING:
            if not torch.is_grad_enabled():
                return h  # the straight-through output is exactly h
            return straight_through(h, seed(h.detach()))
        if stage not in BLENDED_STAGES:
            return h
        a: float | Tensor = self.alpha.alpha if alpha is None else alpha
        return blend(self.life.blend_op, h, seed(h), h, a, self.gate)

    def seed_parameters(self) -> list[nn.Parameter]:
        params: list[nn.Parameter] = []
        for module in (self.seed, self.gate):
            if module is not None:
                params.extend(module.parameters())
        return params

    # --- the seed's modules ------------------------------------------------------------

    def install(
        self,
        seed: nn.Module,
        gate: BlendGate | None,
        *,
        seed_id: str,
        blueprint: str,
        style: GerminationStyle,
        tempo: int,
        alpha_target: float,
        current_acc: float,
        initiator: Initiator,
    ) -> None:
        """DORMANT -> GERMINATED with a freshly built seed (G0 already passed)."""
        self._put(seed, gate)
        self.germinate(
            seed_id=seed_id,
            blueprint=blueprint,
            style=style,
            tempo=tempo,
            alpha_target=alpha_target,
            current_acc=current_acc,
            n_params=sum([p.numel() for p in self.seed_parameters()]),
            initiator=initiator,
        )

    def restore_fossil(
        self,
        seed: nn.Module,
        gate: BlendGate | None,
        *,
        life: SeedLifecycle,
        metrics: SeedMetrics,
    ) -> None:
        """Put a fossilized seed back from a snapshot (a restore, not a transition)."""
        self._put(seed, gate)
        own = self.life
        for group, view in ((LIFECYCLE_COLUMNS, life), (METRICS_COLUMNS, metrics)):
            for name in group:
                column = getattr(own.table, name)
                column[own.row, own.col] = getattr(view.table, name)[view.row, view.col]
        self.n_params = sum(p.numel() for p in self.seed_parameters())
        self.alpha.reset(ALPHA_MAX)

    def _put(self, seed: nn.Module, gate: BlendGate | None) -> None:
        """The seed's modules take the slot's train/eval mode: a tree's mode is then its
        root's (what the batched passes check instead of setting it at every pass)."""
        self.seed = seed.train(self.training)
        self.gate = gate.train(self.training) if gate is not None else None

    def clear_for_restore(self) -> None:
        """Empty the slot without a transition (the snapshot predates its seed)."""
        self.seed = None
        self.gate = None
        self.life.clear()
        self.metrics.reset()
        self.alpha.reset()
        self.n_params = 0

    def _set_trainable(self, flag: bool) -> None:
        for p in self.seed_parameters():
            p.requires_grad_(flag)

    def _drop_seed(self) -> None:
        """Remove the seed's modules (a prune, a rollback, a new round), handing them to
        :attr:`release` (the model's seed pool)."""
        if self.seed is not None:
            self.release(self.life.blueprint, self.width, self.seed, self.gate)
        self.seed = None
        self.gate = None
