"""Batched host training: envs whose networks share one structure train as one graph.

Why: a host is a few thousand parameters, so on a GPU the per-env loop is bound by
kernel launches and Python, not arithmetic. Envs whose models have the same structure
(parameter names, shapes and trainability; the same blueprint, stage class and blend
operator in every slot; the same SGD settings; CNN hosts) are stacked along a new leading env
dimension and run as ONE ``vmap`` of ``functional_call`` (convolutions become grouped
convolutions), with a per-env gradient clip and one SGD step over the stacked tensors.

Each env's ``nn.Module`` stays the source of truth: a group is stacked at the start of
an epoch and written back (parameters, buffers, momentum, the last batch's gradients,
the train sums) at its end. Lifecycle operations, snapshots, rollbacks, validation,
gradient metrics and checkpoints therefore see ordinary per-env modules, and a
germination or prune simply moves an env to another group at the next epoch.

Per-env semantics kept: each env has its own loss, clip coefficient and momentum; its
alphas are a per-env input (the model's forced-alpha path, equal to the controller's);
TRAINING seeds stay isolated (the same forward code runs); a NaN loss poisons only its
own env's slice. An env that matches no other, or uses a GradScaler, trains on the
per-env path. Results equal the per-env path up to float summation order (grouped
convolution kernels); tests/training/test_host_batching.py holds the two together.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from esper.core.enums import SeedStage, Topology
from esper.model.lifecycle import BLENDED_STAGES
from esper.model.slot import SeedSlot
from esper.training.batch_ops import (
    PassOptions,
    autocast,
    loss_and_correct,
    stream_ctx,
    synchronize,
    train_batch,
    val_layout,
    validate_fused,
)
from esper.training.env_state import TRAIN_ACCUM, EnvState

#: ``torch.nn.utils.clip_grad_norm_``'s guard against a zero norm (kept identical).
CLIP_EPS = 1e-6

Batch = tuple[Tensor, Tensor]
IMAGE_DIMS = 4


@dataclass(frozen=True)
class SgdSettings:
    """What a parameter's SGD step needs (dampening 0, no Nesterov: the env factory's)."""

    lr: float
    momentum: float
    weight_decay: float


def _sgd_owners(env: EnvState) -> dict[int, tuple[torch.optim.SGD, SgdSettings]] | None:
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
    """Envs with equal keys can train as one batched graph; None: only per env."""
    if env.scaler is not None:
        return None  # GradScaler's per-optimizer inf checks stay on the per-env path
    if env.model.topology != Topology.CNN:
        # Attention has no vmap batching rule on CPU: vmap would loop over the envs
        # inside the graph (measured 1.35x slower than the per-env path, 4 envs).
        return None
    owners = _sgd_owners(env)
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
    is a group of its own)."""
    groups: dict[Hashable, list[EnvState]] = {}
    for env in envs:
        key = structure_key(env)
        groups.setdefault(("single", env.index) if key is None else key, []).append(env)
    return list(groups.values())


@dataclass
class _Member:
    """One env of a group, its tensors looked up once per epoch."""

    env: EnvState
    params: dict[str, nn.Parameter]
    buffers: dict[str, Tensor]
    optimizers: dict[str, torch.optim.SGD]  # parameter name -> its SGD (if any)

    @classmethod
    def of(cls, env: EnvState) -> _Member:
        owners = _sgd_owners(env)
        assert owners is not None, "structure_key admits only batchable optimizers"
        params = dict(env.model.named_parameters())
        optimizers = {n: owners[id(p)][0] for n, p in params.items() if id(p) in owners}
        return cls(env, params, dict(env.model.named_buffers()), optimizers)

    def momentum(self, name: str) -> Tensor | None:
        p = self.params[name]
        buf = self.optimizers[name].state.get(p, {}).get("momentum_buffer")
        return None if buf is None else buf.detach()


