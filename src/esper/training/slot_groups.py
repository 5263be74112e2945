"""One batched train step for every env on a device: hosts stacked, seeds grouped per slot.

Why: whole-structure groups split as envs' seeds diverge (``benchmarks/batch_groups.py``:
PPO's 16 envs fell to 11.9 groups per epoch). But every env's host has the same shapes
and optimizer settings, and the host is most of the compute. Only the seeds differ. So
:class:`HostBatch` runs each host segment once, vmapped over all envs' stacked host
parameters. At each slot it splits the batch only by that slot's seed kind (blueprint,
stage class, blend operator, trainability and SGD settings), runs each kind vmapped
over its own envs, and puts the activations back in env order. Empty slots and seeds
outside the forward (GERMINATED, cooldown) pass the activation through, as in
``SeedSlot.forward``.

Per-env semantics as in :mod:`host_batching`: each env has its own loss, alphas, clip
coefficient (host and seed norms summed per env) and momentum. The modules stay the
source of truth and are written back after the epoch.
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

HOST_PREFIX = "host."
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
    owners = sgd_owners(env)
    if env.scaler is not None or owners is None or env.model.topology != Topology.CNN:
        return None  # see host_batching.structure_key for each reason
    host = env.model.host
    params = tuple(
        (n, tuple(p.shape), p.dtype, p.requires_grad, owners.get(id(p), (None, None))[1])
        for n, p in host.named_parameters()
    )
    buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in host.named_buffers())
    return (str(env.device), env.model.slot_ids, params, buffers)


def _seed_kind(
    env: EnvState,
    slot_id: str,
    owners: dict[int, tuple[torch.optim.SGD, SgdSettings]],
    train: bool,
) -> Hashable | None:
    """What decides a slot's seed code and update; None where the slot passes through."""
    slot = env.model.slot(slot_id)
    if not _in_forward(slot, train):
        return None
    params = tuple(
        (n, tuple(p.shape), p.requires_grad, owners.get(id(p), (None, None))[1])
        for n, p in slot.named_parameters()
    )
    stage = "train" if slot.life.stage == SeedStage.TRAINING else "blend"
    return (slot.life.blueprint, stage, slot.life.blend_op, params)


@dataclass
class _Stack:
    """One stacked tensor: a parameter (or buffer) name and the envs (rows) it holds."""

    name: str
    rows: list[int]
    index: Tensor  # ``rows`` on the device
    tensor: Tensor
    settings: SgdSettings | None = None
    momentum: Tensor | None = None


@dataclass(frozen=True)
class _Kind:
    """The envs of one seed kind at one slot."""

    rows: Tensor  # env positions, on the device
    module: SeedSlot  # the forward code (a member's slot)
    prefix: str  # "slots.<id>."


