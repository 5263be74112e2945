"""The static host as a policy: it always WAITs, so no seed is ever germinated.

The floor every growing policy is measured against (paired by seed and round, it
trains exactly the hosts the others start from).
"""

from __future__ import annotations

import torch

from esper.config import PolicyConfig
from esper.core.constants import CANONICAL_HEAD_VALUE, HEAD_NAMES
from esper.core.enums import LifecycleOp
from esper.policy.actions import N_HEADS, N_OPS, ActionSpace
from esper.policy.protocol import Hidden, PolicyInput, PolicyStep, stateless_hidden


class StaticPolicy:
    """WAIT for every env at every step (other heads at their canonical values)."""

    def __init__(self, space: ActionSpace, cfg: PolicyConfig | None = None) -> None:
        del cfg  # nothing to configure
        self.space = space
        canonical = [CANONICAL_HEAD_VALUE[name] for name in HEAD_NAMES]
        canonical[0] = int(LifecycleOp.WAIT)
        self._wait = torch.tensor(canonical, dtype=torch.long)

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
        """WAIT, always valid (``generator``/``deterministic`` are unused)."""
        del generator, deterministic
        n, device = inp.obs.shape[0], inp.obs.device
        if self._wait.device != device:  # moved once, on the first step
            self._wait = self._wait.to(device, non_blocking=True)
        actions = self._wait.repeat(n, 1)
        zeros = torch.zeros(n, N_HEADS, device=device)
        return PolicyStep(
            actions=actions,
            log_probs=zeros,
            value=torch.zeros(n, device=device),
            op_probs=torch.eye(N_OPS, device=device)[actions[:, 0]],  # one_hot reads the host
            entropy=zeros.clone(),
            hidden=hidden,
        )
