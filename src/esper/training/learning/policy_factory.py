"""Build the policy a config asks for: the PPO actor-critic or one of the baselines."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import torch

from esper.config import Config, PolicyConfig
from esper.core.enums import LifecycleOp, PolicyKind
from esper.policy.actions import ActionSpace
from esper.policy.eager import EagerPolicy
from esper.policy.features import obs_dim
from esper.policy.heuristic import HeuristicPolicy
from esper.policy.network import FactoredActorCritic
from esper.policy.protocol import Policy
from esper.policy.random_valid import RandomValidPolicy
from esper.policy.static import StaticPolicy

#: The baselines (every kind but PPO), each built from the action space and ``[policy]``.
BASELINES: Final[dict[PolicyKind, Callable[[ActionSpace, PolicyConfig], Policy]]] = {
    PolicyKind.HEURISTIC: HeuristicPolicy,
    PolicyKind.EAGER: EagerPolicy,
    PolicyKind.RANDOM: RandomValidPolicy,
    PolicyKind.STATIC: StaticPolicy,
}

#: Offset separating the policy-initialisation stream from the host and sampling seeds.
POLICY_INIT_SEED_OFFSET = 104_729


def op_prior_logits(cfg: Config) -> list[float]:
    """``policy.op_prior`` as one initial logit per op, in op-head order."""
    prior = {str(name): bias for name, bias in cfg.policy.op_prior.items()}
    return [prior.get(op.name.lower(), 0.0) for op in LifecycleOp]


def build_policy(cfg: Config, space: ActionSpace) -> Policy:
    baseline = BASELINES.get(cfg.policy.kind)
    if baseline is not None:
        return baseline(space, cfg.policy)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.run.seed + POLICY_INIT_SEED_OFFSET)
        net = FactoredActorCritic(
            obs_dim(space.n_slots, host_features=cfg.observes_host),
            space,
            feature_dim=cfg.policy.feature_dim,
            lstm_hidden=cfg.policy.lstm_hidden,
            blueprint_embed_dim=cfg.policy.blueprint_embed_dim,
            op_prior=op_prior_logits(cfg),
        )
    net = net.to(torch.device(cfg.run.device))
    if cfg.policy.compile:
        # Only the network's forward is compiled; sampling and masking stay eager.
        net.compile()
    return net
