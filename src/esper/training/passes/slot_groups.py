"""One batched train or evaluation pass for a group of envs: hosts stacked, seeds grouped
per slot.

Why: on a GPU these hosts are launch-bound, so the work of a step must not grow with
the number of envs or parameters. :class:`HostBatch` runs each host segment once,
vmapped over its rows' host parameters (the group's
:class:`~esper.training.passes.host_store.HostStore`), and the segments between two
slots without seeds to run in one call (each vmapped call costs the host Python of its
own, whatever its arithmetic). At each slot it splits the batch only by
that slot's seed kind (blueprint, stage class, blend operator, trainability), read
from the round's slot table for all cells at once (:mod:`seed_kinds`);
runs each kind vmapped over its own rows (every kind's seed tensors gathered with one
index, a slot's rows grouped by kind with one); and puts the activations back in row
order with one. Empty slots and seeds outside the forward (GERMINATED,
cooldown) pass the activation through, as in ``SeedSlot.forward``. Clipping, the SGD
step and gradient norms then run on the stacked gradients: a handful of kernels for all
envs together.

A batch's rows are its envs (training) or (env, configuration) pairs (validation: each
row one alpha configuration of one env, no padding). Per-env semantics as in
:mod:`host_batching`: each env has its own loss, alphas, clip coefficient (host and seed
norms summed per env) and momentum; a seed without an optimizer (a fossil right after a
rollback) contributes to its env's norm but does not step, as with torch's per-env
optimizers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from esper.training.envs.env_state import TRAIN_ACCUM, SgdSettings
from esper.training.passes.batch_ops import PassOptions, autocast, loss_and_correct
from esper.training.passes.flat_layout import FlatLayout, HostPart
from esper.training.passes.host_store import HostStore, clip_coefficients
from esper.training.passes.seed_kinds import group_seeds

#: ``torch.nn.utils.clip_grad_norm_``'s guard against a zero norm (kept identical).
CLIP_EPS = 1e-6


def sgd_settings(opt: torch.optim.Optimizer) -> SgdSettings | None:
    """An optimizer's one SGD group's settings; None if it cannot be batched."""
    if not isinstance(opt, torch.optim.SGD) or len(opt.param_groups) != 1:
        return None
    group = opt.param_groups[0]
    if group["dampening"] or group["nesterov"] or group["maximize"]:
        return None
    return SgdSettings(group["lr"], group["momentum"], group["weight_decay"])


@dataclass(frozen=True)
class _Run:
    """Host modules that run as one vmapped call (``HostBatch._host_runs``)."""

    calls: list[tuple[nn.Module, FlatLayout]]  # each module and its parameters' layout
    widths: list[int]  # each module's columns of the host row
    names: list[dict[str, str]]  # each module's buffers: own name -> full name
    buffers: list[dict[str, Tensor]]  # those of the store (a batch of every env once)
    slot_id: str | None  # the slot after the run, with seed kinds to run (or None)

    @classmethod
    def of(
        cls, modules: Sequence[nn.Module], parts: Sequence[HostPart], slot_id: str | None,
        buffers: dict[str, Tensor],
    ) -> _Run:  # fmt: skip
        return cls(
            calls=[(m, p.layout) for m, p in zip(modules, parts, strict=True)],
            widths=[p.layout.width for p in parts],
            names=[p.buffers for p in parts],
            buffers=[{own: buffers[full] for own, full in p.buffers.items()} for p in parts],
            slot_id=slot_id,
        )


class HostBatch:
    """A batch of rows over one store's envs, for one pass (see the module docstring).

    ``members[r]``: the store row (env) of batch row r, default every env once, in
    order; ``alphas[r]``: row r's alpha per slot (default each env's current ones).
    ``train=False`` evaluates (under ``torch.no_grad``): TRAINING seeds pass through,
    as they do without gradients.
    """

    def __init__(
        self,
        store: HostStore,
        *,
        train: bool = True,
        members: np.ndarray | None = None,
        alphas: np.ndarray | None = None,
    ) -> None:
        self.store = store
        self.train = train
        self.envs = store.envs
        self.model = store.envs[0].model
        #: Whose modules run the pass's code: the first env's in training, the last's in
        #: evaluation, so each keeps its mode across passes (:meth:`set_modes`).
        self.template = self.envs[0 if train else -1].model
        self.device = store.device
        self.members = np.arange(len(self.envs)) if members is None else members
        # Each env once, in order (the store itself), or the rows gathered by one index.
        self._member_index = None if members is None else store.index(self.members)
        if alphas is None:
            alphas = store.alphas()[self.members]
        self.alphas = torch.from_numpy(alphas.astype(np.float32)).to(self.device, non_blocking=True)
        # The seed kinds at each slot (the last such pass's kinds reused where they
        # hold) and the indices that move their rows and tensors.
        previous = store.kinds_seen.get(train, {})
        self.kinds, self.plan, store.kinds_seen[train] = group_seeds(
            store, self.members, train=train, previous=previous
        )
        self.host_settings = store.host_settings
        self.slot_at = {self.model.positions[s].segment: s for s in self.model.slot_ids}
        self._runs: list[_Run] | None = None
        self._run_widths: list[int] = []
        self._loss = torch.vmap(loss_and_correct)
        self.accum = torch.zeros(len(self.members), TRAIN_ACCUM.width, device=self.device)
        #: Every kind's seed tensors as one flat tensor (a leaf when seeds train), and
        #: each kind's piece of it (:meth:`_gather_seeds`).
        self.seed_leaf: Tensor | None = None
        self.pieces: tuple[Tensor, ...] | None = None
        self.grad_norms: Tensor | None = None
        #: The last batch's clipped gradients: host [N, P] and seeds [N, S] (or None).
        self.last_grads: tuple[Tensor, Tensor | None] | None = None

    # --- forward ---------------------------------------------------------------------

    def _gather_seeds(self) -> None:
        """Every kind's seed tensors with one index, as one flat tensor (a leaf when
        seeds train) split into the kinds' pieces."""
        flat = self.store.seed_params.view(-1).index_select(0, self.plan.gather)
        if self.plan.trained:
            flat.requires_grad_()
        self.seed_leaf = flat
        self.pieces = torch.split(flat, self.plan.sizes)

    def forward(self, x: Tensor, host: Tensor | None = None) -> Tensor:
        """Logits [R, B, ...] of every row for inputs x [R, B, ...] at the rows' alphas;
        ``host`` is the stacked host parameters to differentiate (default: the store's,
        gathered for the rows)."""
        if self.pieces is None:
            self._gather_seeds()
        store = self.store
        if host is None:
            host = store.params
            if self._member_index is not None:
                host = host.index_select(0, self._member_index)
        runs = self._host_runs()
        if self._member_index is not None:  # the rows' own buffers, gathered
            index = self._member_index
            gathered = {k: b.index_select(0, index) for k, b in store.buffers.items()}
        h = x
        # One split of the host rows (its gradient: one cat), one columns block per run.
        for run, cols in zip(runs, torch.split(host, self._run_widths, dim=1), strict=True):
            bufs = run.buffers
            if self._member_index is not None:
                bufs = [{own: gathered[full] for own, full in b.items()} for b in run.names]
            h = _vmapped(run.calls, run.widths, cols, bufs, h)
            if run.slot_id is not None:
                h = self._slot(run.slot_id, h)
        return h

    def _host_runs(self) -> list[_Run]:
        """The host modules in runs that each run as one vmapped call: a run ends where
        a slot after it has seed kinds to run (elsewhere the activation passes through,
        so the next module follows in the same call). Made once per batch."""
        if self._runs is None:
            host = self.template.host
            modules = (host.stem, *host.segments, host.head)
            parts = self.store.host_parts(_host_prefixes(len(host.segments)))
            # Module i is followed by the slot of segment i - 1, if any (none after the head).
            after = [self.slot_at.get(i - 1) for i in range(len(modules) - 1)] + [None]
            cuts = [i + 1 for i, slot_id in enumerate(after) if slot_id and self.kinds[slot_id]]
            bounds = (0, *cuts, len(modules))
            # The same cuts recur from pass to pass: their runs are kept on the store.
            found = self.store.runs_seen.get((self.train, bounds))
            if found is None:
                runs = [
                    _Run.of(modules[a:b], parts[a:b], after[b - 1], self.store.buffers)
                    for a, b in itertools.pairwise(bounds)
                ]
                found = self.store.runs_seen[(self.train, bounds)] = (
                    runs,
                    [sum(r.widths) for r in runs],
                )
            self._runs, self._run_widths = found
        return self._runs

    def _slot(self, slot_id: str, h: Tensor) -> Tensor:
        """Each seed kind at the slot on its rows: the kinds' rows taken with one index,
        kind after kind, each kind's a slice, and put back with one (no regrouping where
        one kind runs on every row; other rows pass through)."""
        kinds = self.kinds[slot_id]
        if not kinds:
            return h
        column = self.alphas[:, self.model.slot_ids.index(slot_id)]  # [R]: one per row
        order = self.plan.order.get(slot_id)
        rows: tuple[Tensor, ...] = (h,)
        alphas: tuple[Tensor, ...] = (column,)
        if order is not None:
            index, sizes = order
            rows = torch.split(h.index_select(0, index), sizes)
            alphas = torch.split(column.index_select(0, index), sizes)
        assert self.pieces is not None
        parts = []
        for i, kind in enumerate(kinds):
            # The kind's piece of the gathered seeds, detached if it does not train
            # (its tensors get no gradient, as without the batch).
            seeds = self.pieces[self.plan.first[slot_id] + i]
            seeds = seeds.view(len(kind.rows), kind.layout.width)
            if self.train and not kind.trainable:
                seeds = seeds.detach()
            calls, widths = [(kind.module, kind.layout)], [kind.layout.width]
            parts.append(_vmapped(calls, widths, seeds, [{}], rows[i], alphas[i]))
        if order is None:
            return parts[0]
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return h.index_copy(0, order[0], out.to(h.dtype))

    def set_modes(self) -> None:
        """Train or eval mode on the modules whose code runs (the batch's templates).

        Training and evaluation take their templates from different envs (the first
        and the last of a kind or a store), so a template's mode mostly stays as the
        last such pass left it and is only checked here: a module's mode is set on the
        whole tree at once (``nn.Module.train``, and a new seed takes its slot's), so a
        tree's root says the mode of all of it."""
        if self.template.host.training != self.train:
            self.template.host.train(self.train)
        for kinds in self.kinds.values():
            for kind in kinds:
                if kind.module.training != self.train:
                    kind.module.train(self.train)

    # --- training ----------------------------------------------------------------------

    def train_batch(
        self, x: Tensor, y: Tensor, opts: PassOptions, nan_mask: Tensor | None, *, last: bool
    ) -> None:
        """Forward and backward of every env, per-env clip, one SGD step; ``last``: also
        measure the gradient norms the per-env path takes after its epoch's last batch."""
        self._gather_seeds()
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
        """The trainable kinds' gradients in their rows and columns of a [N, S] tensor
        (one index for all kinds; zeros elsewhere), or None if no seed trains."""
        leaf = self.seed_leaf
        if leaf is None or leaf.grad is None:
            return None
        grads = torch.zeros_like(self.store.seed_params)
        grads.view(-1).index_copy_(0, self.plan.gather, leaf.grad)
        return grads

    def _seed_sgd(self, grads: Tensor) -> None:
        """SGD on the stepping seeds' tensors only: taken out of the store with one
        index, stepped, put back with one (the store's other columns are other
        blueprints' segments or seeds that do not step, and stay as they are)."""
        at = self.plan.stepping
        if at is None:
            return
        s = self.store.seed_settings
        params, momentum = self.store.seed_params.view(-1), self.store.seed_momentum.view(-1)
        step = grads.view(-1).index_select(0, at)
        if s.weight_decay != 0:
            step = step + params.index_select(0, at) * s.weight_decay
        if s.momentum != 0:
            step = momentum.index_select(0, at).mul_(s.momentum).add_(step)
            momentum.index_copy_(0, at, step)
        params.index_copy_(0, at, params.index_select(0, at).add_(step * -s.lr))

    def _grad_norms(self, host_sq: Tensor, seed_sq: Tensor | None, coef: Tensor) -> Tensor:
        """[N, n_slots, 2]: per slot [seed norm, host norm at the slot] of the clipped
        gradients (``MorphogeneticModel.grad_norms``), from the squares already taken."""
        store = self.store
        host = host_sq @ store.host_ref_membership
        seed = host.new_zeros(host.shape) if seed_sq is None else seed_sq @ store.slot_membership
        norms = torch.stack([seed, host], dim=2).sqrt() * coef[:, None, None]
        return norms.float()

    # --- after the epoch ---------------------------------------------------------------

    def expose_grads(self) -> None:
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
                for row in kind.store_rows:  # numpy: no device sync
                    slot = self.envs[row].model.slot(kind.slot_id)
                    params = dict(slot.named_parameters())
                    cols = seed_grad[row, kind.offset : kind.offset + kind.layout.width]
                    for name, view in zip(
                        kind.layout.names, kind.layout.row_views(cols), strict=True
                    ):
                        params[name].grad = view


