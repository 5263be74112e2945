"""Batched host passes (``run.batch_envs``): the epoch's train pass and validation.

Why: a host is a few thousand parameters, so on a GPU the per-env loop is bound by
kernel launches and Python, not arithmetic.

- Train: the envs of one device (same host shapes and SGD settings, CNN hosts) train as
  one :class:`slot_groups.HostBatch`: hosts stacked and vmapped, seeds grouped per slot.
- Validation: the same envs run the fused counterfactual pass as one
  :class:`slot_groups.HostBatch` too: every configuration of every env in one host
  graph (envs with fewer configurations padded with copies of their real one), the
  blended seeds grouped per slot (TRAINING seeds pass through without gradients).

Each env's ``nn.Module`` stays the source of truth: its tensors are views of the
group's :class:`~esper.training.host_store.HostStore`, so lifecycle operations,
snapshots, rollbacks, gradient metrics and checkpoints see ordinary per-env modules,
and nothing is copied in or out per epoch.

Per-env semantics kept: each env has its own loss, clip coefficient and momentum; its
alphas are a per-env input (the forced-alpha path, equal to the controller's); TRAINING
seeds stay isolated (the same forward code runs); a NaN loss poisons only its own
env's rows. An env that matches no other, or uses a GradScaler, runs on the per-env
path. Results equal the per-env path up to float summation order (grouped convolution
kernels, one norm over all of an env's gradients); tests/training/test_host_batching.py
holds the two together.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from esper.core.enums import SeedStage, Topology
from esper.model.lifecycle import BLENDED_STAGES
from esper.model.slot import SeedSlot
from esper.training.batch_ops import (
    VAL_HEAD,
    PassOptions,
    autocast,
    stream_ctx,
    synchronize,
    train_batch,
    train_results,
    validate_fused,
)
from esper.training.env_state import EnvState
from esper.training.slot_groups import HostBatch, host_key, sgd_owners

Batch = tuple[Tensor, Tensor]
IMAGE_DIMS = 4


def _slot_key(slot: SeedSlot) -> Hashable:
    """What decides a slot's forward code: seed blueprint, stage class, blend operator."""
    if slot.seed is None:
        return (slot.slot_id, "empty")
    stage = slot.life.stage
    if stage == SeedStage.TRAINING:
        mode = "train"
    elif stage in BLENDED_STAGES:
        mode = "blend"
    else:
        mode = "pass"
    blend_op = slot.life.blend_op if mode == "blend" else None
    return (slot.slot_id, mode, slot.life.blueprint, blend_op, slot.gate is not None)


def structure_key(env: EnvState) -> Hashable | None:
    """Envs with equal keys have the same whole structure; None: only per env. The first
    design batched only such envs; kept to measure what per-slot grouping gains
    (``benchmarks/batch_groups.py``)."""
    if env.scaler is not None:
        return None  # GradScaler's per-optimizer inf checks stay on the per-env path
    if env.model.topology != Topology.CNN:
        # Attention has no vmap batching rule on CPU: vmap would loop over the envs
        # inside the graph (measured 1.35x slower than the per-env path, 4 envs).
        return None
    owners = sgd_owners(env)
    if owners is None:
        return None
    model = env.model
    params = tuple(
        (name, tuple(p.shape), p.dtype, p.requires_grad, owners.get(id(p), (None, None))[1])
        for name, p in model.named_parameters()
    )
    buffers = tuple((name, tuple(b.shape), b.dtype) for name, b in model.named_buffers())
    slots = tuple(_slot_key(model.slot(s)) for s in model.slot_ids)
    return (str(env.device), params, buffers, slots)


def group_envs(envs: Sequence[EnvState]) -> list[list[EnvState]]:
    """Envs grouped by :func:`structure_key`, in first-seen order (each unbatchable env
    is a group of its own): the first design's groups, for comparisons."""
    groups: dict[Hashable, list[EnvState]] = {}
    for env in envs:
        key = structure_key(env)
        groups.setdefault(("single", env.index) if key is None else key, []).append(env)
    return list(groups.values())


def nan_mask(group: Sequence[EnvState], nan_envs: frozenset[int]) -> Tensor | None:
    """Loss multipliers: NaN for envs with an injected fault, else 1 (None: no fault)."""
    if not any(env.index in nan_envs for env in group):
        return None
    values = [math.nan if env.index in nan_envs else 1.0 for env in group]
    return torch.tensor(values).to(group[0].device, non_blocking=True)


#: A batch for every env at once: inputs [N, B, ...] and targets [N, B] (the iterator's
#: ``epoch_stacked``), or one (x, y) per env.
Batches = tuple[Tensor, Tensor] | list[Batch]


def _rows(batch: Batches, members: Sequence[int], n: int) -> tuple[Tensor, Tensor]:
    """The members' inputs and targets stacked [n_members, B, ...]."""
    if isinstance(batch, tuple):
        x, y = batch
        if len(members) == n:
            return x, y
        index = torch.tensor(members).to(x.device, non_blocking=True)
        return x.index_select(0, index), y.index_select(0, index)
    return torch.stack([batch[i][0] for i in members]), torch.stack([batch[i][1] for i in members])


def _one(batch: Batches, i: int) -> Batch:
    if isinstance(batch, tuple):
        return batch[0][i], batch[1][i]
    return batch[i]


