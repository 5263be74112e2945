"""Recurrent PPO update over one round's [n_envs, T] rollout, in minibatches of chunks.

Each env row is cut into chunks of ``ppo.chunk_length`` steps; a chunk replays the LSTM
from the recurrent state stored when it was collected (``hidden0`` for the first chunk,
the buffer's post-decision state otherwise), so chunks shuffle freely across envs. Each
of ``ppo.update_epochs`` epochs visits the chunks in ``ppo.minibatches`` shuffled
minibatches (a seeded permutation: CPU runs stay bit-identical), with the advantages
normalised per minibatch. The loss clips each action head's ratio separately and counts
a head only where the chosen op uses it (causal masking), so a head that did not
influence the action never receives gradient or entropy bonus.

Value targets are the returns divided by a running scale; when the scale moves, the
value head's output layer is rescaled by old/new scale (PopArt-style preservation), so
the critic's raw-scale predictions do not jump with the statistics.

The update is atomic: parameters, optimizer state and the value normaliser are
restored if the rollout or any minibatch's loss or gradient is non-finite, and the
metrics say so. The host reads the device once per epoch: one packet with every
minibatch's loss, KL and gradient norm (the finiteness gate and the KL early stop are
decided per epoch, as in CleanRL), the epoch's averaged diagnostics and the rollout's
statistics, so the last packet is also the update's metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from esper.config import PPOConfig
from esper.core.constants import HEAD_NAMES, RELEVANT_HEADS
from esper.core.enums import LifecycleOp
from esper.core.layout import Layout
from esper.core.transfer import host_copy
from esper.policy.masks import ActionMasks
from esper.policy.protocol import EvalOutput, Hidden
from esper.telemetry.events import PpoUpdate
from esper.training.learning.buffer import RolloutBuffer
from esper.training.learning.normalizers import ValueNormalizer

#: Added to the advantage std before dividing.
ADVANTAGE_EPS = 1e-8
#: Value loss is 0.5 * squared error (so its gradient is the plain error).
VALUE_LOSS_SCALE = 0.5
#: The minibatch permutation stream is seeded with seed * stride + round (no state to
#: checkpoint: a resumed run shuffles exactly like an uninterrupted one).
MINIBATCH_SEED_STRIDE = 1_000_003

#: Minibatch stats averaged NaN-aware over the last epoch, in METRICS_LAYOUT order.
_AVERAGED = ("policy_loss", "value_loss", "entropy", "clip_frac")
#: Pre-update buffer stats (``_base_stats``) and the rollout's finiteness, packed last.
BASE_STATS = ("explained_variance", "value_mean", "return_mean", "inputs_finite")
#: The update's diagnostics, packed into one tensor for the update's final transfer.
METRICS_LAYOUT = Layout(
    *((k, 1) for k in _AVERAGED),
    ("approx_kl", 1),
    ("grad_norm", 1),
    ("ratio_max", 1),
    ("entropy_heads", len(HEAD_NAMES)),
    ("clip_heads", len(HEAD_NAMES)),
    *((k, 1) for k in BASE_STATS),
)
#: Per minibatch in an epoch's packet (before METRICS_LAYOUT): what gates the update.
GATE_VALUES = ("loss", "kl", "grad_norm")


class UpdateSync(Protocol):
    """Multi-rank runs (:mod:`esper.training.loop.distributed`): what keeps replicas equal."""

    def average_grads(self, params: Any, scalars: Tensor) -> Tensor: ...

    def all_true(self, flag: Tensor) -> Tensor: ...


class RecurrentActorCritic(Protocol):
    """What the update needs from a policy network (an ``nn.Module``)."""

    def evaluate_actions(
        self,
        obs: Tensor,
        blueprint_ids: Tensor,
        masks: ActionMasks,
        actions: Tensor,
        hidden0: Hidden,
        *,
        resets: Tensor | None = None,
    ) -> EvalOutput: ...


def relevance_table(device: torch.device | str = "cpu") -> Tensor:
    """[ops, heads] bool: does head h matter when op o is chosen."""
    return torch.tensor(
        [[name in RELEVANT_HEADS[op] for name in HEAD_NAMES] for op in LifecycleOp],
        dtype=torch.bool,
    ).to(device, non_blocking=True)


def _cloned(state: Any) -> Any:
    """A copy of an optimizer state dict: tensors cloned where they live (a deepcopy of a
    CUDA tensor goes through a blocking storage copy)."""
    if isinstance(state, Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {k: _cloned(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_cloned(v) for v in state]
    return state  # numbers, strings, tuples, None: immutable


def _nan_if_zero(count: Tensor) -> Tensor:
    """Counts as divisors: a mean over nothing is NaN, not inf."""
    return count.masked_fill(count == 0, math.nan)


def _masked_mean(x: Tensor, mask: Tensor, dims: tuple[int, ...]) -> Tensor:
    """Mean of ``x`` over ``dims`` where ``mask``; NaN where nothing is masked in."""
    m = mask.to(x.dtype)
    count = m.sum(dim=dims)
    return (x * m).sum(dim=dims) / count.masked_fill(count == 0, math.nan)


class _Chunks:
    """The rollout as [C, L, ...] chunks (env-major), padded at the end of each row."""

    def __init__(self, buf: RolloutBuffer, length: int, advantages: Tensor, targets: Tensor):
        n, t = buf.n_envs, buf.horizon
        self.length = length
        self.n_chunks = n * math.ceil(t / length)
        pad = (-t) % length

        def cut(x: Tensor) -> Tensor:
            if pad:
                x = torch.cat([x, x.new_zeros((n, pad, *x.shape[2:]))], dim=1)
            return x.reshape(self.n_chunks, length, *x.shape[2:])

        self.valid = cut(torch.ones(n, t, dtype=torch.bool, device=buf.device))
        self.obs, self.blueprint_ids = cut(buf.obs), cut(buf.blueprint_ids)
        self.actions, self.old_log_probs = cut(buf.actions), cut(buf.log_probs)
        self.advantages, self.targets = cut(advantages), cut(targets)
        self.masks = {name: cut(m) for name, m in buf.masks.items()}
        if pad:  # padded steps: op 0 valid so no head is fully masked (no boolean index:
            self.masks["op"][..., 0] |= ~self.valid  # that would read the device)
        if length == t:
            self.hidden0: Hidden = buf.hidden0
        else:
            self.hidden0 = buf.chunk_start_hidden(length)

    def masks_at(self, idx: Tensor) -> ActionMasks:
        return ActionMasks(**{name: m[idx] for name, m in self.masks.items()})


class _Step:
    """Loss and diagnostics of one minibatch."""

    def __init__(self, loss: Tensor, kl: Tensor, stats: dict[str, Tensor]) -> None:
        self.loss, self.kl, self.stats = loss, kl, stats


def _normalised(adv: Tensor, valid: Tensor) -> Tensor:
    """Advantages standardised over the minibatch's valid steps."""
    m = valid.to(adv.dtype)
    count = m.sum().clamp(min=1.0)
    mean = (adv * m).sum() / count
    var = ((adv - mean).square() * m).sum() / count
    return (adv - mean) / (var.sqrt() + ADVANTAGE_EPS)


