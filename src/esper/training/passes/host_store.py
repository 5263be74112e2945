"""Stacked storage of a batched group's host and seed tensors, shared with the env modules.

Why: the batched step (:mod:`slot_groups`) must touch every env's parameters with a
handful of kernels, whatever the number of envs or parameters. So each group of
batched envs keeps, for the round, one ``[N, P]`` tensor of all host parameters (one
row per env), one of their SGD momentum, one per buffer dtype, and one ``[N, S]``
tensor of seed parameters in which every (slot, blueprint) pair has its own columns.
Each env's ``nn.Module`` tensors are *views* of its row, so the module stays the source
of truth for everything per env (lifecycle operations, snapshots and restores,
checkpoints, the per-env path) without a copy in either direction, while clipping, the
SGD step and gradient norms run once on the stacked tensors.

A seed is *adopted* (its tensors copied into its row and re-pointed there, momentum
zeroed: a new seed has none) the first time a pass sees it, so germinations, prunes
and rollback restores need no hook. An env whose optimizer state is cleared (a
rollback) has its momentum rows zeroed, which is exactly torch's "no buffer yet"
with dampening 0 (``0 * m + g == g``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from esper.core.enums import SeedStage
from esper.model.blending import BlendGate
from esper.model.builder import initialise_host
from esper.model.lifecycle import BLENDED_STAGES, effective_alphas
from esper.model.slot_table import blueprint_id
from esper.model.snapshot import restore_fossils
from esper.training.envs.env_state import seed_sgd
from esper.training.passes.flat_layout import Entry, FlatLayout, HostPart, names_under

if TYPE_CHECKING:
    from esper.model import MorphogeneticModel
    from esper.training.envs.env_state import EnvState, SgdSettings

#: Stages whose seed has stepped (it was in a train pass's forward).
_STEPPED = BLENDED_STAGES | {SeedStage.TRAINING}


@dataclass(frozen=True)
class Segment:
    """A (slot, blueprint) pair's columns of the seed store: the seed's tensors, then
    (for GATE styles) its blend gate's, as named in the slot module."""

    slot_id: str
    blueprint: str
    offset: int
    seed: FlatLayout
    gate: FlatLayout

    def layout(self, with_gate: bool) -> FlatLayout:
        """The seed's tensors, and its gate's after them with ``with_gate``."""
        return self._with_gate if with_gate else self.seed

    @cached_property
    def _with_gate(self) -> FlatLayout:
        base = self.seed.width
        gate = [
            Entry(e.name, e.shape, base + e.offset, e.numel, e.channels_last)
            for e in self.gate.entries
        ]
        return FlatLayout([*self.seed.entries, *gate], tied=self.seed.tied or self.gate.tied)

    @property
    def width(self) -> int:
        return self.seed.width + self.gate.width


class SeedLayout:
    """Every (slot, blueprint) segment a model's seeds can occupy (built once per host
    geometry, from modules on the meta device: no memory, no kernels)."""

    _cache: ClassVar[dict[tuple[object, ...], SeedLayout]] = {}

    def __init__(self, model: MorphogeneticModel) -> None:
        channels_last = model._host_channels_last()
        self.segments: dict[tuple[str, str], Segment] = {}
        offset = 0
        for slot_id in model.slot_ids:
            width = model.positions[slot_id].width
            with torch.device("meta"):
                gate = _fmt(BlendGate(width, model.topology), channels_last)
            gate_layout = FlatLayout.of_module(gate, prefix="gate.")
            for name in model.registry.names(model.topology):
                bp = model.registry.get(model.topology, name)
                with torch.device("meta"):
                    seed = _fmt(bp.factory(width), channels_last)
                seed_layout = FlatLayout.of_module(seed, prefix="seed.")
                seg = Segment(slot_id, name, offset, seed_layout, gate_layout)
                self.segments[(slot_id, name)] = seg
                offset += seg.width
        self.width = offset
        # The same as arrays by (slot column, blueprint id), for a pass's rows at once.
        ids = {name: blueprint_id(name) for name in model.registry.names(model.topology)}
        shape = (len(model.slot_ids), max(ids.values(), default=0) + 1)
        self.offset_of = np.zeros(shape, dtype=np.int64)
        self.seed_width_of = np.zeros(shape, dtype=np.int64)
        self.gate_width = np.zeros(len(model.slot_ids), dtype=np.int64)
        for (slot_id, name), seg in self.segments.items():
            col = model.slot_ids.index(slot_id)
            self.offset_of[col, ids[name]] = seg.offset
            self.seed_width_of[col, ids[name]] = seg.seed.width
            self.gate_width[col] = seg.gate.width

    @classmethod
    def of(cls, model: MorphogeneticModel) -> SeedLayout:
        key = (
            model.topology,
            tuple((s, model.positions[s].width) for s in model.slot_ids),
            model.registry.names(model.topology),
            model._host_channels_last(),
            id(model.registry),
        )
        found = cls._cache.get(key)
        if found is None:
            found = cls._cache[key] = cls(model)
        return found