def _groups(envs: Sequence[EnvState]) -> list[list[int]]:
    """Positions of the envs of each :func:`slot_groups.host_key` (unbatchable: alone)."""
    groups: dict[Hashable, list[int]] = {}
    for i, env in enumerate(envs):
        key = host_key(env)
        groups.setdefault(("single", env.index) if key is None else key, []).append(i)
    return list(groups.values())


def train_epoch_batched(
    envs: Sequence[EnvState],
    batches: Iterable[Batches],
    opts: PassOptions,
    *,
    nan_envs: frozenset[int] = frozenset(),
    expose_grads: bool = False,
) -> tuple[Tensor, Tensor]:
    """:func:`batch_ops.train_epoch` with the envs of one device trained as one
    :class:`slot_groups.HostBatch` (hosts stacked, seeds grouped per slot).
    ``expose_grads``: give every env's parameters their last gradients (debug layer
    statistics read them)."""
    for env in envs:
        env.model.train()
    steps = list(batches)
    for members in _groups(envs):
        group = [envs[i] for i in members]
        if len(group) == 1:
            (env,), (i,) = group, members
            assert env.train_accum is not None
            env.train_accum = torch.zeros_like(env.train_accum)
            with stream_ctx(env):
                for batch in steps:
                    x, y = _one(batch, i)
                    train_batch(env, x, y, opts, inject_nan=env.index in nan_envs)
                env.last_grad_norms = env.model.grad_norms()
            continue
        hosts = HostBatch(group)
        mask = nan_mask(group, nan_envs)
        for j, batch in enumerate(steps):
            x, y = _rows(batch, members, len(envs))
            hosts.train_batch(x, y, opts, mask, last=j == len(steps) - 1)
        hosts.finish(expose_grads=expose_grads)
    synchronize(envs)
    return train_results(envs)


def validate_batched(
    envs: Sequence[EnvState],
    val_batches: Sequence[Batch],
    configs: np.ndarray,
    first: np.ndarray,
    opts: PassOptions,
) -> tuple[Tensor, Tensor]:
    """:func:`batch_ops.validate_fused` (same arguments and results) with the envs of
    one host key run as one batch."""
    bounds = np.append(first, len(configs)).tolist()
    heads: dict[int, Tensor] = {}
    correct: dict[int, Tensor] = {}
    for members in _groups(envs):
        group = [envs[i] for i in members]
        rows = [configs[bounds[i] : bounds[i + 1]] for i in members]
        if len(members) == 1:
            head, hits = validate_fused(group, val_batches, rows[0], np.zeros(1, np.int64), opts)
            heads[members[0]], correct[members[0]] = head[0], hits
            continue
        out = _validate_group(group, val_batches, list(map(np.ndarray.tolist, rows)), opts)
        width = VAL_HEAD.width
        for j, (i, k) in enumerate(zip(members, (len(r) for r in rows), strict=True)):
            heads[i], correct[i] = out[j, :width], out[j, width : width + k]
    synchronize(envs)
    n = len(envs)
    return torch.stack([heads[i] for i in range(n)]), torch.cat([correct[i] for i in range(n)])


@torch.no_grad()
def _validate_group(
    envs: Sequence[EnvState],
    val_batches: Sequence[Batch],
    configs: Sequence[Sequence[Sequence[float]]],
    opts: PassOptions,
) -> Tensor:
    """[N, 2 + K] rows (VAL_HEAD, then correct per configuration), K the most
    configurations of any env: every
    env's configurations in one batch (fewer are padded with copies of the real one).

    As ``MorphogeneticModel.fused_forward``: the batch is repeated K times and copy k
    gets configuration k's alphas, for every env at once.
    """
    for env in envs:
        env.model.eval()  # before grouping: the seed kinds are read in eval terms
    batch = HostBatch(envs, train=False)
    k = max(len(c) for c in configs)
    padded = [list(c) + [c[0]] * (k - len(c)) for c in configs]
    device = envs[0].device
    table = torch.tensor(padded).to(device, non_blocking=True)  # [N, K, n_slots]
    n = table.shape[0]
    acc = torch.zeros(n, VAL_HEAD.width + k, device=device)
    per_sample: dict[int, Tensor] = {}
    for x, y in val_batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if opts.channels_last and x.dim() == IMAGE_DIMS:
            x = x.contiguous(memory_format=torch.channels_last)
        b = x.shape[0]
        xs = torch.cat([x] * k) if k > 1 else x
        if b not in per_sample:
            per_sample[b] = table.repeat_interleave(b, dim=1)  # [N, K*B, n_slots]
        with autocast(device, opts.amp):
            logits = batch.forward(xs.expand(n, *xs.shape), per_sample[b])  # [N, K*B, ..., C]
        logits = logits.view(n, k, b, *logits.shape[2:])
        classes = logits.shape[-1]
        real = logits[:, 0].reshape(-1, classes).float()
        losses = F.cross_entropy(real, y.reshape(-1).repeat(n), reduction="none")
        hits = (logits.argmax(dim=-1) == y[None, None]).reshape(n, k, -1).sum(dim=2)
        count = torch.full_like(hits[:, :1], y.numel())
        acc += torch.cat([losses.view(n, -1).sum(dim=1, keepdim=True), count, hits], dim=1)
    return acc
