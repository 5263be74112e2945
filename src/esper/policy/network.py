"""Factored recurrent actor-critic: feature net -> LSTM -> one head per action dimension.

The op is sampled first; every other head sees the LSTM output plus the chosen op
(one-hot), and the slot head's mask is the op's row of the [ops, S] slot mask. Heads
the op does not use are pinned to their canonical index with exactly zero log-prob and
zero entropy, so PPO ratios and entropy bonuses only involve decisions that mattered.
Masked logits use a large *finite* fill so a fully masked row can never produce NaN.

The network itself implements the :class:`~esper.policy.protocol.Policy` protocol
(``act(inp, hidden)``) and also accepts the tensor-level ``act(obs, blueprint_ids,
masks, hidden)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from esper.core.constants import CANONICAL_HEAD_VALUE, HEAD_NAMES, MASKED_LOGIT, RELEVANT_HEADS
from esper.core.enums import LifecycleOp
from esper.policy.actions import HEAD_INDEX, N_OPS, ActionSpace
from esper.policy.features import BLUEPRINT_VOCAB
from esper.policy.masks import ActionMasks
from esper.policy.protocol import EvalOutput, Hidden, PolicyInput, PolicyStep

_HIDDEN_GAIN = math.sqrt(2.0)
_POLICY_GAIN = 0.01  # near-uniform initial policy
_VALUE_GAIN = 1.0
_FORGET_BIAS = 1.0


def masked_log_softmax(logits: Tensor, mask: Tensor) -> Tensor:
    """Log-probs (float32) with masked choices at probability exactly 0."""
    return torch.log_softmax(logits.float().masked_fill(~mask, MASKED_LOGIT), dim=-1)


def normalised_entropy(log_probs: Tensor, mask: Tensor) -> Tensor:
    """Entropy / log(#valid) in [0, 1]; 0 when at most one choice is valid."""
    ent = -(log_probs.exp() * log_probs).sum(dim=-1)
    n_valid = mask.sum(dim=-1)
    scale = n_valid.clamp(min=2).to(ent.dtype).log()
    return torch.where(n_valid > 1, ent / scale, torch.zeros_like(ent))


def _choose(log_probs: Tensor, generator: torch.Generator | None, deterministic: bool) -> Tensor:
    if deterministic:
        return log_probs.argmax(dim=-1)
    return torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(-1)


class FactoredActorCritic(nn.Module):
    """One batched forward decides for all envs; see the module docstring for the heads."""

    relevance: Tensor
    canonical: Tensor
    op_one_hot: Tensor
    head_columns: Tensor

    def __init__(
        self,
        obs_dim: int,
        space: ActionSpace,
        *,
        feature_dim: int,
        lstm_hidden: int,
        blueprint_embed_dim: int,
        op_prior: Sequence[float] | None = None,
    ) -> None:
        """``op_prior``: initial op-head bias, one logit per op (default all 0: uniform)."""
        super().__init__()
        self.space = space
        self.obs_dim = obs_dim
        self.lstm_hidden = lstm_hidden
        sizes = space.head_sizes
        self.blueprint_embed = nn.Embedding(BLUEPRINT_VOCAB, blueprint_embed_dim)
        in_dim = obs_dim + space.n_slots * blueprint_embed_dim
        self.feature_net = nn.Sequential(
            nn.Linear(in_dim, feature_dim),
            nn.LayerNorm(feature_dim),
            nn.ReLU(),
            nn.Linear(feature_dim, feature_dim),
            nn.ReLU(),
        )
        self.lstm = nn.LSTM(feature_dim, lstm_hidden, batch_first=True)
        self.core_norm = nn.LayerNorm(lstm_hidden)
        self.op_head = nn.Linear(lstm_hidden, N_OPS)
        sub_heads = [nn.Linear(lstm_hidden + N_OPS, sizes[name]) for name in HEAD_NAMES[1:]]
        self.sub_heads = nn.ModuleDict(dict(zip(HEAD_NAMES[1:], sub_heads, strict=True)))
        # The same heads, and their sizes, in head order: what every decision and
        # minibatch reads (a plain tuple: no module lookups per call).
        self._sub_linears: tuple[nn.Linear, ...] = tuple(sub_heads)
        self._sub_sizes = tuple(sizes[name] for name in HEAD_NAMES[1:])
        self.value_head = nn.Sequential(
            nn.Linear(lstm_hidden, feature_dim), nn.ReLU(), nn.Linear(feature_dim, 1)
        )
        relevance = torch.tensor(
            [[name in RELEVANT_HEADS[LifecycleOp(o)] for name in HEAD_NAMES] for o in range(N_OPS)]
        )
        self.register_buffer("relevance", relevance, persistent=False)
        canonical = torch.tensor([CANONICAL_HEAD_VALUE[name] for name in HEAD_NAMES])
        self.register_buffer("canonical", canonical, persistent=False)
        # Rows of the identity: indexing it one-hot encodes the op without F.one_hot's
        # host-side range check (a device sync on every decision on CUDA).
        self.register_buffer("op_one_hot", torch.eye(N_OPS), persistent=False)
        # Column of each head's logits in the [heads, widest] layout of all heads at once.
        widths = [sizes[name] for name in HEAD_NAMES]
        self.widest = max(widths)
        columns = [h * self.widest + j for h, w in enumerate(widths) for j in range(w)]
        self.register_buffer("head_columns", torch.tensor(columns), persistent=False)
        self._init_weights(op_prior)

    def _init_weights(self, op_prior: Sequence[float] | None) -> None:
        for module in self.feature_net:
            if isinstance(module, nn.Linear):
                nn.init.orthogonal_(module.weight, _HIDDEN_GAIN)
                nn.init.zeros_(module.bias)
        for head in [self.op_head, *self.sub_heads.values()]:
            assert isinstance(head, nn.Linear)
            nn.init.orthogonal_(head.weight, _POLICY_GAIN)
            nn.init.zeros_(head.bias)
        if op_prior is not None:
            with torch.no_grad():
                self.op_head.bias.copy_(torch.tensor(list(op_prior), dtype=torch.float32))
        value_out = self.value_head[-1]
        assert isinstance(value_out, nn.Linear)
        nn.init.orthogonal_(value_out.weight, _VALUE_GAIN)
        nn.init.zeros_(value_out.bias)
        hid = self.lstm_hidden
        with torch.no_grad():
            for name, param in self.lstm.named_parameters():
                if name.startswith("bias"):
                    param.zero_()
                if name.startswith("bias_ih"):
                    param[hid : 2 * hid] = _FORGET_BIAS  # forget gate (i, f, g, o order)

    def initial_hidden(self, n: int, device: torch.device | str) -> Hidden:
        zeros = torch.zeros(1, n, self.lstm_hidden, device=device)
        return zeros, zeros.clone()

    def _encode(self, obs: Tensor, blueprint_ids: Tensor) -> Tensor:
        emb = self.blueprint_embed(blueprint_ids).flatten(start_dim=-2)
        out: Tensor = self.feature_net(torch.cat([obs.float(), emb], dim=-1))
        return out

    def _head_logits(self, core: Tensor, op: Tensor) -> Tensor:
        """Every head's logits side by side [M, sum of head sizes] (the op head's, then
        the sub-heads', which see the op): two matmuls, not one per head."""
        x = torch.cat([core, self.op_one_hot[op].to(core.dtype)], dim=-1)
        weight = torch.cat([h.weight for h in self._sub_linears])
        bias = torch.cat([h.bias for h in self._sub_linears])
        return torch.cat([self.op_head(core), F.linear(x, weight, bias)], dim=-1)

    def _head_masks(self, masks: ActionMasks, op: Tensor) -> Tensor:
        """Every head's mask side by side [M, sum of head sizes] (the slot head's is the
        chosen op's row of the slot mask)."""
        parts = [getattr(masks, name) for name in HEAD_NAMES]
        parts[HEAD_INDEX["slot"]] = masks.slot_for_op(op)
        return torch.cat(parts, dim=-1)

    def _padded(self, flat: Tensor, fill: float | bool) -> Tensor:
        """[M, sum of sizes] -> [M, heads, largest size], ``fill`` beyond each head."""
        out = flat.new_full((flat.shape[0], len(HEAD_NAMES) * self.widest), fill)
        return out.index_copy(1, self.head_columns, flat).view(flat.shape[0], len(HEAD_NAMES), -1)

    def _score_heads(
        self, core: Tensor, masks: ActionMasks, actions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """(log_probs, entropy) [M, heads] of given actions: all heads at once, padded to
        the widest head (padding masked), so a PPO minibatch costs a few kernels per
        head set rather than a dozen per head."""
        op = actions[:, 0]
        mask = self._padded(self._head_masks(masks, op), False)
        lp = masked_log_softmax(self._padded(self._head_logits(core, op), MASKED_LOGIT), mask)
        chosen = lp.gather(2, actions[:, :, None]).squeeze(2)
        return self._relevant_only(op, chosen, normalised_entropy(lp, mask))

    def _relevant_only(
        self, op: Tensor, log_probs: Tensor, entropy: Tensor
    ) -> tuple[Tensor, Tensor]:
        relevant = self.relevance[op]
        zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
        return torch.where(relevant, log_probs, zero), torch.where(relevant, entropy, zero)

    def _sample_heads(
        self,
        core: Tensor,
        masks: ActionMasks,
        generator: torch.Generator | None,
        deterministic: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(actions, log_probs, entropy, op_probs) [M, ...]: the op first, then every
        other head given it (each sampled from its own distribution, in head order)."""
        op_lp = masked_log_softmax(self.op_head(core), masks.op)
        op = _choose(op_lp, generator, deterministic)
        mask = self._padded(self._head_masks(masks, op), False)
        lp = masked_log_softmax(self._padded(self._head_logits(core, op), MASKED_LOGIT), mask)
        chosen = [op]
        for h, size in enumerate(self._sub_sizes):
            chosen.append(_choose(lp[:, h + 1, :size], generator, deterministic))
        actions = torch.where(self.relevance[op], torch.stack(chosen, dim=1), self.canonical)
        log_probs, entropy = self._relevant_only(
            op, lp.gather(2, actions[:, :, None]).squeeze(2), normalised_entropy(lp, mask)
        )
        return actions, log_probs, entropy, op_lp.exp()

    def forward(
        self, obs: Tensor, blueprint_ids: Tensor, hidden: Hidden, resets: Tensor | None = None
    ) -> tuple[Tensor, Hidden, Tensor]:
        """The trunk over [N, T, ...]: (core [N, T, H], final hidden, values [N, T]).

        Sampling and masking stay outside, so ``module.compile()`` compiles only this.
        ``resets[n, t]`` zeroes env n's recurrent state before step t.
        """
        n, t = obs.shape[:2]
        x = self._encode(obs.flatten(0, 1), blueprint_ids.flatten(0, 1)).view(n, t, -1)
        if resets is None:
            out, new_hidden = self.lstm(x, hidden)
        else:
            h, c = hidden
            outs = []
            for i in range(t):
                keep = (~resets[:, i]).to(x.dtype).view(1, -1, 1)
                o, (h, c) = self.lstm(x[:, i : i + 1], (h * keep, c * keep))
                outs.append(o)
            out, new_hidden = torch.cat(outs, dim=1), (h, c)
        core = self.core_norm(out)
        values = self.value_head(core).squeeze(-1)
        return core, new_hidden, values

    @overload
    def act(
        self,
        inp: PolicyInput,
        hidden: Hidden,
        /,
        *,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> PolicyStep: ...

    @overload
    def act(
        self,
        obs: Tensor,
        blueprint_ids: Tensor,
        masks: ActionMasks,
        hidden: Hidden,
        /,
        *,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> PolicyStep: ...

    @torch.no_grad()
    def act(
        self,
        *args: Any,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> PolicyStep:
        """One decision for N envs, one forward for all of them.

        Either ``act(inp, hidden)`` (the :class:`~esper.policy.protocol.Policy` form) or
        ``act(obs [N, D], blueprint_ids [N, S], masks [N, ...], hidden)``. Runs under
        ``no_grad`` (not inference mode) so its outputs, hidden state included, can be
        stored and fed back into :meth:`evaluate_actions`.
        """
        if len(args) == 2 and isinstance(args[0], PolicyInput):
            inp, hidden = args
            obs, blueprint_ids, masks = inp.obs, inp.blueprint_ids, inp.masks
        elif len(args) == 4:
            obs, blueprint_ids, masks, hidden = args
        else:
            raise TypeError("act(inp, hidden) or act(obs, blueprint_ids, masks, hidden)")
        core, new_hidden, values = self(obs.unsqueeze(1), blueprint_ids.unsqueeze(1), hidden)
        actions, log_probs, entropy, op_probs = self._sample_heads(
            core.squeeze(1), masks, generator, deterministic
        )
        return PolicyStep(actions, log_probs, values.squeeze(1), op_probs, entropy, new_hidden)

    def evaluate_actions(
        self,
        obs: Tensor,
        blueprint_ids: Tensor,
        masks: ActionMasks,
        actions: Tensor,
        hidden0: Hidden,
        *,
        resets: Tensor | None = None,
    ) -> EvalOutput:
        """Score stored actions over a rollout [N, T, ...] by a full unroll from ``hidden0``.

        ``resets[n, t]`` zeroes env n's recurrent state before step t (an episode began
        there). The masking is the same as in :meth:`act`, so the log-probs match.
        """
        n, t = obs.shape[:2]
        core, _, values = self(obs, blueprint_ids, hidden0, resets)
        log_probs, entropy = self._score_heads(
            core.reshape(n * t, -1), masks.flatten_batch(), actions.reshape(n * t, -1)
        )
        return EvalOutput(log_probs.view(n, t, -1), entropy.view(n, t, -1), values)

    @torch.no_grad()
    def rescale_value_output(self, factor: Tensor) -> None:
        """Multiply the value output by ``factor`` (the value normaliser's old/new scale),
        so raw-scale predictions survive a change of the target scale (PopArt)."""
        out = self.value_head[-1]
        assert isinstance(out, nn.Linear)
        f = factor.to(out.weight.device, out.weight.dtype)
        out.weight.mul_(f)
        out.bias.mul_(f)

    @torch.no_grad()
    def predict_value(self, obs: Tensor, blueprint_ids: Tensor, hidden: Hidden) -> Tensor:
        """V(s) [N] without sampling (evaluation and tests; training needs no bootstrap)."""
        values: Tensor = self(obs.unsqueeze(1), blueprint_ids.unsqueeze(1), hidden)[2]
        return values.squeeze(1)