def _host_prefixes(n_segments: int) -> tuple[str, ...]:
    """The host modules a forward calls, in order: stem, segments, head."""
    return ("stem.", *[f"segments.{i}." for i in range(n_segments)], "head.")


def _vmapped(
    calls: Sequence[tuple[nn.Module, FlatLayout]], widths: list[int], flat: Tensor,
    buffers: Sequence[dict[str, Tensor]], h: Tensor, *extra: Tensor,
) -> Tensor:  # fmt: skip
    """Modules called one after the other (``calls``: each with its parameters' layout),
    vmapped over rows of their flat parameters ``[R, widths summed]``, stacked buffers
    (one dict per module) and inputs (dim 0). The parameters enter vmap as one tensor
    and are unpacked into each module's tensors inside it, and a run of modules is one
    call: vmap's per-call and per-input work (flattening, batching each input, moving
    the batch dimension back) is done once, not once per module and tensor; ``widths``:
    each module's columns. The buffers enter as plain arguments, their dicts made inside:
    vmap flattens a list of dicts in Python, container by container (5-9 us per
    module on a 2-core EPYC, an empty dict included)."""
    tensors = itertools.chain.from_iterable(map(dict.values, buffers))
    ends = list(itertools.accumulate(map(len, buffers), initial=len(extra)))
    # Each module's buffer names and where its tensors are among vmap's arguments.
    own = list(zip(map(tuple, buffers), ends, ends[1:], strict=False))

    def one(row: Tensor, z: Tensor, *rest: Tensor) -> Tensor:
        e = rest[: len(extra)]
        pieces = torch.split(row, widths) if len(calls) > 1 else (row,)
        for (module, layout), piece, (keys, a, b) in zip(calls, pieces, own, strict=True):
            p = dict(zip(layout.names, layout.row_views(piece), strict=True))
            bufs = dict(zip(keys, rest[a:b], strict=True))
            z = functional_call(module, (p, bufs), (z, *e), tie_weights=layout.tied)
        return z

    out: Tensor = torch.vmap(one)(flat, h, *extra, *tensors)
    return out
