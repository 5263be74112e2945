"""Batched host passes (``run.batch_envs``): the epoch's train pass and validation.

Why: a host is a few thousand parameters, so on a GPU the per-env loop is bound by
kernel launches and Python, not arithmetic.

- The round's envs are grouped once, when the round's first pass runs: the envs of one
  device and one host shape (a host family's member) share a
  :class:`~esper.training.passes.host_store.HostStore` for the round. A round whose hosts
  cannot be stacked (fp16's GradScaler, transformer hosts: attention has no ``vmap``
  rule on CPU, an optimizer other than plain SGD) runs the per-env passes instead.
- Train: each group trains as one :class:`slot_groups.HostBatch`: hosts stacked and
  vmapped, seeds grouped per slot from the round's slot table.
- Validation: each group evaluates every (env, configuration) row as one
  :class:`slot_groups.HostBatch` row (no padding: an env with K configurations has K
  rows), the blended seeds grouped per slot (TRAINING seeds pass through without
  gradients).

Each env's ``nn.Module`` stays usable: its tensors are views of the group's store, so
lifecycle operations, snapshots, rollbacks and gradient metrics see ordinary per-env
modules, and nothing is copied in or out per epoch. A seed is adopted into the store
when its env's structure changed (the table's ``unadopted`` rows), not by scanning.

Per-env semantics kept: each env has its own loss, clip coefficient and momentum; its
alphas are a per-row input (the forced-alpha path, equal to the controller's); TRAINING
seeds stay isolated (the same forward code runs); a NaN loss poisons only its own
env's rows. Results equal the per-env path up to float summation order (grouped
convolution kernels, one norm over all of an env's gradients);
tests/training/test_host_batching.py holds the two together.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from esper.core.enums import SeedStage, Topology
from esper.model.slot_table import STAGE_CODE
from esper.model.snapshot import snapshot_fossils
from esper.training.envs.env_state import EnvState, SgdSettings, host_sgd
from esper.training.passes.batch_ops import (
    PassOptions,
    autocast,
    train_epoch,
    validate_fused,
)
from esper.training.passes.host_store import BankSnapshot, HostStore
from esper.training.passes.slot_groups import HostBatch, sgd_settings

Batch = tuple[Tensor, Tensor]
_FOSSILIZED = STAGE_CODE[SeedStage.FOSSILIZED]
IMAGE_DIMS = 4
#: A batch for every env at once: inputs [N, B, ...] and targets [N, B] (the iterator's
#: ``epoch_stacked``).
Batches = tuple[Tensor, Tensor]
#: Most elements one activation of the stacked validation may hold (rows x samples x
#: the widest layer per sample); a validation batch past it runs in chunks of
#: samples. cuDNN indexes with 32 bits: on an H200 the stacked validation failed with
#: CUDNN_STATUS_NOT_SUPPORTED at 288 rows of 1,000 samples (2.36 billion elements in
#: one activation) and ran at 94 rows (770 million). Half of 2^31 leaves room for a
#: seed wider than the layer measured and bounds one activation to 4 GiB (float32).
MAX_VALIDATION_ELEMENTS = 2**30


def batchable(env: EnvState) -> SgdSettings | None:
    """The host's SGD settings if its round can run batched (every env of a round has
    the same optimizers, scaler and topology), else None."""
    if env.scaler is not None or env.model.topology != Topology.CNN:
        return None  # GradScaler's per-optimizer inf checks; attention has no vmap rule
    settings = sgd_settings(env.host_optimizer)
    if settings is None or not all(p.requires_grad for p in env.model.host.parameters()):
        return None
    return settings


def _groups(envs: Sequence[EnvState]) -> list[list[int]]:
    """Positions of the envs of each group: one device and one host member."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, env in enumerate(envs):
        member = env.host.name if env.host is not None else ""
        groups.setdefault((str(env.device), member), []).append(i)
    return list(groups.values())


def round_stores(envs: Sequence[EnvState]) -> list[HostStore] | None:
    """The stores of the round's groups (made with the round, or at its first pass from
    the envs' modules; kept on its table), or None: the round runs per env."""
    table = envs[0].table
    key = len(envs)
    if table.stores is not None and table.stores[0] == key:
        kept: list[HostStore] | None = table.stores[1]
        return kept
    settings = batchable(envs[0])
    stores = None
    if settings is not None:
        stores = [HostStore.of_envs([envs[i] for i in g], settings) for g in _groups(envs)]
    table.stores = (key, stores)
    return stores