def _fmt(module: nn.Module, channels_last: bool) -> nn.Module:
    return module.to(memory_format=torch.channels_last) if channels_last else module  # type: ignore[call-overload]


def _repoint(tensors: Sequence[Tensor], views: Sequence[Tensor]) -> None:
    """Make each module tensor share its row's memory (same object, new storage)."""
    for t, v in zip(tensors, views, strict=True):
        t.data = v


class HostStore:
    """The stacked tensors of one batched group for one round (module docstring).

    Made either from envs whose modules already hold their tensors (:meth:`of_envs`:
    their values are stacked and the tensors re-pointed to the rows), or, at the start of
    a round, with the hosts initialised straight into it (:meth:`initialise`: the
    modules are built on the meta device, their tensors become the rows, and each row is
    initialised from its env's seed: no per-tensor allocation or copy per env).
    """

    def __init__(
        self,
        envs: Sequence[EnvState],
        host_settings: SgdSettings,
        *,
        layout: FlatLayout,
        params: Tensor,
        momentum: Tensor,
        buffers: dict[str, Tensor],
    ) -> None:
        self.envs = list(envs)
        model = envs[0].model
        self.device = params.device
        #: The round's table and this store's envs' rows of it (row i of the store).
        self.table = envs[0].table
        self.rows = np.array([e.row for e in envs], dtype=np.int64)
        #: Table row -> store row, and each env's global index (faults name envs by it).
        self.local = {int(row): i for i, row in enumerate(self.rows.tolist())}
        self.local_of = np.full(self.table.n, -1, dtype=np.int64)
        self.local_of[self.rows] = np.arange(len(envs))
        self.indices = np.array([e.index for e in envs], dtype=np.int64)
        self.host_settings = host_settings
        self.seed_settings = seed_sgd(envs[0].host_cfg)  # every seed optimizer's
        self.params_layout = layout
        self.params, self.momentum, self.buffers = params, momentum, buffers
        n = len(envs)
        for env in envs:
            env.store = self
        self.seeds = SeedLayout.of(model)
        self.seed_params = self.params.new_zeros(n, self.seeds.width)
        self.seed_momentum = torch.zeros_like(self.seed_params)
        #: Per env and slot, the seed adopted last: its module and its seed id (a module
        #: used again by a later germination is a new seed).
        self._adopted: list[dict[str, tuple[nn.Module, str]]] = [{} for _ in envs]
        self.adopt_seeds(range(n))
        #: Row index tensors of the batches' members (validation's configuration rows).
        self.index_cache: dict[bytes, Tensor] = {}
        #: The seed kinds of the last train (True) and evaluation (False) pass, by
        #: signature (``slot_groups.HostBatch``: the grouping persists while it holds).
        self.kinds_seen: dict[bool, dict[tuple[object, ...], Any]] = {}
        self._host_parts: dict[tuple[str, ...], tuple[HostPart, ...]] = {}
        #: The host's runs of modules per pass type and cut points (``HostBatch``).
        self.runs_seen: dict[tuple[bool, tuple[int, ...]], Any] = {}
        #: Elements per sample of the widest layer on the validation data
        #: (measured by the first stacked validation: ``host_batching._sample_chunk``).
        self.widest: int | None = None
        self.slot_membership, self.host_ref_membership = self._memberships(model)

    @classmethod
    def of_envs(cls, envs: Sequence[EnvState], host_settings: SgdSettings) -> HostStore:
        """A store of envs whose modules hold their tensors (values stacked; the module
        tensors re-pointed to the rows; momentum taken from the host optimizers)."""
        host = [list(e.model.host.named_parameters()) for e in envs]
        layout = FlatLayout.of_module(envs[0].model.host)
        with torch.no_grad():
            params = torch.stack([layout.flatten([p for _, p in named]) for named in host])
            if any(e.host_optimizer.state for e in envs):  # a group formed mid-training
                momentum = torch.stack(
                    [
                        layout.flatten([_momentum(e, p) for _, p in named])
                        for e, named in zip(envs, host, strict=True)
                    ]
                )
            else:
                momentum = torch.zeros_like(params)
            # One contiguous [N, *shape] tensor per buffer: vmapped BatchNorm updates its
            # running statistics in place only in a contiguous batched tensor.
            buffers = [dict(e.model.host.named_buffers()) for e in envs]
            stacked = {k: torch.stack([b[k] for b in buffers]) for k in buffers[0]}
        _place(envs, layout.stack_views(params), stacked, swap=False)
        return cls(
            envs, host_settings, layout=layout, params=params, momentum=momentum, buffers=stacked
        )

    @classmethod
    def initialise(
        cls,
        envs: Sequence[EnvState],
        host_settings: SgdSettings,
        seeds: Sequence[int],
        *,
        channels_last: bool,
    ) -> HostStore:
        """A new round's store: the envs' hosts are on the meta device (or a previous
        round's, renewed); each row is initialised on the CPU from its env's seed (exactly
        the values a host built alone gets), then the whole store moves to the device in
        one copy per tensor."""
        host = envs[0].model.host
        layout = FlatLayout.of_module(host, channels_last=channels_last)
        # The rows' values as the tensors of a freshly built host: contiguous (a reused
        # host's tensors are channels-last views; init fills in memory order).
        staging = FlatLayout.of_module(host, channels_last=False)
        n = len(envs)
        params = torch.empty(n, layout.width)
        buffers = {k: torch.empty(n, *b.shape, dtype=b.dtype) for k, b in host.named_buffers()}
        _place(envs, staging.stack_views(params), buffers, swap=True)
        for env, seed in zip(envs, seeds, strict=True):
            initialise_host(env.model.host, seed)
        device = envs[0].device
        rows = torch.empty(n, layout.width, device=device)
        values = staging.stack_views(params)
        with torch.no_grad():
            for name, view in layout.stack_views(rows).items():
                view.copy_(values[name], non_blocking=True)
            on_device = {k: b.to(device, non_blocking=True) for k, b in buffers.items()}
        _place(envs, layout.stack_views(rows), on_device, swap=True)
        return cls(
            envs,
            host_settings,
            layout=layout,
            params=rows,
            momentum=torch.zeros_like(rows),
            buffers=on_device,
        )

    # --- governor snapshots --------------------------------------------------------------

    @torch.no_grad()
    def bank(self, rows: np.ndarray) -> Bank:
        """The hosts of these store rows, cloned at once (a snapshot's host part)."""
        index = self.index(rows)
        return Bank(
            rows=rows,
            params=self.params.index_select(0, index),
            buffers={k: b.index_select(0, index) for k, b in self.buffers.items()},
        )

    @torch.no_grad()
    def restore_host(self, row: int, bank: Bank, k: int) -> None:
        """Store row ``row``'s host back to entry ``k`` of ``bank``."""
        self.params[row].copy_(bank.params[k])
        for name, b in self.buffers.items():
            b[row].copy_(bank.buffers[name][k])

    def _memberships(self, model: MorphogeneticModel) -> tuple[Tensor, Tensor]:
        """[S, n_slots] seed columns of each slot, [P, n_slots] host columns of each
        slot's reference segment: per-slot sums of squared gradients as one matmul."""
        by_slot: dict[str, list[tuple[int, int]]] = {s: [] for s in model.slot_ids}
        for (sid, _), seg in self.seeds.segments.items():
            by_slot[sid].append((seg.offset, seg.offset + seg.width))
        host = []
        for slot_id in model.slot_ids:
            prefix = f"segments.{model.positions[slot_id].ref_segment}."
            host.append(
                [
                    (e.offset, e.offset + e.numel)
                    for e in self.params_layout.entries
                    if e.name.startswith(prefix)
                ]
            )
        slot_m = membership(self.seeds.width, [by_slot[s] for s in model.slot_ids])
        host_m = membership(self.params_layout.width, host)
        like = self.params
        return (
            slot_m.to(like.device, like.dtype, non_blocking=True),
            host_m.to(like.device, like.dtype, non_blocking=True),
        )

    def index(self, rows: np.ndarray) -> Tensor:
        """``rows`` as a long tensor on the device (cached: kinds change rarely)."""
        key = rows.astype(np.int64).tobytes()
        found = self.index_cache.get(key)
        if found is None:
            found = torch.from_numpy(rows.astype(np.int64)).to(self.device, non_blocking=True)
            self.index_cache[key] = found
        return found

    def host_parts(self, prefixes: tuple[str, ...]) -> tuple[HostPart, ...]:
        """The host modules a forward calls, in order (by name ``prefixes``), each with
        its columns of the host rows, found once per store. Their columns tile the row
        in that order, so one ``split`` of the rows gives every module its own."""
        found = self._host_parts.get(prefixes)
        if found is None:
            parts, end = [], 0
            for prefix in prefixes:
                lo, layout = self.params_layout.under(prefix)
                if layout.width and lo != end:
                    raise ValueError(f"the host tensors under {prefix!r} are out of order")
                end += layout.width
                parts.append(HostPart(layout, names_under(prefix, self.buffers)))
            if end != self.params_layout.width:
                raise ValueError(f"host tensors outside the modules called ({prefixes})")
            found = self._host_parts[prefixes] = tuple(parts)
        return found

    def alphas(self) -> np.ndarray:
        """Each env's slots' current alphas ([N, n_slots]; 0 where not blended)."""
        return effective_alphas(self.table.slots, self.rows)

    # --- seeds ---------------------------------------------------------------------------

    def segment(self, slot_id: str, blueprint: str) -> Segment:
        return self.seeds.segments[(slot_id, blueprint)]

    @torch.no_grad()
    def adopt_seeds(self, rows: Iterable[int]) -> None:
        """Copy every seed of these envs (store rows) not seen yet into its row of its
        (slot, blueprint) segment."""
        for i in rows:
            env = self.envs[i]
            adopted = self._adopted[i]
            for slot in env.model.slots_in_order:
                slot_id = slot.slot_id
                if slot.seed is None:
                    continue
                held = adopted.get(slot_id)
                if held is not None and held[0] is slot.seed and held[1] == slot.life.seed_id:
                    continue
                seg = self.seeds.segments[(slot_id, slot.life.blueprint)]
                named = list(slot.seed.named_parameters(prefix="seed"))
                lay = seg.seed
                if slot.gate is not None:
                    named += list(slot.gate.named_parameters(prefix="gate"))
                    lay = seg.layout(with_gate=True)
                cols = slice(seg.offset, seg.offset + lay.width)
                tensors = [p for _, p in named]
                self.seed_params[i, cols] = lay.flatten(tensors)
                if any([p in opt.state for opt in env.seed_optimizers.values() for p in tensors]):
                    self.seed_momentum[i, cols] = lay.flatten([_momentum(env, p) for p in tensors])
                else:  # a new seed: no momentum yet
                    self.seed_momentum[i, cols] = 0.0
                _repoint(tensors, lay.row_views(self.seed_params[i, cols]))
                adopted[slot_id] = (slot.seed, slot.life.seed_id)

    def clear_momentum(self, env: EnvState) -> None:
        """A rollback cleared this env's optimizers: no momentum anywhere."""
        row = next(i for i, e in enumerate(self.envs) if e is env)
        self.momentum[row].zero_()
        self.seed_momentum[row].zero_()

    # --- the per-env optimizers' view of the momentum ----------------------------------

    def expose_momentum(self) -> None:
        """Give each env's optimizers their momentum rows as ``momentum_buffer`` views (on
        demand: what a reader of per-env optimizer state, such as a test, calls)."""
        for i, env in enumerate(self.envs):
            state = env.host_optimizer.state
            views = self.params_layout.row_views(self.momentum[i])
            for p, view in zip(env.model.host.parameters(), views, strict=True):
                state[p]["momentum_buffer"] = view
            for slot_id, opt in env.seed_optimizers.items():
                slot = env.model.slot(slot_id)
                if slot.life.stage not in _STEPPED:
                    continue  # a GERMINATED seed is outside the forward: never stepped
                seg = self.segment(slot_id, slot.life.blueprint)
                lay = seg.layout(with_gate=slot.gate is not None)
                cols = self.seed_momentum[i, seg.offset : seg.offset + lay.width]
                params = dict(slot.named_parameters())
                for name, view in zip(lay.names, lay.row_views(cols), strict=True):
                    opt.state[params[name]]["momentum_buffer"] = view


