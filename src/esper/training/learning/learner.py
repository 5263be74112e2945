"""The learning side of a run: policy, normalisers, rollout buffer and PPO update.

The trainer loop talks to one small interface (begin a round, act, record a step, roll
back an env's segment, end the round); this class composes the parts built in
``policy/`` and ``training/`` and owns their checkpointable state. A heuristic policy
uses the same class with learning switched off, so both commands emit the same events.
A frozen learner (``esper evaluate``) acts deterministically and updates nothing: no
PPO step, no normaliser statistics.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from esper.config import Config
from esper.core.enums import AmpMode, PolicyKind
from esper.core.layout import Layout
from esper.core.transfer import host_array, host_copy
from esper.policy.actions import N_HEADS, N_OPS, ActionSpace
from esper.policy.features import obs_dim
from esper.policy.masks import ActionMasks
from esper.policy.protocol import Policy, PolicyInput
from esper.telemetry.events import PpoUpdate
from esper.training.learning.buffer import RolloutBuffer
from esper.training.learning.normalizers import RewardNormalizer, RunningMeanStd, ValueNormalizer
from esper.training.learning.ppo import PPOUpdater

if TYPE_CHECKING:
    from esper.training.envs.env_results import Observation
    from esper.training.loop.distributed import Collective

#: Offset that separates the policy-sampling stream from every other seeded stream.
POLICY_SEED_OFFSET = 7_919

#: One env's row of the packed decision (the step's single device-to-host transfer).
DECISION_ROW = Layout(
    ("actions", N_HEADS), ("log_prob", 1), ("value", 1), ("op_probs", N_OPS), ("op_mask", N_OPS)
)


@dataclass
class Decision:
    """The policy's choice for all envs: device tensors for the buffer, and the packed
    host-side rows (one transfer) for execution and events, read as columns."""

    rows: np.ndarray  # [N, DECISION_ROW.width] float64
    obs_normalized: torch.Tensor  # what the policy saw; what the buffer stores
    blueprint_ids: torch.Tensor
    masks: ActionMasks
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    hidden: tuple[torch.Tensor, torch.Tensor]

    @property
    def heads(self) -> np.ndarray:
        """Every env's raw head indices [N, H], in HEAD_NAMES order."""
        heads: np.ndarray = self.rows[:, DECISION_ROW["actions"]].astype(np.int64)
        return heads

    @property
    def op_mask(self) -> np.ndarray:
        mask: np.ndarray = self.rows[:, DECISION_ROW["op_mask"]] != 0
        return mask

    @property
    def value(self) -> np.ndarray:
        return self.rows[:, DECISION_ROW.index("value")]

    @property
    def log_prob(self) -> np.ndarray:
        return self.rows[:, DECISION_ROW.index("log_prob")]

    @property
    def op_probs(self) -> np.ndarray:
        return self.rows[:, DECISION_ROW["op_probs"]]


def resolve_amp(cfg: Config, device: torch.device) -> AmpMode:
    """AMP only exists on CUDA; on CPU the resolved setting is OFF, reported in run_started
    and, when the config asked for AMP, with a warning (the CLI refuses it outright)."""
    if device.type == "cuda":
        return cfg.run.amp
    if cfg.run.amp != AmpMode.OFF:
        warnings.warn(
            f"run.amp = {cfg.run.amp.value!r} needs a CUDA device; running on {device} "
            "without mixed precision",
            stacklevel=3,
        )
    return AmpMode.OFF