def make_stores(
    envs: Sequence[EnvState], seeds: Sequence[int], *, channels_last: bool
) -> list[HostStore]:
    """A new round's stores, the hosts (on the meta device) initialised straight into
    them from their seeds (:meth:`HostStore.initialise`); kept on the round's table."""
    settings = host_sgd(envs[0].host_cfg)
    stores = [
        HostStore.initialise(
            [envs[i] for i in g], settings, [seeds[i] for i in g], channels_last=channels_last
        )
        for g in _groups(envs)
    ]
    envs[0].table.stores = (len(envs), stores)
    return stores


def snapshot_rows(store: HostStore, rows: np.ndarray, *, step: int) -> None:
    """The governor snapshots of these store rows' envs, their hosts cloned at once and
    kept as one object for all of them (a fossil's weights and identity per env that has
    one: Python runs only for those)."""
    at = store.rows[rows]  # their table rows
    table = store.table
    fossil = np.flatnonzero((table.slots.stage[at] == _FOSSILIZED).any(axis=1))
    fossils = {k: snapshot_fossils(store.envs[rows[k]].model) for k in fossil.tolist()}
    table.guard.keep(at, step, BankSnapshot(store, store.bank(rows), fossils))


def _adopt(store: HostStore) -> None:
    """Adopt the seeds of the store's envs whose structure changed since the last pass."""
    table = store.table
    pending = [store.local[row] for row in sorted(table.unadopted) if row in store.local]
    if pending:
        store.adopt_seeds(pending)
    table.unadopted.difference_update(store.local)


def nan_mask(store: HostStore, nan_envs: frozenset[int]) -> Tensor | None:
    """Loss multipliers: NaN for envs with an injected fault, else 1 (None: no fault)."""
    hit = np.isin(store.indices, np.fromiter(nan_envs, dtype=np.int64, count=len(nan_envs)))
    if not hit.any():
        return None
    values = np.where(hit, math.nan, 1.0).astype(np.float32)
    return torch.from_numpy(values).to(store.device, non_blocking=True)


def _rows(batch: Batches, store: HostStore, n: int) -> tuple[Tensor, Tensor]:
    """The store's envs' inputs and targets stacked [n_store, B, ...]."""
    x, y = batch
    if len(store.envs) == n:
        return x, y
    index = store.index(store.rows)
    return x.index_select(0, index), y.index_select(0, index)


def train_epoch_batched(
    envs: Sequence[EnvState],
    batches: Iterable[Batches],
    opts: PassOptions,
    *,
    nan_envs: frozenset[int] = frozenset(),
    expose_grads: bool = False,
) -> tuple[Tensor, Tensor]:
    """:func:`batch_ops.train_epoch` (same results: train sums ``[N, 3]``, gradient norms
    ``[N, S, 2]``) with each group of the round trained as one
    :class:`slot_groups.HostBatch`. ``envs`` are the round's envs, in row order.
    ``expose_grads``: give every env's parameters their last gradients (debug layer
    statistics read them)."""
    steps = list(batches)
    stores = round_stores(envs)
    if stores is None:
        per_env = [[(x[i], y[i]) for i in range(len(envs))] for x, y in steps]
        return train_epoch(envs, per_env, opts, nan_envs=nan_envs)
    results = []
    for store in stores:
        _adopt(store)
        batch = HostBatch(store)
        batch.set_modes()
        mask = nan_mask(store, nan_envs) if nan_envs else None
        for j, step in enumerate(steps):
            x, y = _rows(step, store, len(envs))
            batch.train_batch(x, y, opts, mask, last=j == len(steps) - 1)
        if expose_grads:
            batch.expose_grads()
        assert batch.grad_norms is not None, "an epoch has at least one batch"
        results.append((store, batch.accum, batch.grad_norms))
    return _in_env_order(results, len(envs))  # on the caller's stream: nothing to join


def _in_env_order(results: list[tuple[HostStore, Tensor, Tensor]], n: int) -> tuple[Tensor, Tensor]:
    """Each group's per-env results in the round's env order."""
    if len(results) == 1 and len(results[0][0].envs) == n:
        return results[0][1], results[0][2]
    store0, accum0, norms0 = results[0]
    accum = accum0.new_zeros(n, *accum0.shape[1:])
    norms = norms0.new_zeros(n, *norms0.shape[1:])
    for store, a, g in results:
        index = store.index(store.rows)
        accum.index_copy_(0, index, a.to(accum.device))
        norms.index_copy_(0, index, g.to(norms.device))
    del store0
    return accum, norms


