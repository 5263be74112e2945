"""A random valid policy: uniform over the valid ops, then over each used head's choices.

The chance level of the action space: what a policy earns by acting without reading
anything. It samples from the generator the trainer hands every policy (seeded from the
run seed and checkpointed), so a run is reproducible and resumes exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from esper.config import PolicyConfig
from esper.core.constants import CANONICAL_HEAD_VALUE, HEAD_NAMES, RELEVANT_HEADS
from esper.core.enums import LifecycleOp
from esper.policy.actions import N_OPS, ActionSpace
from esper.policy.network import masked_log_softmax, normalised_entropy
from esper.policy.protocol import Hidden, PolicyInput, PolicyStep, stateless_hidden


def _uniform(mask: Tensor) -> Tensor:
    """Log-probs uniform over the valid choices of each row (all choices if none is)."""
    return masked_log_softmax(torch.zeros(mask.shape, device=mask.device), mask)


class RandomValidPolicy:
    """Draws the op uniformly among the valid ones, then every head the op uses
    uniformly among its valid choices; the other heads take their canonical values."""

    def __init__(self, space: ActionSpace, cfg: PolicyConfig | None = None) -> None:
        del cfg  # nothing to configure
        self.space = space
        self._relevance = torch.tensor(
            [[name in RELEVANT_HEADS[LifecycleOp(o)] for name in HEAD_NAMES] for o in range(N_OPS)]
        )
        self._canonical = torch.tensor([CANONICAL_HEAD_VALUE[name] for name in HEAD_NAMES])

    def initial_hidden(self, n: int, device: torch.device | str) -> Hidden:
        return stateless_hidden(n, device)

    def act(
        self,
        inp: PolicyInput,
        hidden: Hidden,
        *,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> PolicyStep:
        """Samples from ``generator`` (torch's global one when None); ``deterministic``
        takes each head's first valid choice instead."""
        masks = inp.masks
        op_lp = _uniform(masks.op)
        chosen: list[Tensor] = []
        log_probs: list[Tensor] = []
        entropy: list[Tensor] = []
        for name in HEAD_NAMES:
            if name == "op":
                lp, mask = op_lp, masks.op
            else:
                mask = masks.slot_for_op(chosen[0]) if name == "slot" else masks.head(name)
                lp = _uniform(mask)
            pick = (
                lp.argmax(dim=-1)
                if deterministic
                else torch.multinomial(lp.exp(), 1, generator=generator).squeeze(-1)
            )
            chosen.append(pick)
            log_probs.append(lp.gather(1, pick[:, None]))
            entropy.append(normalised_entropy(lp, mask))
        device = op_lp.device
        if self._relevance.device != device:  # moved once, on the first step
            self._relevance = self._relevance.to(device, non_blocking=True)
            self._canonical = self._canonical.to(device, non_blocking=True)
        relevant = self._relevance[chosen[0]]
        zero = torch.zeros((), device=device)
        return PolicyStep(
            actions=torch.where(relevant, torch.stack(chosen, dim=1), self._canonical),
            log_probs=torch.where(relevant, torch.cat(log_probs, dim=1), zero),
            value=torch.zeros(chosen[0].shape[0], device=device),
            op_probs=op_lp.exp(),
            entropy=torch.where(relevant, torch.stack(entropy, dim=1), zero),
            hidden=hidden,
        )