class Learner:
    def __init__(
        self,
        cfg: Config,
        space: ActionSpace,
        policy: Policy,
        *,
        collective: Collective | None = None,
        frozen: bool = False,
        sample: bool = False,
    ) -> None:
        self.cfg = cfg
        self.space = space
        self.policy = policy
        self.device = torch.device(cfg.run.device)
        self.resolved_amp = resolve_amp(cfg, self.device)
        #: Evaluation: nothing updated; the most likely valid action, or with ``sample`` one
        #: drawn from the policy (seeded by the run seed, as in training).
        self.frozen = frozen
        self.deterministic = frozen and not sample
        self.learning = cfg.policy.kind == PolicyKind.PPO and not frozen
        dim = obs_dim(space.n_slots, host_features=cfg.observes_host)
        self.obs_norm = RunningMeanStd((dim,), device=self.device)
        self.reward_norm = RewardNormalizer(gamma=cfg.ppo.gamma, clip=cfg.reward.normalize_clip)
        self.value_norm = ValueNormalizer(device=self.device)  # with the values it scales
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(cfg.run.seed + POLICY_SEED_OFFSET)
        self._round_obs: list[torch.Tensor] = []
        self.buffer: RolloutBuffer | None = None
        self.updater: PPOUpdater | None = None
        if self.learning:
            assert isinstance(policy, torch.nn.Module)
            self.buffer = RolloutBuffer(
                n_envs=cfg.run.n_envs,
                horizon=cfg.run.episode_length,
                obs_dim=dim,
                n_slots=space.n_slots,
                head_sizes=space.head_sizes,
                lstm_hidden=cfg.policy.lstm_hidden,
                device=self.device,
            )
            self.updater = PPOUpdater(
                policy, cfg.ppo, value_normalizer=self.value_norm, seed=cfg.run.seed,
                sync=collective,
            )  # fmt: skip
        if collective is not None:
            collective.attach(self)

    # ------------------------------------------------------------------ rollout
    def begin_round(self, n_envs: int) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.policy.initial_hidden(n_envs, self.device)
        self.obs_norm.freeze()
        self.reward_norm.reset_returns()
        self._round_obs.clear()
        if self.buffer is not None:
            self.buffer.start(hidden)
        return hidden

    @torch.no_grad()
    def decide(self, o: Observation, hidden: tuple[torch.Tensor, torch.Tensor]) -> Decision:
        """Normalise the observation, ONE batched policy forward, ONE transfer."""
        self._round_obs.append(o.obs)
        obs_normalized = self.obs_norm.normalize(o.obs)
        inp = PolicyInput(
            obs=obs_normalized,
            blueprint_ids=o.blueprint_ids,
            masks=o.masks,
            reports=o.reports,
            trackers=o.trackers,
        )
        out = self.policy.act(
            inp, hidden, generator=self.generator, deterministic=self.deterministic
        )
        parts = {  # DECISION_ROW's fields, in its order
            "actions": out.actions.float(),
            "log_prob": out.log_probs.sum(dim=1, keepdim=True),
            "value": out.value.reshape(-1, 1).float(),
            "op_probs": out.op_probs.float(),
            "op_mask": o.masks.op.float(),
        }
        assert tuple(parts) == DECISION_ROW.names
        packed = torch.cat(list(parts.values()), dim=1)
        rows = host_copy(packed, array=True).astype(np.float64)  # the single transfer
        DECISION_ROW.check(rows[0])
        return Decision(
            rows=rows,
            obs_normalized=obs_normalized,
            blueprint_ids=o.blueprint_ids,
            masks=o.masks,
            actions=out.actions,
            log_probs=out.log_probs,
            values=out.value,
            hidden=out.hidden,
        )

    def record_step(
        self, step: int, d: Decision, raw_rewards: np.ndarray, *, terminal: bool
    ) -> np.ndarray:
        """Normalise the step's rewards and write the transition for all envs at once.

        ``terminal`` (the episode's last step) is a true terminal: the host is discarded
        after it, its final accuracy is paid by the reward's terminal term, and the
        observation carries the remaining budget (``epoch_frac``), so nothing is
        bootstrapped past it (docs/training.md, "Episode end").
        """
        raw = torch.from_numpy(np.asarray(raw_rewards, dtype=np.float32))
        dones = torch.full((len(raw_rewards),), terminal, dtype=torch.bool)
        normalized = raw
        if self.cfg.reward.normalize:
            if not self.frozen:
                self.reward_norm.update(raw, dones)
            normalized = self.reward_norm.normalize(raw)
        if self.buffer is not None:
            self.buffer.add(
                step,
                obs=d.obs_normalized,
                blueprint_ids=d.blueprint_ids,
                masks=d.masks,
                actions=d.actions,
                log_probs=d.log_probs,
                values=self.value_norm.denormalize(d.values),
                rewards_normalized=normalized.to(self.device, non_blocking=True),
                rewards_raw=raw.to(self.device, non_blocking=True),
                dones=terminal,
                hidden=d.hidden,
            )
        return host_array(normalized)  # rewards and their normaliser live on the host

    def rollback_transitions(self, env: int, from_step: int, to_step: int, penalty: float) -> int:
        """Env's segment ends at the decision that led into the failed epoch, which
        carries the penalty; returns the transitions whose effects were undone."""
        if self.buffer is None:
            return max(to_step - max(from_step, 0), 0)
        return self.buffer.apply_rollback(
            env,
            from_step=from_step,
            to_step=to_step,
            penalty=penalty,
            penalty_normalized=self.reward_norm.normalize_scalar(penalty),
        )

    def end_round(self, *, rnd: int, inject_nan: bool = False) -> PpoUpdate | None:
        """GAE (the last step is terminal: no bootstrap), PPO update; then the
        once-per-round observation-stat update."""
        metrics = None
        if self.buffer is not None and self.updater is not None:
            self.buffer.compute_returns_and_advantages(
                gamma=self.cfg.ppo.gamma, gae_lambda=self.cfg.ppo.gae_lambda
            )
            hook = (lambda loss: loss * math.nan) if inject_nan else None
            metrics = self.updater.update(
                self.buffer, round_index=rnd, total_rounds=self.cfg.run.rounds, loss_hook=hook
            )
        if self._round_obs and not self.frozen:
            self.obs_norm.unfreeze()
            self.obs_norm.update(torch.cat(self._round_obs))
            self.obs_norm.freeze()
            self._round_obs.clear()
        return metrics

    def learning_rate(self, rnd: int) -> float:
        """The policy learning rate of round ``rnd`` (``ppo.lr`` and its schedule)."""
        if self.updater is None:
            return self.cfg.ppo.lr
        return self.updater.learning_rate(rnd)

    def entropy_coef(self, rnd: int) -> float:
        if self.updater is None:
            return 0.0
        return self.updater.entropy_coef(rnd, self.cfg.run.rounds)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "obs_norm": self.obs_norm.state_dict(),
            "reward_norm": self.reward_norm.state_dict(),
            "value_norm": self.value_norm.state_dict(),
            "generator": self.generator.get_state(),
        }
        if isinstance(self.policy, torch.nn.Module):
            state["policy"] = self.policy.state_dict()
        if self.updater is not None:
            state["ppo"] = self.updater.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.obs_norm.load_state_dict(state["obs_norm"])
        self.reward_norm.load_state_dict(state["reward_norm"])
        self.value_norm.load_state_dict(state["value_norm"])
        self.generator.set_state(state["generator"])
        if isinstance(self.policy, torch.nn.Module) and "policy" in state:
            self.policy.load_state_dict(state["policy"])
        if self.updater is not None and "ppo" in state:
            self.updater.load_state_dict(state["ppo"])