def validate_batched(
    envs: Sequence[EnvState],
    val_batches: Sequence[Batch],
    configs: np.ndarray,
    first: np.ndarray,
    opts: PassOptions,
    *,
    max_elements: int = MAX_VALIDATION_ELEMENTS,
) -> tuple[Tensor, Tensor]:
    """:func:`batch_ops.validate_fused` (same arguments and results) with every
    (env, configuration) row of a group in one batch; the samples of a validation batch
    in chunks where rows x samples x the widest layer per sample would exceed
    ``max_elements``."""
    stores = round_stores(envs)
    if stores is None:
        return validate_fused(envs, val_batches, configs, first, opts)
    n, r = len(envs), len(configs)
    env_of_row = np.repeat(np.arange(n), np.diff(np.append(first, r)))
    device = envs[0].device
    loss = torch.zeros(n, device=device)
    correct = torch.zeros(r, device=device)
    count = torch.zeros(n, device=device)
    is_real = np.zeros(r, dtype=bool)
    is_real[first] = True  # lookups by index: np.isin sorts (about 60 us a call here)
    for store in stores:
        in_store = np.zeros(n, dtype=bool)
        in_store[store.rows] = True
        rows = np.nonzero(in_store[env_of_row])[0]
        members = store.local_of[env_of_row[rows]]
        real = is_real[rows]
        batch = HostBatch(store, train=False, members=members, alphas=configs[rows])
        batch.set_modes()
        chunk = _sample_chunk(batch, val_batches, max_elements)
        store_loss, hits, samples = _validate_rows(batch, _chunks(val_batches, chunk), real, opts)
        loss.index_copy_(0, store.index(store.rows), store_loss.to(device))
        count.index_copy_(0, store.index(store.rows), samples.to(device).expand(len(store.rows)))
        correct.index_copy_(0, store.index(rows), hits.to(device))
    return torch.stack([loss, count], dim=1), correct


def _sample_chunk(batch: HostBatch, val_batches: Sequence[Batch], max_elements: int) -> int:
    """Most samples one forward of the batch's rows may take: rows x samples x the
    widest layer per sample at most ``max_elements``, and never under one sample. The
    widest layer is measured once per store, on the evaluation template (its host, in
    evaluation mode, and its own seeds)."""
    if not val_batches:
        return 1
    store = batch.store
    if store.widest is None:
        store.widest = widest_activation(batch.template, val_batches[0][0][:1])
    return max(1, max_elements // (len(batch.members) * store.widest))


def _chunks(val_batches: Sequence[Batch], size: int) -> list[Batch]:
    """The validation batches with more than ``size`` samples split into pieces (views)."""
    out: list[Batch] = []
    for x, y in val_batches:
        if len(y) <= size:
            out.append((x, y))
        else:
            out += zip(torch.split(x, size), torch.split(y, size), strict=True)
    return out


@torch.no_grad()
def widest_activation(module: nn.Module, sample: Tensor) -> int:
    """Elements of the largest tensor that ``module`` or any module in it returns for one
    ``sample`` (a forward in the module's current mode, with hooks)."""
    widest = sample.numel()

    def record(_module: nn.Module, _args: object, out: object) -> None:
        nonlocal widest
        if isinstance(out, Tensor):
            widest = max(widest, out.numel())

    hooks = [m.register_forward_hook(record) for m in module.modules()]
    try:
        module(sample)
    finally:
        for hook in hooks:
            hook.remove()
    return widest


@torch.no_grad()
def _validate_rows(
    batch: HostBatch, val_batches: Sequence[Batch], real: np.ndarray, opts: PassOptions
) -> tuple[Tensor, Tensor, Tensor]:
    """One pass over the validation data for every row of ``batch``: the real rows'
    loss sums ([envs], in row order), every row's correct count, the sample count."""
    device = batch.device
    real_index = batch.store.index(np.nonzero(real)[0])
    n_rows, n_real = len(real), int(real.sum())
    loss = torch.zeros(n_real, device=device)
    hits = torch.zeros(n_rows, device=device)
    samples = torch.zeros(1, device=device)
    for x, y in val_batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if opts.channels_last and x.dim() == IMAGE_DIMS:
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast(device, opts.amp):
            logits = batch.forward(x.expand(n_rows, *x.shape))  # [R, B, ..., C]
        classes = logits.shape[-1]
        chosen = logits.index_select(0, real_index).reshape(-1, classes).float()
        losses = F.cross_entropy(chosen, y.reshape(-1).repeat(n_real), reduction="none")
        loss += losses.view(n_real, -1).sum(dim=1)
        hits += (logits.argmax(dim=-1) == y[None]).reshape(n_rows, -1).sum(dim=1)
        samples += y.numel()
    return loss, hits, samples
