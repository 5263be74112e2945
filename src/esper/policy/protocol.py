"""What the trainer calls on a policy, learned or heuristic.

Both policies take a :class:`PolicyInput` (tensors for the network plus the host-side
context the heuristic reads) and return a :class:`PolicyStep` of tensors, so the trainer
moves actions, log-probs and values to the host in one transfer either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

from esper.core.records import SlotReport
from esper.policy.masks import ActionMasks
from esper.policy.signals import SignalTracker

#: Recurrent state (h, c), each [1, N, hidden]; policies without memory still carry it.
Hidden = tuple[Tensor, Tensor]


def stateless_hidden(n: int, device: torch.device | str) -> Hidden:
    """The recurrent state of a policy that keeps none: a width-1 placeholder, so the
    trainer stores and resets every policy's state the same way."""
    zeros = torch.zeros(1, n, 1, device=device)
    return zeros, zeros.clone()


class PolicyStep(NamedTuple):
    """One decision for N envs (all tensors on the policy device)."""

    actions: Tensor  # [N, H] long, irrelevant heads at their canonical value
    log_probs: Tensor  # [N, H] per head; exactly 0 for irrelevant heads
    value: Tensor  # [N]
    op_probs: Tensor  # [N, ops] masked op distribution
    entropy: Tensor  # [N, H] normalised by log(#valid); 0 if irrelevant or <= 1 valid
    hidden: Hidden


class EvalOutput(NamedTuple):
    """Re-evaluation of stored actions over a rollout (with gradients)."""

    log_probs: Tensor  # [N, T, H]
    entropy: Tensor  # [N, T, H]
    values: Tensor  # [N, T]


@dataclass(frozen=True)
class PolicyInput:
    """Everything a policy may read for one step.

    ``obs`` is already normalised (the trainer owns the normaliser); ``reports`` and
    ``trackers`` are the host-side context, one entry per env.
    """

    obs: Tensor  # [N, obs_dim]
    blueprint_ids: Tensor  # [N, S] long
    masks: ActionMasks
    reports: Sequence[Sequence[SlotReport]]
    trackers: Sequence[SignalTracker]


@runtime_checkable
class Policy(Protocol):
    def initial_hidden(self, n: int, device: torch.device | str) -> Hidden:
        """Fresh recurrent state for ``n`` new episodes."""
        ...

    def act(
        self,
        inp: PolicyInput,
        hidden: Hidden,
        *,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> PolicyStep:
        """Choose one action per env; actions are always valid under ``inp.masks``."""
        ...
