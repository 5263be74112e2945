"""One batched train or evaluation pass for every env on a device: hosts stacked, seeds
grouped per slot.

Why: on a GPU these hosts are launch-bound, so the work of a step must not grow with
the number of envs or parameters. :class:`HostBatch` runs each host segment once,
vmapped over every env's host parameters (views of the group's
:class:`~esper.training.host_store.HostStore`). At each slot it splits the batch only by
that slot's seed kind (blueprint, stage class, blend operator, trainability, SGD
settings), runs each kind vmapped over its own envs (their rows of the seed store,
gathered with one index), and puts the activations back in env order. Empty slots and
seeds outside the forward (GERMINATED, cooldown) pass the activation through, as in
``SeedSlot.forward``. Clipping, the SGD step and gradient norms then run on the stacked
gradients: a handful of kernels for all envs together.

Per-env semantics as in :mod:`host_batching`: each env has its own loss, alphas, clip
coefficient (host and seed norms summed per env) and momentum; a seed without an
optimizer (a fossil right after a rollback) contributes to its env's norm but does not
step, as with torch's per-env optimizers.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call

from esper.core.enums import SeedStage, Topology
from esper.model.lifecycle import BLENDED_STAGES
from esper.model.slot import SeedSlot
from esper.training.batch_ops import PassOptions, autocast, loss_and_correct
from esper.training.env_state import TRAIN_ACCUM, EnvState
from esper.training.host_store import FlatLayout, HostStore, clip_coefficients

#: ``torch.nn.utils.clip_grad_norm_``'s guard against a zero norm (kept identical).
CLIP_EPS = 1e-6


@dataclass(frozen=True)
class SgdSettings:
    """What a parameter's SGD step needs (dampening 0, no Nesterov: the env factory's)."""

    lr: float
    momentum: float
    weight_decay: float


def sgd_owners(env: EnvState) -> dict[int, tuple[torch.optim.SGD, SgdSettings]] | None:
    """Parameter id -> (optimizer, settings); None if an optimizer cannot be batched."""
    owners: dict[int, tuple[torch.optim.SGD, SgdSettings]] = {}
    for opt in (env.host_optimizer, *env.seed_optimizers.values()):
        if not isinstance(opt, torch.optim.SGD):
            return None
        for group in opt.param_groups:
            if group["dampening"] or group["nesterov"] or group["maximize"]:
                return None
            settings = SgdSettings(group["lr"], group["momentum"], group["weight_decay"])
            for p in group["params"]:
                owners[id(p)] = (opt, settings)
    return owners


def _in_forward(slot: SeedSlot, train: bool) -> bool:
    """Whether the slot's seed runs in the forward (``SeedSlot.forward``): a TRAINING
    seed only where gradients flow (its straight-through output is exactly the input)."""
    stage = slot.life.stage
    if slot.seed is None:
        return False
    return stage in BLENDED_STAGES or (train and stage == SeedStage.TRAINING)


def host_key(env: EnvState) -> Hashable | None:
    """Envs with equal keys share one batched host graph; None: only per env."""
    owners = sgd_owners(env)  # seed optimizers come and go: checked every time
    if env.scaler is not None or owners is None or env.model.topology != Topology.CNN:
        return None  # see host_batching.structure_key for each reason
    if env.host_signature is None:
        env.host_signature = (_host_signature(env, owners),)
    return env.host_signature[0]


def _host_signature(
    env: EnvState, owners: dict[int, tuple[torch.optim.SGD, SgdSettings]]
) -> Hashable | None:
    """The host part of :func:`host_key`: shapes, dtypes, SGD settings, buffers, slots."""
    host = env.model.host
    params = tuple(
        (n, tuple(p.shape), p.dtype, p.requires_grad, owners.get(id(p), (None, None))[1])
        for n, p in host.named_parameters()
    )
    if len({settings for *_, settings in params}) != 1 or not all(p[3] for p in params):
        return None  # the stacked host steps as one trainable SGD group
    buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in host.named_buffers())
    return (str(env.device), env.model.slot_ids, params, buffers)


@dataclass(frozen=True)
class _Kind:
    """The envs (rows) of one seed kind at one slot, and where their tensors live."""

    slot_id: str
    rows: tuple[int, ...]
    index: Tensor  # ``rows`` on the device
    module: SeedSlot  # the forward code (a member's slot)
    layout: FlatLayout  # the kind's tensors, relative to ``offset`` in the seed store
    offset: int
    trainable: bool
    settings: SgdSettings | None  # None: some tensor has no optimizer (does not step)


class HostBatch:
    """Envs with one :func:`host_key`, for one pass (see the module docstring).

    ``train=False`` evaluates (under ``torch.no_grad``, models in eval mode): TRAINING
    seeds pass through, as they do without gradients.
    """

    def __init__(self, envs: Sequence[EnvState], *, train: bool = True) -> None:
        self.envs = list(envs)
        self.train = train
        self.store = HostStore.for_envs(envs)
        self.store.adopt_seeds()
        self.model = envs[0].model
        self.device = envs[0].device
        owners = [sgd_owners(e) for e in envs]
        self.kinds: dict[str, list[_Kind]] = {
            slot_id: self._kinds_at(slot_id, owners) for slot_id in self.model.slot_ids
        }
        first = next(iter(envs[0].model.host.parameters()))
        owner0 = owners[0]
        assert owner0 is not None, "host_key admits only batchable optimizers"
        self.host_settings = owner0[id(first)][1]
        alphas = [e.model.alpha_values() for e in envs]
        self.alphas = torch.tensor(alphas).to(self.device, non_blocking=True)  # [N, n_slots]
        self.slot_at = {self.model.positions[s].segment: s for s in self.model.slot_ids}
        self._loss = torch.vmap(loss_and_correct)
        self.accum = torch.zeros(len(envs), TRAIN_ACCUM.width, device=self.device)
        self.leaves: dict[int, Tensor] = {}
        self.grad_norms: Tensor | None = None
        #: The last batch's clipped gradients: host [N, P] and seeds [N, S] (or None).
        self.last_grads: tuple[Tensor, Tensor | None] | None = None

    # --- grouping --------------------------------------------------------------------

    def _kinds_at(
        self, slot_id: str, owners: list[dict[int, tuple[torch.optim.SGD, SgdSettings]] | None]
    ) -> list[_Kind]:
        by_kind: dict[Hashable, list[int]] = {}
        for i, env in enumerate(self.envs):
            slot = env.model.slot(slot_id)
            if not _in_forward(slot, self.train):
                continue
            owner = owners[i]
            assert owner is not None
            by_kind.setdefault(self._kind_key(slot, owner), []).append(i)
        kinds = []
        for rows in by_kind.values():
            slot = self.envs[rows[0]].model.slot(slot_id)
            seg = self.store.segment(slot_id, slot.life.blueprint)
            with_gate = slot.gate is not None and slot.life.stage != SeedStage.TRAINING
            owner = owners[rows[0]]
            assert owner is not None
            found = [owner.get(id(p)) for p in slot.parameters()]
            settings = {f[1] for f in found if f is not None}
            kinds.append(
                _Kind(
                    slot_id=slot_id,
                    rows=tuple(rows),
                    index=self._index(rows),
                    module=slot,
                    layout=seg.layout(with_gate),
                    offset=seg.offset,
                    trainable=all(p.requires_grad for p in slot.parameters()),
                    settings=settings.pop() if len(settings) == 1 and None not in found else None,
                )
            )
        return kinds

    def _kind_key(
        self, slot: SeedSlot, owner: dict[int, tuple[torch.optim.SGD, SgdSettings]]
    ) -> Hashable:
        params = tuple(
            (n, p.requires_grad, owner.get(id(p), (None, None))[1])
            for n, p in slot.named_parameters()
        )
        stage = "train" if slot.life.stage == SeedStage.TRAINING else "blend"
        return (slot.life.blueprint, stage, slot.life.blend_op, params)

    def _index(self, rows: Sequence[int]) -> Tensor:
        cache = self.store.index_cache
        key = tuple(rows)
        if key not in cache:
            cache[key] = torch.tensor(key).to(self.device, non_blocking=True)
        return cache[key]

    # --- forward ---------------------------------------------------------------------

    def _gather_leaves(self) -> None:
        """Each kind's seed tensors as one [n_kind, width] tensor (a leaf when it trains)."""
        self.leaves = {}
        n = len(self.envs)
        for kinds in self.kinds.values():
            for kind in kinds:
                cols = self.store.seed_params[:, kind.offset : kind.offset + kind.layout.width]
                leaf = cols.detach() if len(kind.rows) == n else cols.index_select(0, kind.index)
                if self.train and kind.trainable:
                    leaf = leaf.detach().requires_grad_()
                self.leaves[id(kind)] = leaf

    def forward(
        self, x: Tensor, alphas: Tensor | None = None, host: Tensor | None = None
    ) -> Tensor:
        """Logits [N, B, ...] of every env for inputs x [N, B, ...]; ``alphas``
        [N, B, n_slots] forces per-sample alphas (else each env's current ones);
        ``host`` is the stacked host parameters to differentiate (default: the store)."""
        if not self.leaves:
            self._gather_leaves()
        store = self.store
        params = store.params_layout.stack_views(store.params if host is None else host)
        buffers = store.buffers
        host_net = self.model.host
        h = self._call_host(host_net.stem, "stem.", params, buffers, x)
        for i, segment in enumerate(host_net.segments):
            h = self._call_host(segment, f"segments.{i}.", params, buffers, h)
            slot_id = self.slot_at.get(i)
            if slot_id is not None:
                h = self._slot(slot_id, h, alphas)
        return self._call_host(host_net.head, "head.", params, buffers, h)

    def _call_host(
        self, module: nn.Module, prefix: str, params: dict[str, Tensor],
        buffers: dict[str, Tensor], h: Tensor,
    ) -> Tensor:  # fmt: skip
        cut = len(prefix)
        own = {k[cut:]: v for k, v in params.items() if k.startswith(prefix)}
        bufs = {k[cut:]: v for k, v in buffers.items() if k.startswith(prefix)}
        return _vmapped(module, own, bufs, h)

    def _slot(self, slot_id: str, h: Tensor, alphas: Tensor | None) -> Tensor:
        kinds = self.kinds[slot_id]
        if not kinds:
            return h
        col = self.model.slot_ids.index(slot_id)
        if alphas is None:
            column = self.alphas[:, col]  # [N]: one alpha per env
        else:  # [N, B]: per sample, shaped to broadcast over each sample's activation
            column = alphas[:, :, col].reshape(alphas.shape[:2] + (1,) * (h.dim() - 2))
        everyone = len(kinds) == 1 and len(kinds[0].rows) == len(self.envs)
        out = h
        for kind in kinds:
            params = kind.layout.stack_views(self.leaves[id(kind)])
            if everyone:  # every env runs the same seed kind here: no gather, no scatter
                return _vmapped(kind.module, params, {}, h, column)
            alpha = column.index_select(0, kind.index)
            part = _vmapped(kind.module, params, {}, h.index_select(0, kind.index), alpha)
            out = out.index_copy(0, kind.index, part.to(out.dtype))
        return out

    # --- training ----------------------------------------------------------------------

    def train_batch(
        self, x: Tensor, y: Tensor, opts: PassOptions, nan_mask: Tensor | None, *, last: bool
    ) -> None:
        """Forward and backward of every env, per-env clip, one SGD step; ``last``: also
        measure the gradient norms the per-env path takes after its epoch's last batch."""
        self._gather_leaves()
        host = self.store.params.detach().requires_grad_()
        with autocast(self.device, opts.amp):
            logits = self.forward(x, host=host)
            losses, correct = self._loss(logits, y)
        if nan_mask is not None:
            losses = losses * nan_mask
        losses.sum().backward()  # type: ignore[no-untyped-call]
        assert host.grad is not None
        self._step(host.grad, opts.grad_clip, last=last)
        n = float(y[0].numel())
        sums = torch.stack(
            [losses.detach().float() * n, correct.float(), torch.full_like(losses, n)]
        )
        self.accum += sums.T

    @torch.no_grad()
    def _step(self, host_grad: Tensor, max_norm: float, *, last: bool) -> None:
        """Clip each env's gradients (host and seeds) by its own norm, then SGD."""
        seed_grad = self._seed_grads()
        host_sq = host_grad.square()
        squares = host_sq.sum(dim=1)
        seed_sq = None
        if seed_grad is not None:
            seed_sq = seed_grad.square()
            squares = squares + seed_sq.sum(dim=1)
        coef = clip_coefficients(squares, max_norm, CLIP_EPS)
        host_grad.mul_(coef[:, None])
        if seed_grad is not None:
            seed_grad.mul_(coef[:, None])
        if last:
            self.grad_norms = self._grad_norms(host_sq, seed_sq, coef)
            self.last_grads = (host_grad, seed_grad)
        store, s = self.store, self.host_settings
        step = host_grad
        if s.weight_decay != 0:
            step = torch.add(host_grad, store.params, alpha=s.weight_decay)
        if s.momentum != 0:
            store.momentum.mul_(s.momentum).add_(step)
            step = store.momentum
        store.params.add_(step, alpha=-s.lr)
        if seed_grad is not None:
            self._seed_sgd(seed_grad)

    def _seed_grads(self) -> Tensor | None:
        """Every trainable kind's gradient in its rows and columns of a [N, S] tensor."""
        trained = [k for kinds in self.kinds.values() for k in kinds if k.trainable]
        if not trained:
            return None
        grads = torch.zeros_like(self.store.seed_params)
        for kind in trained:
            grad = self.leaves[id(kind)].grad
            if grad is None:
                continue
            cols = grads[:, kind.offset : kind.offset + kind.layout.width]
            if len(kind.rows) == len(self.envs):
                cols.copy_(grad)
            else:
                cols.index_copy_(0, kind.index, grad)
        return grads

    def _seed_sgd(self, grads: Tensor) -> None:
        """SGD on the rows and columns of stepping seeds only (masked, per settings)."""
        store = self.store
        for settings, (mask, decay) in self._seed_masks().items():
            step = grads
            if settings.weight_decay != 0:
                step = torch.addcmul(grads, store.seed_params, mask, value=settings.weight_decay)
            if settings.momentum != 0:
                store.seed_momentum.mul_(decay).addcmul_(step, mask)
                step = store.seed_momentum
            store.seed_params.addcmul_(step, mask, value=-settings.lr)

    def _seed_masks(self) -> dict[SgdSettings, tuple[Tensor, Tensor]]:
        """Per settings, the 0/1 mask of stepping seed tensors and the momentum factor
        (settings.momentum there, 1 elsewhere), as [N, S]: built on the host per
        (env, segment part) and expanded on the device with one index (two kernels
        however many kinds), and cached while the kinds stay the same."""
        stepping = [k for kinds in self.kinds.values() for k in kinds if k.trainable and k.settings]
        key = tuple((k.settings, k.offset, k.layout.width, k.rows) for k in stepping)
        cached: dict[SgdSettings, tuple[Tensor, Tensor]] | None = self.store.mask_cache.get(key)
        if cached is not None:
            return cached
        store = self.store
        masks: dict[SgdSettings, tuple[Tensor, Tensor]] = {}
        for settings in dict.fromkeys(k.settings for k in stepping):
            assert settings is not None
            table = [[0.0] * store.n_parts for _ in self.envs]
            decay = [[1.0] * store.n_parts for _ in self.envs]
            for k in stepping:
                if k.settings == settings:
                    for part in store.parts_of(k.offset, k.layout.width):
                        for row in k.rows:
                            table[row][part], decay[row][part] = 1.0, settings.momentum
            both = torch.tensor([table, decay], dtype=store.params.dtype)
            both = both.to(self.device, non_blocking=True)
            mask, factor = both.index_select(2, store.column_part).unbind(0)
            masks[settings] = (mask, factor)
        store.mask_cache = {key: masks}  # the kinds change rarely: keep the last only
        return masks

    def _grad_norms(self, host_sq: Tensor, seed_sq: Tensor | None, coef: Tensor) -> Tensor:
        """[N, n_slots, 2]: per slot [seed norm, host norm at the slot] of the clipped
        gradients (``MorphogeneticModel.grad_norms``), from the squares already taken."""
        store = self.store
        host = host_sq @ store.host_ref_membership
        seed = host.new_zeros(host.shape) if seed_sq is None else seed_sq @ store.slot_membership
        norms = torch.stack([seed, host], dim=2).sqrt() * coef[:, None, None]
        return norms.float()

    # --- after the epoch ---------------------------------------------------------------

    def finish(self, *, expose_grads: bool = False) -> None:
        """Per env: train sums, gradient norms and the momentum buffers, as views of the
        stacked tensors; the last batch's gradients too when ``expose_grads``."""
        self.store.expose_host_momentum()
        for kinds in self.kinds.values():
            for kind in kinds:
                if kind.trainable and kind.settings is not None:
                    for row in kind.rows:
                        self.store.expose_seed_momentum(row, kind.slot_id, kind.layout, kind.offset)
        norms = self.grad_norms
        for i, env in enumerate(self.envs):
            env.train_accum = self.accum[i]
            if norms is not None:
                env.last_grad_norms = norms[i]
        if expose_grads:
            self._expose_grads()

    def _expose_grads(self) -> None:
        """Each env's parameters get their last-batch gradient (views), as after a
        per-env epoch; tensors outside the forward get none (debug layer statistics)."""
        if self.last_grads is None:
            return
        host_grad, seed_grad = self.last_grads
        for i, env in enumerate(self.envs):
            for p in env.model.parameters():
                p.grad = None
            views = self.store.params_layout.row_views(host_grad[i])
            for p, view in zip(env.model.host.parameters(), views, strict=True):
                p.grad = view
        if seed_grad is None:
            return
        for kinds in self.kinds.values():
            for kind in kinds:
                if not kind.trainable:
                    continue
                for row in kind.rows:
                    slot = self.envs[row].model.slot(kind.slot_id)
                    params = dict(slot.named_parameters())
                    cols = seed_grad[row, kind.offset : kind.offset + kind.layout.width]
                    for name, view in zip(
                        kind.layout.names, kind.layout.row_views(cols), strict=True
                    ):
                        params[name].grad = view


def _vmapped(
    module: nn.Module, params: dict[str, Tensor], buffers: dict[str, Tensor], h: Tensor,
    *extra: Tensor,
) -> Tensor:  # fmt: skip
    """``module`` vmapped over stacked parameters, buffers and inputs (dim 0)."""

    def one(p: dict[str, Tensor], b: dict[str, Tensor], z: Tensor, *e: Tensor) -> Tensor:
        out: Tensor = functional_call(module, (p, b), (z, *e))
        return out

    out: Tensor = torch.vmap(one)(params, buffers, h, *extra)
    return out
