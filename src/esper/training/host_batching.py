"""Batched host passes (``run.batch_envs``): the epoch's train pass and validation.

Why: a host is a few thousand parameters, so on a GPU the per-env loop is bound by
kernel launches and Python, not arithmetic.

- Train: the envs of one device (same host shapes and SGD settings, CNN hosts) train as
  one :class:`slot_groups.HostBatch`: hosts stacked and vmapped, seeds grouped per slot.
- Validation (on accelerators; on a CPU per env, which measured faster): the envs of
  one :func:`slot_groups.host_key` that evaluate the same number K of counterfactual
  configurations run the fused pass as one :class:`slot_groups.HostBatch` too: every
  configuration of every env in one host graph, the blended seeds grouped per slot
  (TRAINING seeds pass through without gradients). The first design grouped by whole
  structure (:func:`structure_key`: the same seed kind in every slot), which split as
  the envs' seeds diverged.

Each env's ``nn.Module`` stays the source of truth: tensors are stacked at the start of
a pass and written back (parameters, buffers, momentum, the last batch's gradients,
the train sums) at its end. Lifecycle operations, snapshots, rollbacks, gradient
metrics and checkpoints therefore see ordinary per-env modules.

Per-env semantics kept: each env has its own loss, clip coefficient and momentum; its
alphas are a per-env input (the forced-alpha path, equal to the controller's); TRAINING
seeds stay isolated (the same forward code runs); a NaN loss poisons only its own
env's rows. An env that matches no other, or uses a GradScaler, runs on the per-env
path. Results equal the per-env path up to float summation order (grouped convolution
kernels); tests/training/test_host_batching.py holds the two together.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Hashable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from esper.core.enums import SeedStage, Topology
from esper.model.lifecycle import BLENDED_STAGES
from esper.model.slot import SeedSlot
from esper.training.batch_ops import (
    PassOptions,
    autocast,
    stream_ctx,
    synchronize,
    train_batch,
    val_layout,
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


def stack_batches(steps: Sequence[Sequence[Batch]], members: Sequence[int]) -> list[Batch] | None:
    """Per batch, the members' inputs and targets stacked [N, B, ...]; None if their
    batch shapes differ (the group then trains per env)."""
    out: list[Batch] = []
    for per_env in steps:
        xs = [per_env[i][0] for i in members]
        ys = [per_env[i][1] for i in members]
        if any(x.shape != xs[0].shape for x in xs) or any(y.shape != ys[0].shape for y in ys):
            return None
        out.append((torch.stack(xs), torch.stack(ys)))
    return out


def nan_mask(group: Sequence[EnvState], nan_envs: frozenset[int]) -> Tensor | None:
    """Loss multipliers: NaN for envs with an injected fault, else 1 (None: no fault)."""
    if not any(env.index in nan_envs for env in group):
        return None
    values = [math.nan if env.index in nan_envs else 1.0 for env in group]
    return torch.tensor(values).to(group[0].device, non_blocking=True)


def train_epoch_batched(
    envs: Sequence[EnvState],
    batches: Iterable[list[Batch]],
    opts: PassOptions,
    *,
    nan_envs: frozenset[int] = frozenset(),
) -> None:
    """:func:`batch_ops.train_epoch` with the envs of one device trained as one
    :class:`slot_groups.HostBatch` (hosts stacked, seeds grouped per slot)."""
    for env in envs:
        env.model.train()
        assert env.train_accum is not None
        env.train_accum.zero_()
    steps = list(batches)
    position = {id(env): i for i, env in enumerate(envs)}
    groups: dict[Hashable, list[EnvState]] = {}
    for env in envs:
        key = host_key(env)
        groups.setdefault(("single", env.index) if key is None else key, []).append(env)
    on_default_stream: set[int] = set()
    for group in groups.values():
        members = [position[id(env)] for env in group]
        stacked = stack_batches(steps, members) if len(group) > 1 else None
        if stacked is None:
            for env, i in zip(group, members, strict=True):
                with stream_ctx(env):
                    for per_env in steps:
                        x, y = per_env[i]
                        train_batch(env, x, y, opts, inject_nan=env.index in nan_envs)
            continue
        batch = HostBatch(group)
        mask = nan_mask(group, nan_envs)
        for x, y in stacked:
            batch.train_batch(x, y, opts, mask)
        batch.write_back()
        on_default_stream.update(id(env) for env in group)
    for env in envs:
        # A stacked group ran on the default stream, which its gradients live on.
        ctx = contextlib.nullcontext() if id(env) in on_default_stream else stream_ctx(env)
        with ctx:
            env.last_grad_norms = env.model.grad_norms()
    synchronize(envs)


def validate_batched(
    envs: Sequence[EnvState],
    val_batches: Sequence[Batch],
    alphas: Sequence[Tensor | None],
    opts: PassOptions,
    *,
    per_slot: bool | None = None,
) -> list[Tensor]:
    """:func:`batch_ops.validate_fused` with the envs of one host key that evaluate the
    same number of alpha configurations run as one batch (same result layout).

    ``per_slot`` None: batched on accelerators only. On a CPU the batched graph's
    grouped convolutions made this pass 2-2.7x slower than the per-env passes
    (benchmarks/README.md, "Batched host path"), so there every env validates alone.
    """
    if per_slot is None:
        per_slot = envs[0].device.type != "cpu" if envs else False
    if not per_slot:
        return validate_fused(envs, val_batches, alphas, opts)
    groups: dict[Hashable, list[int]] = {}
    for i, (env, alpha) in enumerate(zip(envs, alphas, strict=True)):
        key = host_key(env)
        k = 1 if alpha is None else alpha.shape[0]
        groups.setdefault(("single", i) if key is None else (key, k), []).append(i)
    results: dict[int, Tensor] = {}
    for members in groups.values():
        group = [envs[i] for i in members]
        rows = [alphas[i] for i in members]
        if len(members) == 1:
            values = validate_fused(group, val_batches, rows, opts)
        else:
            values = list(_validate_group(group, val_batches, rows, opts).unbind(0))
        results.update(zip(members, values, strict=True))
    synchronize(envs)
    return [results[i] for i in range(len(envs))]


@torch.no_grad()
def _validate_group(
    envs: Sequence[EnvState],
    val_batches: Sequence[Batch],
    alphas: Sequence[Tensor | None],
    opts: PassOptions,
) -> Tensor:
    """[N, 2 + K] ``val_layout(K)`` rows: every env's K configurations in one batch.

    As ``MorphogeneticModel.fused_forward``: the batch is repeated K times and copy k
    gets configuration k's alphas, for every env at once.
    """
    for env in envs:
        env.model.eval()  # before stacking: the seed kinds are read in eval terms
    batch = HostBatch(envs, train=False)
    # No active seed (None): one row, the current alphas (seeds that blend nothing).
    rows = [
        e.model.current_alphas()[None] if a is None else a
        for e, a in zip(envs, alphas, strict=True)
    ]
    device = envs[0].device
    configs = torch.stack(rows).to(device, non_blocking=True)  # [N, K, n_slots]
    n, k = configs.shape[0], configs.shape[1]
    lay = val_layout(k)
    acc = torch.zeros(n, lay.width, device=device)
    for x, y in val_batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if opts.channels_last and x.dim() == IMAGE_DIMS:
            x = x.contiguous(memory_format=torch.channels_last)
        b = x.shape[0]
        xs = torch.cat([x] * k) if k > 1 else x
        per_sample = configs.repeat_interleave(b, dim=1)  # [N, K*B, n_slots]
        with autocast(device, opts.amp):
            logits = batch.forward(xs.expand(n, *xs.shape), per_sample)  # [N, K*B, ..., C]
        logits = logits.view(n, k, b, *logits.shape[2:])
        classes = logits.shape[-1]
        real = logits[:, 0].reshape(-1, classes).float()
        losses = F.cross_entropy(real, y.reshape(-1).repeat(n), reduction="none")
        acc[:, lay.index("loss_sum")] += losses.view(n, -1).sum(dim=1)
        acc[:, lay.index("count")] += y.numel()
        hits = logits.argmax(dim=-1) == y[None, None]
        acc[:, lay["correct"]] += hits.reshape(n, k, -1).sum(dim=2)
    return acc