class PPOUpdater:
    """Owns the Adam optimizer; ``update`` runs one PPO update on a filled buffer."""

    def __init__(
        self,
        policy: nn.Module,
        cfg: PPOConfig,
        *,
        value_normalizer: ValueNormalizer,
        seed: int = 0,
        sync: UpdateSync | None = None,
    ) -> None:
        if not hasattr(policy, "evaluate_actions"):
            raise TypeError("PPOUpdater needs a policy with evaluate_actions()")
        self.policy = policy
        self.cfg = cfg
        self.seed = seed
        self.value_normalizer = value_normalizer
        #: Multi-rank: gradients (with the loss and KL that gate the update) averaged
        #: over ranks before clipping, so every replica takes the same step.
        self.sync = sync
        # Fused: one kernel for every parameter's step, and no per-parameter host read
        # of the step count (the for-loop and foreach implementations make one).
        self.optimizer = torch.optim.Adam(
            policy.parameters(), lr=cfg.lr, eps=cfg.adam_eps, fused=True
        )
        self._relevance: Tensor | None = None
        #: ``ppo.head_entropy_weights`` per head, on the update's device (unset: every
        #: head 1, and no extra kernel).
        self._entropy_weights: Tensor | None = None

    # --- Schedules -------------------------------------------------------------------

    def entropy_coef(self, round_index: int, total_rounds: int | None = None) -> float:
        """Linear anneal from ``entropy_coef`` to the floor over ``entropy_anneal_rounds``.

        ``entropy_anneal_rounds == 0`` means no annealing. ``total_rounds`` is accepted
        for callers that report the schedule; the anneal length does not depend on it.
        """
        start, floor = self.cfg.entropy_coef, self.cfg.entropy_coef_floor
        rounds = self.cfg.entropy_anneal_rounds
        if rounds == 0:
            return max(start, floor)
        frac = min(max(round_index, 0) / rounds, 1.0)
        return max(start + (floor - start) * frac, floor)

    def learning_rate(self, round_index: int) -> float:
        """Linear anneal from ``lr`` to ``lr * lr_final_fraction`` over ``lr_anneal_rounds``."""
        rounds = self.cfg.lr_anneal_rounds
        if rounds == 0:
            return self.cfg.lr
        frac = min(max(round_index, 0) / rounds, 1.0)
        return self.cfg.lr * (1.0 - (1.0 - self.cfg.lr_final_fraction) * frac)

    # --- Update ----------------------------------------------------------------------

    def _entropy_weighted(self, rel: Tensor) -> Tensor:
        """``rel`` [.., heads] times each head's entropy weight (``rel`` itself when unset)."""
        if not self.cfg.head_entropy_weights:
            return rel
        if self._entropy_weights is None or self._entropy_weights.device != rel.device:
            weights = [self.cfg.head_entropy_weights.get(h, 1.0) for h in HEAD_NAMES]
            self._entropy_weights = torch.tensor(weights, dtype=rel.dtype, device=rel.device)
        return rel * self._entropy_weights

    def _relevant(self, actions: Tensor) -> Tensor:
        if self._relevance is None or self._relevance.device != actions.device:
            self._relevance = relevance_table(actions.device)
        return self._relevance[actions[..., 0]]

    def _minibatch(
        self,
        ch: _Chunks,
        idx: Tensor,
        entropy_coef: float,
        loss_hook: Callable[[Tensor], Tensor] | None,
    ) -> _Step:
        net: RecurrentActorCritic = self.policy  # type: ignore[assignment]
        hidden = (ch.hidden0[0][:, idx], ch.hidden0[1][:, idx])
        actions, valid = ch.actions[idx], ch.valid[idx]
        out = net.evaluate_actions(
            ch.obs[idx], ch.blueprint_ids[idx], ch.masks_at(idx), actions, hidden
        )
        relevant = self._relevant(actions) & valid.unsqueeze(-1)
        rel = relevant.to(out.log_probs.dtype)
        log_ratio = (out.log_probs - ch.old_log_probs[idx]) * rel  # irrelevant heads: 0
        ratio = log_ratio.exp()
        adv = ch.advantages[idx]
        if self.cfg.normalize_advantages:
            adv = _normalised(adv, valid)
        adv = adv.unsqueeze(-1)
        clipped = ratio.clamp(1.0 - self.cfg.clip, 1.0 + self.cfg.clip)
        per_head = -torch.minimum(ratio * adv, clipped * adv) * rel
        n_valid = valid.sum().clamp(min=1).to(rel.dtype)
        policy_loss = per_head.sum() / n_valid
        entropy_bonus = (out.entropy * self._entropy_weighted(rel)).sum() / n_valid
        sq_err = (out.values - ch.targets[idx]).square() * valid.to(rel.dtype)
        value_loss = VALUE_LOSS_SCALE * sq_err.sum() / n_valid
        loss = policy_loss + self.cfg.value_coef * value_loss - entropy_coef * entropy_bonus
        if loss_hook is not None:
            loss = loss_hook(loss)
        joint = log_ratio.sum(dim=-1).detach()
        kl = _masked_mean(joint.exp() - 1.0 - joint, valid, (0, 1))  # k3: unbiased, >= 0
        clip_hit = ((ratio.detach() - 1.0).abs() > self.cfg.clip).to(rel.dtype)
        ent = out.entropy.detach()
        stats = {
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            # [3, heads]: entropy and clip hits summed where relevant, and the counts;
            # the epoch's packet turns every minibatch's sums into means at once.
            "head_sums": torch.stack([ent * rel, clip_hit * rel, rel]).sum(dim=(1, 2)),
            "ratio_max": joint.masked_fill(~valid, 0.0).exp().max(),
        }
        return _Step(loss, kl, stats)

    def _inputs_finite(self, buf: RolloutBuffer) -> Tensor:
        """Whether the rollout is finite (on every rank), as a device flag: it is read
        with the first epoch's packet, and a non-finite rollout restores the snapshot."""
        checks = torch.stack(
            [
                torch.isfinite(t).all()
                for t in (buf.advantages, buf.returns, buf.values, buf.log_probs, buf.obs)
            ]
        )
        return checks.all() if self.sync is None else self.sync.all_true(checks.all())

    def _snapshot(self) -> dict[str, Any]:
        return {
            "policy": {k: v.detach().clone() for k, v in self.policy.state_dict().items()},
            "optimizer": _cloned(self.optimizer.state_dict()),
            "value_norm": self.value_normalizer.state_dict(),
        }

    def _restore(self, snap: dict[str, Any]) -> None:
        self.policy.load_state_dict(snap["policy"])
        self.optimizer.load_state_dict(snap["optimizer"])
        self.value_normalizer.load_state_dict(snap["value_norm"])
        self.optimizer.zero_grad(set_to_none=True)

    def _value_targets(self, buf: RolloutBuffer) -> Tensor:
        """Update the return scale, keep the critic's raw predictions where they were."""
        old_scale = self.value_normalizer.scale.clone()
        self.value_normalizer.update(buf.returns)
        rescale = getattr(self.policy, "rescale_value_output", None)
        if rescale is not None:
            rescale(old_scale / self.value_normalizer.scale)
        return self.value_normalizer.normalize(buf.returns)

    def _chunk_length(self, buf: RolloutBuffer) -> int:
        if not buf.hidden_stored or self.cfg.chunk_length == 0:
            return buf.horizon  # whole env rows from hidden0
        return min(self.cfg.chunk_length, buf.horizon)

    def update(
        self,
        buffer: RolloutBuffer,
        *,
        round_index: int,
        total_rounds: int,
        loss_hook: Callable[[Tensor], Tensor] | None = None,
    ) -> PpoUpdate:
        """One PPO update on a buffer whose advantages are computed.

        ``loss_hook`` transforms the scalar loss before backward (fault injection and
        tests use it to make the loss non-finite).
        """
        if not buffer.advantages_ready:
            raise RuntimeError("compute_returns_and_advantages() must run before update()")
        coef = self.entropy_coef(round_index, total_rounds)
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(round_index)
        base = torch.cat([self._base_stats(buffer), self._inputs_finite(buffer).reshape(1)])
        n_trans = buffer.n_envs * buffer.horizon
        snap = self._snapshot()
        self.policy.train()
        chunks = _Chunks(
            buffer, self._chunk_length(buffer), buffer.advantages, self._value_targets(buffer)
        )
        gen = torch.Generator().manual_seed(self.seed * MINIBATCH_SEED_STRIDE + round_index)
        n_mb = min(self.cfg.minibatches, chunks.n_chunks)
        epochs, early, skip_reason = 0, False, ""
        vals: list[float] = []
        for epoch in range(self.cfg.update_epochs):
            order = torch.randperm(chunks.n_chunks, generator=gen).to(
                buffer.device, non_blocking=True
            )
            steps_ = [self._step(chunks, idx, coef, loss_hook) for idx in order.tensor_split(n_mb)]
            vals = host_copy(self._packet(steps_, base))  # the epoch's one host read
            skip_reason = self._skip_reason(vals, len(steps_), epoch)
            if skip_reason:
                self._restore(snap)
                epochs = 0
                break
            epochs += 1
            kls = vals[1 : len(GATE_VALUES) * len(steps_) : len(GATE_VALUES)]
            if self.cfg.target_kl is not None and any(k > self.cfg.target_kl for k in kls):
                early = True
                break
        self.optimizer.zero_grad(set_to_none=True)
        metrics = vals[len(GATE_VALUES) * n_mb :]
        return self._metrics(metrics, coef, epochs, epochs * n_mb, early, skip_reason, n_trans)

    def _step(
        self,
        ch: _Chunks,
        idx: Tensor,
        entropy_coef: float,
        loss_hook: Callable[[Tensor], Tensor] | None,
    ) -> _Step:
        """One minibatch: loss, backward, rank average, clip, Adam step (no host read).

        A non-finite loss or gradient is found in the epoch's packet; the steps taken
        after it are undone with the rest of the update by the snapshot restore.
        """
        st = self._minibatch(ch, idx, entropy_coef, loss_hook)
        self.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(st.loss)
        if self.sync is not None:
            st.loss, st.kl = self.sync.average_grads(
                self.policy.parameters(), torch.stack([st.loss.detach(), st.kl])
            )
        params = self.policy.parameters()
        grad_norm = nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm, foreach=True)
        st.stats["grad_norm"] = grad_norm.detach()
        self.optimizer.step()
        return st

    def _skip_reason(self, vals: list[float], n_steps: int, epoch: int) -> str:
        """Why the update must be undone ("" if it may go on), from an epoch's packet."""
        if not METRICS_LAYOUT.one(vals[len(GATE_VALUES) * n_steps :], "inputs_finite"):
            return "non-finite rollout data"
        for j in range(n_steps):
            loss, _, grad_norm = vals[len(GATE_VALUES) * j : len(GATE_VALUES) * (j + 1)]
            if not math.isfinite(loss):
                return f"non-finite loss at epoch {epoch}"
            if not math.isfinite(grad_norm):
                return f"non-finite gradient at epoch {epoch}"
        return ""

    def _packet(self, steps_: list[_Step], base: Tensor) -> Tensor:
        """One epoch's values for the host, in one tensor: per minibatch GATE_VALUES,
        then METRICS_LAYOUT (diagnostics averaged NaN-aware over the epoch, then
        ``base``)."""
        lay = METRICS_LAYOUT

        def avg(key: str) -> Tensor:
            return torch.stack([st.stats[key].float() for st in steps_]).nanmean(dim=0)

        gates = torch.stack(
            [torch.stack([st.loss.detach(), st.kl, st.stats["grad_norm"]]) for st in steps_]
        )
        # Per minibatch, entropy and clip fraction where relevant: per head, and overall.
        sums = torch.stack([st.stats["head_sums"] for st in steps_]).float()  # [mb, 3, heads]
        heads = sums[:, :2] / _nan_if_zero(sums[:, 2:])
        overall = sums[:, :2].sum(dim=2) / _nan_if_zero(sums[:, 2].sum(dim=1, keepdim=True))
        entropy, clip_frac = overall.nanmean(dim=0)
        entropy_heads, clip_heads = heads.nanmean(dim=0)
        parts = {  # METRICS_LAYOUT's fields before BASE_STATS, in its order
            "policy_loss": avg("policy_loss").reshape(1),
            "value_loss": avg("value_loss").reshape(1),
            "entropy": entropy.reshape(1),
            "clip_frac": clip_frac.reshape(1),
            "approx_kl": torch.stack([st.kl.float() for st in steps_]).nanmean().reshape(1),
            "grad_norm": avg("grad_norm").reshape(1),
            "ratio_max": torch.stack([st.stats["ratio_max"] for st in steps_]).max().reshape(1),
            "entropy_heads": entropy_heads,
            "clip_heads": clip_heads,
        }
        assert tuple(parts) == lay.names[: len(parts)]
        return torch.cat([gates.float().reshape(-1), *(t.float() for t in parts.values()), base])

    def _base_stats(self, buf: RolloutBuffer) -> Tensor:
        """Explained variance (raw scale, pre-update), value and return means."""
        ret, val = buf.returns, buf.values
        var_ret = ret.var()
        ev = 1.0 - (ret - val).var() / var_ret.masked_fill(var_ret == 0, math.nan)
        return torch.stack([ev, val.mean(), ret.mean()]).float()  # BASE_STATS order

    def _metrics(
        self,
        vals: list[float],
        coef: float,
        epochs: int,
        steps: int,
        early: bool,
        skip_reason: str,
        n_transitions: int,
    ) -> PpoUpdate:
        """The update's diagnostics from the last epoch's packet (METRICS_LAYOUT)."""
        lay = METRICS_LAYOUT
        lay.check(vals)
        if skip_reason == "non-finite rollout data":  # nothing was learned from it
            vals = [math.nan] * (lay.width - len(BASE_STATS)) + vals[-len(BASE_STATS) :]
        ent_h, clip_h = lay.get(vals, "entropy_heads"), lay.get(vals, "clip_heads")
        per_head: dict[str, Any] = {f"entropy_{h}": ent_h[i] for i, h in enumerate(HEAD_NAMES)}
        per_head.update({f"clip_frac_{h}": clip_h[i] for i, h in enumerate(HEAD_NAMES)})
        return PpoUpdate(
            policy_loss=lay.one(vals, "policy_loss"),
            value_loss=lay.one(vals, "value_loss"),
            entropy=lay.one(vals, "entropy"),
            clip_frac=lay.one(vals, "clip_frac"),
            approx_kl=lay.one(vals, "approx_kl"),
            explained_variance=lay.one(vals, "explained_variance"),
            grad_norm=lay.one(vals, "grad_norm"),
            lr=float(self.optimizer.param_groups[0]["lr"]),
            entropy_coef=coef,
            epochs_run=epochs,
            minibatches=steps,
            early_stopped=early,
            skipped=bool(skip_reason),
            skip_reason=skip_reason,
            n_transitions=n_transitions,
            ratio_max=lay.one(vals, "ratio_max"),
            value_mean=lay.one(vals, "value_mean"),
            return_mean=lay.one(vals, "return_mean"),
            **per_head,
        )

    # --- Checkpoint ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