class HostBatch:
    """Envs with one :func:`host_key`, stacked for one epoch (see the module docstring).

    ``train=False`` stacks for evaluation (under ``torch.no_grad``, models in eval
    mode): no momentum, and TRAINING seeds pass through, as they do without gradients.
    """

    def __init__(self, envs: Sequence[EnvState], *, train: bool = True) -> None:
        self.envs = list(envs)
        self.train = train
        self.model = envs[0].model
        self.device = envs[0].device
        self.named = [dict(e.model.named_parameters()) for e in envs]
        self.buffers_of = [dict(e.model.named_buffers()) for e in envs]
        self.owners = [sgd_owners(e) for e in envs]
        self.params: dict[str, _Stack] = {}
        self.buffers: dict[str, _Stack] = {}
        everyone = list(range(len(envs)))
        self._stack(HOST_PREFIX, everyone)
        self.kinds: dict[str, list[_Kind]] = {}
        for slot_id in self.model.slot_ids:
            by_kind: dict[Hashable, list[int]] = {}
            for i, env in enumerate(envs):
                owners = self.owners[i]
                assert owners is not None, "host_key admits only batchable optimizers"
                kind = _seed_kind(env, slot_id, owners, train)
                if kind is not None:
                    by_kind.setdefault(kind, []).append(i)
            prefix = f"slots.{slot_id}."
            self.kinds[slot_id] = []
            for rows in by_kind.values():
                self._stack(prefix, rows, tag=f"{rows[0]}:")
                module = envs[rows[0]].model.slot(slot_id)
                index = torch.tensor(rows).to(self.device, non_blocking=True)
                self.kinds[slot_id].append(_Kind(index, module, f"{rows[0]}:{prefix}"))
        alphas = torch.stack([e.model.current_alphas() for e in envs])
        self.alphas = alphas.to(self.device, non_blocking=True)
        self.slot_at = {self.model.positions[s].segment: s for s in self.model.slot_ids}
        self.accum = torch.zeros(len(envs), TRAIN_ACCUM.width, device=self.device)
        self.stepped: set[str] = set()
        self._by_key: dict[str, tuple[dict[str, Tensor], dict[str, Tensor]]] = {}
        self._loss = torch.vmap(loss_and_correct)

    @torch.no_grad()
    def _stack(self, prefix: str, rows: list[int], tag: str = "") -> None:
        """Stack the members' tensors under ``prefix`` (keys: ``tag + name``)."""
        first = rows[0]
        index = torch.tensor(rows).to(self.device, non_blocking=True)
        for name, p in self.named[first].items():
            if name.startswith(prefix):
                stacked = torch.stack([self.named[i][name].detach() for i in rows])
                owner = self.owners[first]
                assert owner is not None
                settings = owner[id(p)][1] if id(p) in owner else None
                grad = stacked.requires_grad_(p.requires_grad)
                entry = _Stack(name, rows, index, grad, settings)
                if self.train and settings is not None and settings.momentum != 0:
                    entry.momentum = torch.stack([self._momentum(i, name) for i in rows])
                self.params[tag + name] = entry
        for name in self.buffers_of[first]:
            if name.startswith(prefix):
                stacked = torch.stack([self.buffers_of[i][name] for i in rows])
                self.buffers[tag + name] = _Stack(name, rows, index, stacked)

    def _momentum(self, i: int, name: str) -> Tensor:
        """Env i's momentum buffer; zeros where it has none (exact with dampening 0)."""
        p = self.named[i][name]
        owner = self.owners[i]
        assert owner is not None
        buf = owner[id(p)][0].state.get(p, {}).get("momentum_buffer")
        return torch.zeros_like(p) if buf is None else buf.detach()

    def _under(self, key: str) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The stacked parameters and buffers under ``key``, relative names (looked up
        once per batch object: the stacked tensors are updated in place, never replaced)."""
        found = self._by_key.get(key)
        if found is None:
            cut = len(key)
            params = {k[cut:]: s.tensor for k, s in self.params.items() if k.startswith(key)}
            bufs = {k[cut:]: s.tensor for k, s in self.buffers.items() if k.startswith(key)}
            found = self._by_key[key] = (params, bufs)
        return found

    def _call(self, module: nn.Module, key: str, h: Tensor, *extra: Tensor) -> Tensor:
        """``module`` vmapped over the stacked tensors under ``key``."""
        params, bufs = self._under(key)

        def one(p: dict[str, Tensor], b: dict[str, Tensor], z: Tensor, *e: Tensor) -> Tensor:
            out: Tensor = functional_call(module, (p, b), (z, *e))
            return out

        out: Tensor = torch.vmap(one)(params, bufs, h, *extra)
        return out

    def forward(self, x: Tensor, alphas: Tensor | None = None) -> Tensor:
        """Logits [N, B, ...] of every env for inputs x [N, B, ...]; ``alphas``
        [N, B, n_slots] forces per-sample alphas (else each env's current ones)."""
        host = self.model.host
        h = self._call(host.stem, "host.stem.", x)
        for i, segment in enumerate(host.segments):
            h = self._call(segment, f"host.segments.{i}.", h)
            slot_id = self.slot_at.get(i)
            if slot_id is not None:
                h = self._slot(slot_id, h, alphas)
        return self._call(host.head, "host.head.", h)

    def _slot(self, slot_id: str, h: Tensor, alphas: Tensor | None) -> Tensor:
        kinds = self.kinds[slot_id]
        if not kinds:
            return h
        col = self.model.slot_ids.index(slot_id)
        if alphas is None:
            column = self.alphas[:, col]  # [N]: one alpha per env
        else:  # [N, B]: per sample, shaped to broadcast over each sample's activation
            column = alphas[:, :, col].reshape(alphas.shape[:2] + (1,) * (h.dim() - 2))
        if len(kinds) == 1 and kinds[0].rows.numel() == len(self.envs):
            # every env runs the same seed kind here: no gather, no scatter
            return self._call(kinds[0].module, kinds[0].prefix, h, column)
        out = h
        for kind in kinds:
            alpha = column.index_select(0, kind.rows)
            part = self._call(kind.module, kind.prefix, h.index_select(0, kind.rows), alpha)
            out = out.index_copy(0, kind.rows, part.to(out.dtype))
        return out

    def train_batch(self, x: Tensor, y: Tensor, opts: PassOptions, nan_mask: Tensor | None) -> None:
        for s in self.params.values():
            s.tensor.grad = None
        with autocast(self.device, opts.amp):
            logits = self.forward(x)
            losses, correct = self._loss(logits, y)
        if nan_mask is not None:
            losses = losses * nan_mask
        losses.sum().backward()  # type: ignore[no-untyped-call]
        self._clip(opts.grad_clip)
        self._sgd_step()
        n = y[0].numel()
        lay = TRAIN_ACCUM
        self.accum[:, lay.index("loss_sum")] += losses.detach().float() * n
        self.accum[:, lay.index("correct")] += correct
        self.accum[:, lay.index("count")] += n

    def _with_grads(self) -> list[_Stack]:
        return [s for s in self.params.values() if s.tensor.grad is not None]

    @torch.no_grad()
    def _clip(self, max_norm: float) -> None:
        """Per env: the norm of all its gradient tensors (host and seeds), clamped as
        ``clip_grad_norm_`` does, applied to its rows of every stacked gradient."""
        stacks = self._with_grads()
        if not stacks:
            return
        squares = torch.zeros(len(self.envs), device=self.device)
        for s in stacks:
            g = s.tensor.grad
            assert g is not None
            norms = torch.linalg.vector_norm(g.reshape(g.shape[0], -1).float(), dim=1)
            squares.index_add_(0, s.index, norms.square())
        coef = torch.clamp(max_norm / (squares.sqrt() + CLIP_EPS), max=1.0)
        for s in stacks:
            g = s.tensor.grad
            assert g is not None
            per_row = coef.index_select(0, s.index)
            g.mul_(per_row.view((-1,) + (1,) * (g.dim() - 1)).to(g.dtype))

    @torch.no_grad()
    def _sgd_step(self) -> None:
        """``torch.optim.SGD``'s arithmetic on the stacked tensors, foreach per settings."""
        by_settings: dict[SgdSettings, list[str]] = {}
        for key, s in self.params.items():
            if s.tensor.grad is not None and s.settings is not None:
                by_settings.setdefault(s.settings, []).append(key)
        for settings, keys in by_settings.items():
            stacks = [self.params[k] for k in keys]
            ps = [s.tensor for s in stacks]
            steps = [g for g in (t.grad for t in ps) if g is not None]
            if settings.weight_decay != 0:
                steps = list(torch._foreach_add(steps, ps, alpha=settings.weight_decay))
            if settings.momentum != 0:
                bufs = [b for b in (s.momentum for s in stacks) if b is not None]
                torch._foreach_mul_(bufs, settings.momentum)
                torch._foreach_add_(bufs, steps)
                steps = bufs
            torch._foreach_add_(ps, steps, alpha=-settings.lr)
            self.stepped.update(keys)

    @torch.no_grad()
    def write_back(self) -> None:
        """Parameters, buffers, momentum, last gradients and train sums back to each env."""
        dst: list[Tensor] = []
        src: list[Tensor] = []
        for key, s in self.params.items():
            for j, i in enumerate(s.rows):
                dst.append(self.named[i][s.name])
                src.append(s.tensor[j])
                self._write_momentum(key, s, j, i, dst, src)
        for s in self.buffers.values():
            for j, i in enumerate(s.rows):
                dst.append(self.buffers_of[i][s.name])
                src.append(s.tensor[j])
        if dst:
            torch._foreach_copy_(dst, src)
        for i in range(len(self.envs)):
            for p in self.named[i].values():
                p.grad = None  # a seed outside the forward had none in the per-env path
        for s in self.params.values():
            grad = s.tensor.grad
            if grad is not None:
                for j, i in enumerate(s.rows):
                    self.named[i][s.name].grad = grad[j]
        for i, env in enumerate(self.envs):
            assert env.train_accum is not None
            env.train_accum += self.accum[i]

    def _write_momentum(
        self, key: str, s: _Stack, j: int, i: int, dst: list[Tensor], src: list[Tensor]
    ) -> None:
        if s.momentum is None or key not in self.stepped:
            return  # never stepped: torch would have no buffer either
        p = self.named[i][s.name]
        owner = self.owners[i]
        assert owner is not None
        state = owner[id(p)][0].state[p]
        buf = state.get("momentum_buffer")
        if buf is None:
            state["momentum_buffer"] = s.momentum[j].clone()
        else:
            dst.append(buf)
            src.append(s.momentum[j])