class StackedGroup:
    """The envs of one group, their parameters stacked on a leading env dimension."""

    def __init__(self, envs: Sequence[EnvState]) -> None:
        if len(envs) < 2:
            raise ValueError("a stacked group needs at least two envs")
        self.members = [_Member.of(env) for env in envs]
        self.model: nn.Module = envs[0].model  # the forward code (its tensors are swapped)
        self.device = envs[0].device
        owners = _sgd_owners(envs[0])
        assert owners is not None
        ref = self.members[0].params
        self.settings = {n: owners[id(p)][1] if id(p) in owners else None for n, p in ref.items()}
        with torch.no_grad():
            self.params = {
                n: torch.stack([m.params[n].detach() for m in self.members]).requires_grad_(
                    p.requires_grad
                )
                for n, p in ref.items()
            }
            self.buffers = {
                n: torch.stack([m.buffers[n] for m in self.members])
                for n in self.members[0].buffers
            }
            self.momentum = {
                n: self._stack_momentum(n)
                for n, s in self.settings.items()
                if s is not None and s.momentum != 0
            }
            alphas = torch.stack([e.model.current_alphas() for e in envs])
        self.alphas = alphas.to(self.device, non_blocking=True)
        self.accum = torch.zeros(len(envs), TRAIN_ACCUM.width, device=self.device)
        self.stepped: set[str] = set()
        self._vmapped = torch.vmap(self._env_loss)

    def _stack_momentum(self, name: str) -> Tensor:
        """Each env's momentum buffer, zeros where it has none yet: with dampening 0 the
        first step ``0 * m + d_p`` is exactly torch's ``buf = d_p.clone()``."""
        bufs = [m.momentum(name) for m in self.members]
        return torch.stack(
            [
                torch.zeros_like(m.params[name]) if b is None else b
                for m, b in zip(self.members, bufs, strict=True)
            ]
        )

    def _env_loss(
        self,
        params: dict[str, Tensor],
        buffers: dict[str, Tensor],
        alphas: Tensor,
        x: Tensor,
        y: Tensor,
    ) -> tuple[Tensor, Tensor]:
        logits = functional_call(self.model, (params, buffers), (x,), {"alphas": alphas})
        return loss_and_correct(logits, y)

    def train_batch(self, x: Tensor, y: Tensor, opts: PassOptions, nan_mask: Tensor | None) -> None:
        """One batch for every env: x [N, B, ...], y [N, B, ...]."""
        for t in self.params.values():
            t.grad = None
        with autocast(self.device, opts.amp):
            losses, correct = self._vmapped(self.params, self.buffers, self.alphas, x, y)
        if nan_mask is not None:
            losses = losses * nan_mask
        losses.sum().backward()  # type: ignore[no-untyped-call]
        grads = {n: t.grad for n, t in self.params.items() if t.grad is not None}
        clip_per_env(list(grads.values()), opts.grad_clip)
        self._sgd_step(grads)
        n = y[0].numel()
        lay = TRAIN_ACCUM
        self.accum[:, lay.index("loss_sum")] += losses.detach().float() * n
        self.accum[:, lay.index("correct")] += correct
        self.accum[:, lay.index("count")] += n

    @torch.no_grad()
    def _sgd_step(self, grads: dict[str, Tensor]) -> None:
        """``torch.optim.SGD``'s arithmetic (weight decay, momentum, step) on stacked
        tensors, one foreach call per settings group."""
        by_settings: dict[SgdSettings, list[str]] = {}
        for name in grads:
            settings = self.settings[name]
            if settings is not None:  # a parameter no optimizer owns stays as it is
                by_settings.setdefault(settings, []).append(name)
        for s, names in by_settings.items():
            ps = [self.params[n] for n in names]
            steps = [grads[n] for n in names]
            if s.weight_decay != 0:
                steps = list(torch._foreach_add(steps, ps, alpha=s.weight_decay))
            if s.momentum != 0:
                bufs = [self.momentum[n] for n in names]
                torch._foreach_mul_(bufs, s.momentum)
                torch._foreach_add_(bufs, steps)
                steps = bufs
            torch._foreach_add_(ps, steps, alpha=-s.lr)
            self.stepped.update(names)

    @torch.no_grad()
    def write_back(self) -> None:
        """Parameters, buffers, momentum, last gradients and train sums back to each env."""
        names, buffer_names = list(self.params), list(self.buffers)
        momentum_names = [n for n in self.momentum if n in self.stepped]
        for i, m in enumerate(self.members):
            dst = [m.params[n] for n in names] + [m.buffers[n] for n in buffer_names]
            src = [self.params[n][i] for n in names] + [self.buffers[n][i] for n in buffer_names]
            torch._foreach_copy_(dst, src)
            for n in names:
                grad = self.params[n].grad
                m.params[n].grad = None if grad is None else grad[i]
            self._write_momentum(i, m, momentum_names)
            assert m.env.train_accum is not None
            m.env.train_accum += self.accum[i]

    def _write_momentum(self, i: int, member: _Member, names: list[str]) -> None:
        """Momentum of stepped parameters (never stepped: torch would have none either)."""
        existing: list[tuple[Tensor, Tensor]] = []
        for n in names:
            p = member.params[n]
            state = member.optimizers[n].state[p]
            buf = state.get("momentum_buffer")
            if buf is None:
                state["momentum_buffer"] = self.momentum[n][i].clone()
            else:
                existing.append((buf, self.momentum[n][i]))
        if existing:
            torch._foreach_copy_([d for d, _ in existing], [s for _, s in existing])