@dataclass(frozen=True)
class Bank:
    """Some rows' hosts, cloned together (store row ``rows[k]`` is entry ``k``)."""

    rows: np.ndarray
    params: Tensor
    buffers: dict[str, Tensor]


@dataclass(frozen=True, eq=False)
class BankSnapshot:
    """The governor snapshots of the envs due at one step in a batched round: their
    hosts as the entries of a :class:`Bank`, and the fossils (identity and weights,
    :func:`esper.model.snapshot.snapshot_fossils`) of the entries with any."""

    store: HostStore
    bank: Bank
    fossils: dict[int, dict[str, Tensor]]

    def restore(self, model: MorphogeneticModel, entry: int) -> None:
        """Put entry ``entry`` (its env's host and fossils) back into ``model``."""
        self.store.restore_host(int(self.bank.rows[entry]), self.bank, entry)
        fossils = self.fossils.get(entry, {})
        restore_fossils(model, {name: t.clone() for name, t in fossils.items()})


def _place(
    envs: Sequence[EnvState],
    params: dict[str, Tensor],
    buffers: dict[str, Tensor],
    *,
    swap: bool,
) -> None:
    """Make env i's host tensors row i of the stacked ``params`` and ``buffers`` views
    (``[N, *shape]`` by name): re-pointed in place, or (``swap``: tensors on the meta
    device, no optimizer holds them yet) replaced by new parameters."""
    for i, env in enumerate(envs):
        for prefix, module in env.model.host.named_modules():
            lead = f"{prefix}." if prefix else ""
            for key, old in list(module._parameters.items()):
                if old is None:
                    continue
                view = params[lead + key][i]
                if swap:
                    module._parameters[key] = nn.Parameter(view, requires_grad=old.requires_grad)
                else:
                    old.data = view
            for key, buf in list(module._buffers.items()):
                if buf is None:
                    continue
                if swap:
                    module._buffers[key] = buffers[lead + key][i]
                else:
                    buf.data = buffers[lead + key][i]


def _momentum(env: EnvState, p: Tensor) -> Tensor:
    """Env's momentum buffer of ``p`` (zeros where it has none: exact with dampening 0)."""
    for opt in (env.host_optimizer, *env.seed_optimizers.values()):
        buf = opt.state.get(p, {}).get("momentum_buffer") if p in opt.state else None
        if isinstance(buf, Tensor):
            return buf.detach()
    return torch.zeros_like(p)


def membership(layout_width: int, groups: Sequence[Sequence[tuple[int, int]]]) -> Tensor:
    """[width, G] 0/1 matrix: column ranges (start, stop) of each group (for per-group
    sums of squares as one matmul)."""
    out = torch.zeros(layout_width, len(groups))
    for g, ranges in enumerate(groups):
        for start, stop in ranges:
            out[start:stop, g] = 1.0
    return out


def clip_coefficients(squares: Tensor, max_norm: float, eps: float) -> Tensor:
    """``clip_grad_norm_``'s coefficient per row from its summed squared gradients."""
    return torch.clamp(max_norm / (squares.sqrt() + eps), max=1.0)
