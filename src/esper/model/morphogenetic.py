"""The morphogenetic model: a host whose segments are interleaved with seed slots.

It runs ``stem -> (segment -> slot)* -> head``, exposes the lifecycle operations the
policy's actions map to (each returns whether it took effect and reports records to an
injected callback), a fused forward that evaluates K alpha configurations in one pass,
parameter counts, and gradient metrics that stay on the device until the trainer's
single per-step transfer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from esper.core.constants import STYLE_BLEND
from esper.core.enums import (
    AlphaCurve,
    BlendOp,
    GerminationStyle,
    Initiator,
    PruneReason,
    Topology,
)
from esper.core.host_family import HostDescriptor, SlotDescriptor, positions
from esper.core.records import SlotReport
from esper.model import snapshot
from esper.model.alpha import ALPHA_MAX, ALPHA_MIN
from esper.model.blending import BlendGate
from esper.model.gates import gate_g0
from esper.model.hosts import HostNetwork, SlotPosition
from esper.model.initialization import materialize_small, reinitialise
from esper.model.lifecycle import LIVE_CODES, OCCUPYING_CODES, effective_alphas
from esper.model.memory_format import IMAGE_DIMS, is_channels_last
from esper.model.metrics import ParamCounts
from esper.model.registry import DEFAULT_REGISTRY, BlueprintRegistry
from esper.model.seed_pool import GATE, SeedPool
from esper.model.slot import SeedSlot
from esper.model.slot_table import SlotTable
from esper.model.ticks import tick_slots
from esper.telemetry.events import LifecycleEvent

Reporter = Callable[[LifecycleEvent], None]


def _dropped(_record: LifecycleEvent) -> None:
    pass


M = TypeVar("M", bound=nn.Module)

#: Strides mixing (model seed, slot, germination count) into a seed module's RNG seed.
GERMINATION_SEED_STRIDE = 1_000_033
SLOT_SEED_STRIDE = 7_919
_SEED_MODULUS = 2**63
#: Values per slot in :meth:`MorphogeneticModel.grad_norms`: [seed norm, host norm].
GRAD_VALUES_PER_SLOT = 2


class MorphogeneticModel(nn.Module):
    """Host network plus seed slots, with the lifecycle operations of the action space."""

    def __init__(
        self,
        host: HostNetwork,
        *,
        seed: int,
        slot_ids: Sequence[str] | None = None,
        max_seeds: int,
        strict_gates: bool = False,
        auto_advance: bool = False,
        reporter: Reporter | None = None,
        registry: BlueprintRegistry = DEFAULT_REGISTRY,
        table: SlotTable | None = None,
        row: int = 0,
        pool: SeedPool | None = None,
    ) -> None:
        super().__init__()
        self.host = host
        self.topology: Topology = host.topology
        self.registry = registry
        #: Removed seeds' modules, for germinations to reuse (shared by a trainer's
        #: models: the env factory's; default this model's own).
        self.pool = SeedPool() if pool is None else pool
        self.max_seeds = max_seeds
        self.strict_gates = strict_gates
        self._seed = seed
        offered = {p.slot_id: p for p in host.positions}
        wanted = tuple(offered) if not slot_ids else tuple(slot_ids)
        unknown = [s for s in wanted if s not in offered]
        if unknown:
            raise ValueError(f"unknown slot(s) {unknown}; this host offers {tuple(offered)}")
        self.slot_ids: tuple[str, ...] = tuple(
            p.slot_id for p in host.positions if p.slot_id in wanted
        )
        self.positions: dict[str, SlotPosition] = {s: offered[s] for s in self.slot_ids}
        self.auto_advance = auto_advance
        #: The slots' state: this model's own one-row table, or its row of a round's
        #: (:meth:`bind_table`).
        self.table = SlotTable(1, len(self.slot_ids)) if table is None else table
        self.row = row
        by_col = [
            SeedSlot(
                s,
                offered[s].width,
                strict=strict_gates,
                auto_advance=auto_advance,
                table=self.table,
                row=self.row,
                col=j,
            )
            for j, s in enumerate(self.slot_ids)
        ]
        for slot in by_col:
            slot.release = self._release
        self.slots = nn.ModuleDict(dict(zip(self.slot_ids, by_col, strict=True)))
        #: Every slot, in the slot order (slot ``j``: the table's column ``j``).
        self.slots_in_order: list[SeedSlot] = by_col
        self._slot_after: list[SeedSlot | None] = [None] * len(host.segments)
        for s, slot in zip(self.slot_ids, by_col, strict=True):
            self._slot_after[offered[s].segment] = slot
        self._germinations = dict.fromkeys(self.slot_ids, 0)
        self._grad_index: dict[tuple[object, ...], Tensor] = {}
        # Parameter counts: the host's shapes never change, and every step asks for them.
        self._host_numel = sum(map(Tensor.numel, host.parameters()))
        self._ref_numel = {
            s: sum(map(Tensor.numel, self._host_ref_params(s))) for s in self.slot_ids
        }
        self._descriptors: dict[str, HostDescriptor] = {}
        self.set_reporter(reporter)

    # --- forward -----------------------------------------------------------------------

    def forward(self, x: Tensor, alphas: Tensor | None = None) -> Tensor:
        """Logits; ``alphas`` ([n_slots] or per-sample [B, n_slots]) forces slot alphas.

        Forced alphas apply to seeds whose output is blended in (BLENDING, HOLDING,
        FOSSILIZED); an isolated TRAINING seed never changes the output.
        """
        if alphas is not None and alphas.dim() == 1:
            alphas = alphas.expand(x.shape[0], -1)
        h = self.host.stem(x)
        col = 0
        for segment, slot in zip(self.host.segments, self._slot_after, strict=True):
            h = segment(h)
            if slot is None:
                continue
            a = None
            if alphas is not None:
                a = alphas[:, col].reshape((-1,) + (1,) * (h.dim() - 1))
            col += 1
            h = slot(h, a)
        out: Tensor = self.host.head(h)
        return out

    def fused_forward(self, x: Tensor, alphas: Tensor) -> Tensor:
        """Evaluate K alpha configurations ``alphas[K, n_slots]`` in one pass: [K, B, ...].

        The batch is repeated K times and every copy gets its own alphas, so the result
        equals K separate forwards with forced alphas. Needs eval mode (BatchNorm would
        otherwise mix statistics across configurations); call it under inference mode.
        """
        if self.training:
            raise RuntimeError(
                "fused_forward needs model.eval() (batch statistics would mix configs)"
            )
        if alphas.dim() != 2 or alphas.shape[1] != len(self.slot_ids):
            raise ValueError(f"alphas must be [K, {len(self.slot_ids)}], got {tuple(alphas.shape)}")
        k, b = alphas.shape[0], x.shape[0]
        xs = torch.cat([x] * k) if k > 1 else x
        per_sample = alphas.to(x.device, non_blocking=True).repeat_interleave(b, dim=0)
        logits = self.forward(xs, per_sample)
        return logits.view(k, b, *logits.shape[1:])

    def bind_table(self, table: SlotTable, row: int) -> None:
        """Keep the slots' state in row ``row`` of ``table`` (a round's table: the
        trainer's vectorised step reads and writes every env's slots there)."""
        for j, slot in enumerate(self.slots_in_order):
            slot.bind(table, row, j)
        self.table, self.row = table, row

    def renew(self, *, seed: int, table: SlotTable, row: int) -> None:
        """Become what a fresh model of this structure built with ``seed`` is, before its
        host is initialised (a new round reusing the modules; the caller places and
        initialises the host's tensors: ``HostStore.initialise``): no seeds, the slots'
        state in row ``row`` of the fresh ``table``, germinations counted from zero,
        train mode."""
        self._seed = seed
        for j, slot in enumerate(self.slots_in_order):
            slot.renew(table, row, j)
        self.table, self.row = table, row
        self._germinations = dict.fromkeys(self.slot_ids, 0)
        self._grad_index = {}
        self.train()

    def current_alphas(self) -> Tensor:
        """Effective alpha of every slot now (CPU float32 [n_slots]; 0 where not blended)."""
        return torch.tensor(self.alpha_values())

    def alpha_values(self) -> list[float]:
        """:meth:`current_alphas` as host floats (no tensor: batched passes pack them)."""
        values: list[float] = effective_alphas(self.table, self.row).tolist()
        return values

    # --- lifecycle -----------------------------------------------------------------------

    def set_reporter(self, reporter: Reporter | None) -> None:
        """Where lifecycle records go (None: dropped): :attr:`report` sends one there."""
        self.report: Reporter = _dropped if reporter is None else reporter
        for slot in self.slots_in_order:
            slot.emit = self.report

    def germinate(
        self,
        slot_id: str,
        blueprint: str,
        style: GerminationStyle | int,
        tempo: int,
        alpha_target: float,
        *,
        seed_id: str,
        current_acc: float,
        initiator: Initiator,
    ) -> bool:
        """Grow a new seed in an empty slot through gate G0 (accuracy in percent)."""
        slot = self._slot(slot_id)
        style = GerminationStyle(style)
        if tempo < 0 or not ALPHA_MIN <= alpha_target <= ALPHA_MAX:
            raise ValueError(f"tempo {tempo} / alpha target {alpha_target} out of range")
        result = gate_g0(
            seed_id=seed_id,
            blueprint=blueprint,
            blueprint_known=self.registry.has(self.topology, blueprint),
            stage=slot.stage,
            live_seeds=len(self.live_seed_slots()),
            max_seeds=self.max_seeds,
            strict=self.strict_gates,
        )
        slot.emit_gate(result, seed_id=seed_id)
        if not result.passed:
            return False
        gen = self._germination_generator(slot_id)
        seed_module, gate = self.build_seed_modules(slot_id, blueprint, style, gen, reuse=True)
        slot.install(
            seed_module,
            gate,
            seed_id=seed_id,
            blueprint=blueprint,
            style=style,
            tempo=tempo,
            alpha_target=alpha_target,
            current_acc=current_acc,
            initiator=initiator,
        )
        return True

    def advance(self, slot_id: str, *, initiator: Initiator) -> bool:
        """GERMINATED->TRAINING (G1), TRAINING->BLENDING (G2), BLENDING->HOLDING (G3)."""
        return self._slot(slot_id).advance(initiator)

    def set_alpha_target(
        self,
        slot_id: str,
        target: float,
        speed: int,
        curve: AlphaCurve | int,
        *,
        initiator: Initiator,
    ) -> bool:
        """Retarget a BLENDING/HOLDING seed at rest over ``speed`` epochs (0: at once)."""
        return self._slot(slot_id).set_alpha_target(target, speed, AlphaCurve(curve), initiator)

    def prune(
        self,
        slot_id: str,
        *,
        speed: int = 0,
        curve: AlphaCurve | int = AlphaCurve.LINEAR,
        reason: PruneReason,
        initiator: Initiator,
    ) -> bool:
        """Remove a non-fossilized seed at once (speed 0) or after ramping alpha to 0."""
        return self._slot(slot_id).prune(
            speed=speed, curve=AlphaCurve(curve), reason=reason, initiator=initiator
        )

    def fossilize(self, slot_id: str, *, initiator: Initiator) -> bool:
        """Make a HOLDING seed permanent through gate G5."""
        return self._slot(slot_id).fossilize(initiator)

    def prune_live_seeds(self, *, reason: PruneReason, initiator: Initiator) -> tuple[str, ...]:
        """Prune every live non-fossilized seed at once (rollback); returns the slot ids."""
        return tuple(s for s in self.slot_ids if self._slot(s).force_prune(reason, initiator))

    def tick(self, val_acc: float) -> None:
        """Per-epoch tick of every slot (``val_acc`` in percent)."""
        rows = np.array([self.row])
        tick_slots(
            self.table,
            rows,
            np.array([val_acc], dtype=np.float64),
            lambda _row, col: self.slots_in_order[col],
            auto_advance=self.auto_advance,
        )

    def record_contribution(self, slot_id: str, contribution_pp: float) -> None:
        self._slot(slot_id).record_contribution(contribution_pp)

    # --- queries -------------------------------------------------------------------------

    def slot_reports(self) -> tuple[SlotReport, ...]:
        return tuple(self._slot(s).report() for s in self.slot_ids)

    def active_seeds(self) -> int:
        """Slots holding a seed (those whose report is ``active``), without the reports."""
        return int(OCCUPYING_CODES[self.table.stage[self.row]].sum())

    def live_seed_slots(self) -> tuple[str, ...]:
        live = LIVE_CODES[self.table.stage[self.row]]
        return tuple([s for s, on in zip(self.slot_ids, live.tolist(), strict=True) if on])

    def host_parameters(self) -> list[nn.Parameter]:
        return list(self.host.parameters())

    def seed_parameters(self, slot_id: str) -> list[nn.Parameter]:
        return self._slot(slot_id).seed_parameters()

    def describe(self, name: str = "") -> HostDescriptor:
        """The host's shape as the policy observes it (``name``: its family member);
        the shape never changes, so a renewed model describes itself once."""
        found = self._descriptors.get(name)
        if found is None:
            found = self._descriptors[name] = self._describe(name)
        return found

    def _describe(self, name: str) -> HostDescriptor:
        segments = self.host.segments
        where = positions(len(segments), [self.positions[s].segment for s in self.slot_ids])
        return HostDescriptor(
            name=name,
            params=self._host_numel,
            depth=sum(1 for seg in segments if any(True for _ in seg.parameters())),
            slots=tuple(
                SlotDescriptor(slot_id=s, width=self.positions[s].width, position=pos)
                for s, pos in zip(self.slot_ids, where, strict=True)
            ),
        )

    def ref_params(self) -> list[int]:
        """Per slot, the host parameters its seed's gradient is compared with."""
        return [self._ref_numel[s] for s in self.slot_ids]

    def param_counts(self) -> ParamCounts:
        host = self._host_numel
        seeds = effective = 0.0
        for s in self.live_seed_slots():
            slot = self._slot(s)
            seeds += slot.n_params
            effective += slot.effective_alpha * slot.n_params
        return ParamCounts(host=host, seeds=int(seeds), effective=host + round(effective))

    # --- gradient metrics ------------------------------------------------------------------

    def grad_norms(self) -> Tensor:
        """[n_slots, 2] device tensor of [seed grad norm, host grad norm at the slot].

        Call after backward. One fused ``_foreach_norm`` over every gradient involved,
        then a scatter into per-slot groups; no host synchronisation.
        """
        grads: list[Tensor] = []
        groups: list[int] = []
        for j, s in enumerate(self.slot_ids):
            for g, params in enumerate((self.seed_parameters(s), self._host_ref_params(s))):
                for p in params:
                    if p.grad is not None:
                        grads.append(p.grad)
                        groups.append(GRAD_VALUES_PER_SLOT * j + g)
        device = next(self.host.parameters()).device
        out = torch.zeros(GRAD_VALUES_PER_SLOT * len(self.slot_ids), device=device)
        if grads:
            norms = torch.stack([n.float() for n in torch._foreach_norm(grads)])
            out.index_add_(0, self._group_index(groups, device), norms.square())
        return out.sqrt().view(len(self.slot_ids), GRAD_VALUES_PER_SLOT)

    def _group_index(self, groups: list[int], device: torch.device) -> Tensor:
        key = (device, *groups)
        index = self._grad_index.get(key)
        if index is None:  # built once per seed layout, never per batch
            index = torch.tensor(groups, dtype=torch.long).to(device, non_blocking=True)
            self._grad_index = {key: index}
        return index

    def apply_grad_norms(self, values: Sequence[float] | Tensor) -> None:
        """Take one epoch's [seed, host] norms (host floats or a CPU tensor) per slot."""
        flat = values.reshape(-1).tolist() if isinstance(values, Tensor) else list(values)
        if not flat:
            return  # nothing trained yet
        expected = GRAD_VALUES_PER_SLOT * len(self.slot_ids)
        if len(flat) != expected:
            raise ValueError(f"expected {expected} gradient values, got {len(flat)}")
        for j, s in enumerate(self.slot_ids):
            n_host = self._ref_numel[s]
            seed_norm, host_norm = flat[GRAD_VALUES_PER_SLOT * j : GRAD_VALUES_PER_SLOT * (j + 1)]
            self._slot(s).record_gradients(seed_norm, host_norm, n_host)

    # --- governor support ------------------------------------------------------------------

    def snapshot_state(self) -> dict[str, Tensor]:
        """CPU clones of host and fossilized seeds (with their identity) for rollback."""
        return snapshot.snapshot_model(self)

    def restore_state(self, state: dict[str, Tensor]) -> None:
        """Restore a :meth:`snapshot_state` exactly (live seeds are left to the caller)."""
        snapshot.restore_model(self, state)

    # --- internals -------------------------------------------------------------------------

    def _slot(self, slot_id: str) -> SeedSlot:
        try:
            slot = self.slots[slot_id]
        except KeyError:
            raise KeyError(f"unknown slot {slot_id!r} (slots: {self.slot_ids})") from None
        assert isinstance(slot, SeedSlot)
        return slot

    def _host_ref_params(self, slot_id: str) -> list[nn.Parameter]:
        """Host parameters a slot's seed gradient is compared with (looked up live, so
        device moves that replace Parameter objects never leave a stale list)."""
        return list(self.host.segments[self.positions[slot_id].ref_segment].parameters())

    def _germination_generator(self, slot_id: str) -> torch.Generator:
        """Per-(model seed, slot, germination count) generator: reproducible seeds."""
        count = self._germinations[slot_id]
        self._germinations[slot_id] = count + 1
        index = self.slot_ids.index(slot_id) + 1
        mixed = self._seed * GERMINATION_SEED_STRIDE + index * SLOT_SEED_STRIDE + count
        return torch.Generator().manual_seed(mixed % _SEED_MODULUS)

    def build_seed_modules(
        self,
        slot_id: str,
        blueprint: str,
        style: GerminationStyle,
        generator: torch.Generator,
        *,
        reuse: bool = False,
    ) -> tuple[nn.Module, BlendGate | None]:
        """A fresh seed module (and blend gate for GATE styles) laid out like the host.
        ``reuse``: modules of removed seeds from :attr:`pool` are initialised instead
        where it has them, with the values new ones would get."""
        width = self._slot(slot_id).width
        pool, topo = self.pool, self.topology
        seed_module = self._reused(pool.take(topo, blueprint, width) if reuse else None, generator)
        if seed_module is None:
            seed_module = self._to_host_layout(
                self.registry.build(self.topology, blueprint, width, generator=generator)
            )
        gate = None
        if STYLE_BLEND[style] == BlendOp.GATE:
            gate = self._reused(pool.take(topo, GATE, width) if reuse else None, generator)
            if gate is None:
                built = materialize_small(lambda: BlendGate(width, topo), generator)
                gate = self._to_host_layout(built)
        return seed_module, gate  # type: ignore[return-value]

    def _release(self, blueprint: str, width: int, seed: nn.Module, gate: BlendGate | None) -> None:
        self.pool.put(self.topology, blueprint, width, seed)
        if gate is not None:
            self.pool.put(self.topology, GATE, width, gate)

    def _reused(self, module: M | None, generator: torch.Generator) -> M | None:
        """``module`` initialised from ``generator`` if it is laid out like the host
        (device, dtype, memory format) still, else None (built anew instead)."""
        if module is None:
            return None
        ref = next(self.host.parameters())
        tensors = [*module.parameters(), *module.buffers()]
        fmt = torch.channels_last if self._host_channels_last() else torch.contiguous_format
        if (tensors[0].device, tensors[0].dtype) != (ref.device, ref.dtype) or not all(
            t.is_contiguous(memory_format=fmt) for t in tensors if t.dim() == IMAGE_DIMS
        ):
            return None
        reinitialise(module, generator)
        return module

    def slot(self, slot_id: str) -> SeedSlot:
        """The slot module (for package internals such as snapshots and tests)."""
        return self._slot(slot_id)

    def _to_host_layout(self, module: nn.Module) -> nn.Module:
        """Match the host's device, dtype and (for CNNs) memory format."""
        ref = next(self.host.parameters())
        # A module is built on one device, in one dtype: its first tensor says which.
        own = next(itertools.chain(module.parameters(), module.buffers()), None)
        if own is not None and (own.device != ref.device or own.dtype != ref.dtype):
            module = module.to(device=ref.device, dtype=ref.dtype, non_blocking=True)
        if self._host_channels_last():
            module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        return module

    def _host_channels_last(self) -> bool:
        # Stops at the first channels-last tensor: the stem's conv, in the usual case.
        return any(map(is_channels_last, self.host.parameters()))