def clip_per_env(grads: list[Tensor], max_norm: float) -> None:
    """``clip_grad_norm_`` per env over stacked gradients [N, ...] (norm of the
    per-tensor norms, coefficient clamped at 1, applied always as torch does)."""
    if not grads:
        return
    n = grads[0].shape[0]
    norms = torch.stack(
        [torch.linalg.vector_norm(g.reshape(n, -1).float(), dim=1) for g in grads], dim=1
    )
    total = torch.linalg.vector_norm(norms, dim=1)
    coef = torch.clamp(max_norm / (total + CLIP_EPS), max=1.0)
    for g in grads:
        g.mul_(coef.view((n,) + (1,) * (g.dim() - 1)).to(g.dtype))


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
    """:func:`batch_ops.train_epoch` with same-structure envs trained as stacked groups."""
    for env in envs:
        env.model.train()
        assert env.train_accum is not None
        env.train_accum.zero_()
    steps = list(batches)
    position = {id(env): i for i, env in enumerate(envs)}
    on_default_stream: set[int] = set()
    for group in group_envs(envs):
        members = [position[id(env)] for env in group]
        stacked = stack_batches(steps, members) if len(group) > 1 else None
        if stacked is None:
            for env, i in zip(group, members, strict=True):
                with stream_ctx(env):
                    for per_env in steps:
                        x, y = per_env[i]
                        train_batch(env, x, y, opts, inject_nan=env.index in nan_envs)
            continue
        stack = StackedGroup(group)
        mask = nan_mask(group, nan_envs)
        for x, y in stacked:
            stack.train_batch(x, y, opts, mask)
        stack.write_back()
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
) -> list[Tensor]:
    """:func:`batch_ops.validate_fused` with same-structure envs that evaluate the same
    number of alpha configurations run as one vmapped graph (same result layout)."""
    groups: dict[Hashable, list[int]] = {}
    for i, (env, alpha) in enumerate(zip(envs, alphas, strict=True)):
        key = structure_key(env)
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
    """[N, 2 + K] ``val_layout(K)`` rows: every env's K configurations in one graph."""
    for env in envs:
        env.model.eval()
    members = [_Member.of(env) for env in envs]
    params = {n: torch.stack([m.params[n] for m in members]) for n in members[0].params}
    buffers = {n: torch.stack([m.buffers[n] for m in members]) for n in members[0].buffers}
    # No active seed (None): one row, the current alphas (seeds that blend nothing).
    rows = [
        e.model.current_alphas()[None] if a is None else a
        for e, a in zip(envs, alphas, strict=True)
    ]
    device = envs[0].device
    configs = torch.stack(rows).to(device, non_blocking=True)  # [N, K, n_slots]
    n, k = configs.shape[0], configs.shape[1]
    model = envs[0].model

    def env_logits(p: dict[str, Tensor], b: dict[str, Tensor], a: Tensor, x: Tensor) -> Tensor:
        xs = torch.cat([x] * k) if k > 1 else x  # as MorphogeneticModel.fused_forward
        per_sample = a.repeat_interleave(x.shape[0], dim=0)
        logits: Tensor = functional_call(model, (p, b), (xs, per_sample))
        return logits.view(k, x.shape[0], *logits.shape[1:])

    batched = torch.vmap(env_logits, in_dims=(0, 0, 0, None))
    lay = val_layout(k)
    acc = torch.zeros(n, lay.width, device=device)
    for x, y in val_batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if opts.channels_last and x.dim() == IMAGE_DIMS:
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast(device, opts.amp):
            logits = batched(params, buffers, configs, x)  # [N, K, B, ..., C]
        classes = logits.shape[-1]
        real = logits[:, 0].reshape(-1, classes).float()
        losses = F.cross_entropy(real, y.reshape(-1).repeat(n), reduction="none")
        acc[:, lay.index("loss_sum")] += losses.view(n, -1).sum(dim=1)
        acc[:, lay.index("count")] += y.numel()
        hits = logits.argmax(dim=-1) == y[None, None]
        acc[:, lay["correct"]] += hits.reshape(n, k, -1).sum(dim=2)
    return acc
