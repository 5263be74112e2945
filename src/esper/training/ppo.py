"""Recurrent PPO update over one whole [n_envs, T] rollout.

The rollout is a single batch: every epoch re-scores all stored actions by a full LSTM
unroll from each env's stored initial hidden state. The loss clips each action head's
ratio separately and counts a head only where the chosen op uses it (causal masking),
so a head that did not influence the action never receives gradient or entropy bonus.

The update is atomic: parameters, optimizer state and the value normaliser are
restored if any epoch produces a non-finite loss or gradient, and the metrics say so.
Everything is computed on the device with one small transfer per epoch (loss, KL and
gradient norm, needed for the finiteness gate and the KL early stop) plus one at the end.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from esper.config import PPOConfig
from esper.core.constants import HEAD_NAMES, RELEVANT_HEADS
from esper.core.enums import LifecycleOp
from esper.core.records import PPOMetrics
from esper.policy.masks import ActionMasks
from esper.policy.protocol import EvalOutput, Hidden
from esper.training.buffer import RolloutBuffer
from esper.training.normalizers import ValueNormalizer

#: Adam epsilon (PyTorch's default is 1e-8; 1e-5 is the usual PPO choice for stability).
ADAM_EPS = 1e-5
#: Added to the advantage std before dividing.
ADVANTAGE_EPS = 1e-8
#: Value loss is 0.5 * squared error (so its gradient is the plain error).
VALUE_LOSS_SCALE = 0.5


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
        device=device,
    )


def _masked_mean(x: Tensor, mask: Tensor, dims: tuple[int, ...]) -> Tensor:
    """Mean of ``x`` over ``dims`` where ``mask``; NaN where nothing is masked in."""
    m = mask.to(x.dtype)
    count = m.sum(dim=dims)
    return (x * m).sum(dim=dims) / count.masked_fill(count == 0, math.nan)


class _Epoch:
    """Loss and diagnostics of one forward pass over the rollout."""

    def __init__(self, loss: Tensor, kl: Tensor, stats: dict[str, Tensor]) -> None:
        self.loss, self.kl, self.stats = loss, kl, stats


class PPOUpdater:
    """Owns the Adam optimizer; ``update`` runs one PPO update on a filled buffer."""

    def __init__(
        self, policy: nn.Module, cfg: PPOConfig, *, value_normalizer: ValueNormalizer
    ) -> None:
        if not hasattr(policy, "evaluate_actions"):
            raise TypeError("PPOUpdater needs a policy with evaluate_actions()")
        self.policy = policy
        self.cfg = cfg
        self.value_normalizer = value_normalizer
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr, eps=ADAM_EPS)
        self._relevance: Tensor | None = None

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

    # --- Update ----------------------------------------------------------------------

    def _relevant(self, actions: Tensor) -> Tensor:
        if self._relevance is None or self._relevance.device != actions.device:
            self._relevance = relevance_table(actions.device)
        return self._relevance[actions[..., 0]]

    def _forward(
        self,
        buf: RolloutBuffer,
        masks: ActionMasks,
        relevant: Tensor,
        advantages: Tensor,
        targets: Tensor,
        entropy_coef: float,
        loss_hook: Callable[[Tensor], Tensor] | None,
    ) -> _Epoch:
        net: RecurrentActorCritic = self.policy  # type: ignore[assignment]
        out = net.evaluate_actions(buf.obs, buf.blueprint_ids, masks, buf.actions, buf.hidden0)
        rel = relevant.to(out.log_probs.dtype)
        log_ratio = (out.log_probs - buf.log_probs) * rel  # irrelevant heads: exactly 0
        ratio = log_ratio.exp()
        adv = advantages.unsqueeze(-1)
        clipped = ratio.clamp(1.0 - self.cfg.clip, 1.0 + self.cfg.clip)
        per_head = -torch.minimum(ratio * adv, clipped * adv) * rel
        policy_loss = per_head.sum(dim=-1).mean()
        entropy_bonus = (out.entropy * rel).sum(dim=-1).mean()
        value_loss = VALUE_LOSS_SCALE * (out.values - targets).square().mean()
        loss = policy_loss + self.cfg.value_coef * value_loss - entropy_coef * entropy_bonus
        if loss_hook is not None:
            loss = loss_hook(loss)
        joint = log_ratio.sum(dim=-1).detach()
        kl = (joint.exp() - 1.0 - joint).mean()  # k3 estimator: unbiased, >= 0
        clip_hit = ((ratio.detach() - 1.0).abs() > self.cfg.clip).to(rel.dtype)
        ent = out.entropy.detach()
        stats = {
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "entropy": _masked_mean(ent, relevant, (0, 1, 2)),
            "entropy_heads": _masked_mean(ent, relevant, (0, 1)),
            "clip_frac": _masked_mean(clip_hit, relevant, (0, 1, 2)),
            "clip_heads": _masked_mean(clip_hit, relevant, (0, 1)),
            "ratio_max": joint.exp().max(),
        }
        return _Epoch(loss, kl, stats)

    def _inputs_finite(self, buf: RolloutBuffer) -> bool:
        checks = torch.stack(
            [
                torch.isfinite(t).all()
                for t in (buf.advantages, buf.returns, buf.values, buf.log_probs, buf.obs)
            ]
        )
        return bool(checks.all())  # one transfer, before anything is modified

    def _snapshot(self) -> dict[str, Any]:
        return {
            "policy": {k: v.detach().clone() for k, v in self.policy.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "value_norm": self.value_normalizer.state_dict(),
        }

    def _restore(self, snap: dict[str, Any]) -> None:
        self.policy.load_state_dict(snap["policy"])
        self.optimizer.load_state_dict(snap["optimizer"])
        self.value_normalizer.load_state_dict(snap["value_norm"])
        self.optimizer.zero_grad(set_to_none=True)

    def update(
        self,
        buffer: RolloutBuffer,
        *,
        round_index: int,
        total_rounds: int,
        loss_hook: Callable[[Tensor], Tensor] | None = None,
    ) -> PPOMetrics:
        """One PPO update on a buffer whose advantages are computed.

        ``loss_hook`` transforms the scalar loss before backward (fault injection and
        tests use it to make the loss non-finite).
        """
        if not buffer.advantages_ready:
            raise RuntimeError("compute_returns_and_advantages() must run before update()")
        coef = self.entropy_coef(round_index, total_rounds)
        base = self._base_stats(buffer)
        n_trans = buffer.n_envs * buffer.horizon
        if not self._inputs_finite(buffer):
            return self._metrics(base, None, coef, 0, False, "non-finite rollout data", n_trans)
        snap = self._snapshot()
        self.policy.train()
        relevant = self._relevant(buffer.actions)
        advantages = buffer.advantages
        if self.cfg.normalize_advantages:
            advantages = (advantages - advantages.mean()) / (
                advantages.std(correction=0) + ADVANTAGE_EPS
            )
        self.value_normalizer.update(buffer.returns)
        targets = self.value_normalizer.normalize(buffer.returns)
        masks = buffer.stacked_masks()
        steps, early, skip_reason, last = 0, False, "", None
        for epoch in range(self.cfg.update_epochs):
            ep = self._forward(buffer, masks, relevant, advantages, targets, coef, loss_hook)
            self.optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(ep.loss)
            grad_norm = nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
            loss_v, kl_v, gn_v = torch.stack([ep.loss.detach(), ep.kl, grad_norm]).tolist()
            ep.stats["grad_norm"] = grad_norm.detach()
            last = ep
            if not (math.isfinite(loss_v) and math.isfinite(gn_v)):
                what = "loss" if not math.isfinite(loss_v) else "gradient"
                skip_reason = f"non-finite {what} at epoch {epoch}"
                self._restore(snap)
                steps = 0
                break
            if self.cfg.target_kl is not None and epoch > 0 and kl_v > self.cfg.target_kl:
                early = True  # this epoch's gradient is discarded
                break
            self.optimizer.step()
            steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return self._metrics(base, last, coef, steps, early, skip_reason, n_trans)

    def _base_stats(self, buf: RolloutBuffer) -> Tensor:
        """Explained variance (raw scale, pre-update), value and return means."""
        ret, val = buf.returns, buf.values
        var_ret = ret.var()
        ev = 1.0 - (ret - val).var() / var_ret.masked_fill(var_ret == 0, math.nan)
        return torch.stack([ev, val.mean(), ret.mean()])

    def _metrics(
        self,
        base: Tensor,
        ep: _Epoch | None,
        coef: float,
        steps: int,
        early: bool,
        skip_reason: str,
        n_transitions: int,
    ) -> PPOMetrics:
        n_heads = len(HEAD_NAMES)
        nan = torch.full((), math.nan, device=base.device)
        if ep is None:
            scalars = [nan] * 7
            heads = torch.full((2 * n_heads,), math.nan, device=base.device)
        else:
            s = ep.stats
            scalars = [
                s["policy_loss"],
                s["value_loss"],
                s["entropy"],
                s["clip_frac"],
                ep.kl,
                s["grad_norm"],
                s["ratio_max"],
            ]
            heads = torch.cat([s["entropy_heads"], s["clip_heads"]])
        packed = torch.cat([torch.stack([t.float() for t in scalars]), heads.float(), base.float()])
        vals = packed.tolist()  # the update's final device-to-host transfer
        pl, vl, ent, cf, kl, gn, rmax = vals[:7]
        ent_h, clip_h = vals[7 : 7 + n_heads], vals[7 + n_heads : 7 + 2 * n_heads]
        ev, v_mean, r_mean = vals[7 + 2 * n_heads :]
        per_head = {f"entropy_{h}": ent_h[i] for i, h in enumerate(HEAD_NAMES)}
        per_head.update({f"clip_frac_{h}": clip_h[i] for i, h in enumerate(HEAD_NAMES)})
        return PPOMetrics(
            policy_loss=pl,
            value_loss=vl,
            entropy=ent,
            clip_frac=cf,
            approx_kl=kl,
            explained_variance=ev,
            grad_norm=gn,
            lr=float(self.optimizer.param_groups[0]["lr"]),
            entropy_coef=coef,
            epochs_run=steps,
            minibatches=steps,
            early_stopped=early,
            skipped=bool(skip_reason),
            skip_reason=skip_reason,
            n_transitions=n_transitions,
            ratio_max=rmax,
            value_mean=v_mean,
            return_mean=r_mean,
            **per_head,
        )

    # --- Checkpoint ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
