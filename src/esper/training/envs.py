"""The vectorized host environment: N host networks stepped in lockstep.

:class:`HostEnvs` is to the trainer what a VecEnv is to an on-policy algorithm. It owns
the per-env states (host, seeds, optimizers, governor, signal tracker), the train and
validation passes, the counterfactuals, action execution and step rewards, behind four
calls::

    reset(rnd)                        fresh, deterministically seeded hosts
    advance(rnd, step) -> [EnvEpoch]  one host epoch: train, validate, attribute, govern
    observe(step) -> Observation      features and masks for one batched policy forward
    step(actions, step) -> [EnvTransition]   execute, reward, lifecycle records

It emits no events and knows no learner: rollbacks, penalties and lifecycle records come
back as data (:mod:`esper.training.env_results`). Its one device-to-host transfer per
step is :func:`batch_ops.gather_step_stats` (plus one per rollback, for the restored
model's metrics). A batched implementation (stacked host parameters, one graph for all
envs) would sit behind the same four calls.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from esper.config import Config
from esper.core.enums import Initiator
from esper.core.host_family import HostDescriptor
from esper.data.iterator import SharedBatchIterator, val_batches
from esper.data.tasks import TaskData
from esper.policy.actions import ActionSpace, DecodedAction
from esper.policy.features import build_features
from esper.policy.masks import compute_masks
from esper.training.action_execution import execute_action
from esper.training.batch_ops import (
    EnvStepStats,
    PassOptions,
    gather_step_stats,
    layer_grad_stats,
    train_epoch,
    validate_fused,
)
from esper.training.counterfactual import (
    AblationPlan,
    attribute,
    build_ablation_configs,
    measurable_seeds,
)
from esper.training.env_factory import EnvFactory
from esper.training.env_results import (
    EnvEpoch,
    EnvSummary,
    EnvTransition,
    Observation,
    PhaseTimes,
    Rollback,
)
from esper.training.env_state import EnvState
from esper.training.faults import FaultPlan, InjectedDataError
from esper.training.host_batching import train_epoch_batched, validate_batched
from esper.training.rewards import compute_reward
from esper.training.step_rewards import build_reward_inputs

if TYPE_CHECKING:
    from esper.core.enums import AmpMode

#: Validation batches are this many times the training batch (no gradients to keep).
VAL_BATCH_FACTOR = 4


class HostEnvs:
    """This process's envs: global indices ``env_offset .. env_offset + n_envs - 1``."""

    def __init__(
        self,
        cfg: Config,
        task: TaskData,
        *,
        space: ActionSpace,
        policy_device: torch.device,
        amp: AmpMode,
        initiator: Initiator,
        faults: FaultPlan | None = None,
        env_offset: int = 0,
        world_size: int = 1,
    ) -> None:
        self.cfg = cfg
        self.task = task
        self.space = space
        self.policy_device = policy_device
        self.initiator = initiator
        self.faults = faults or FaultPlan()
        self.n_envs = cfg.run.n_envs
        self.horizon = cfg.run.episode_length
        self.factory = EnvFactory(cfg, task.spec, env_offset=env_offset)
        self.opts = PassOptions(
            amp=amp, channels_last=cfg.task.channels_last, grad_clip=cfg.host.grad_clip
        )
        self.iterator = self._batch_iterator(world_size)
        self.val = val_batches(
            task.val_x,
            task.val_y,
            cfg.task.batch_size * VAL_BATCH_FACTOR,
            limit=cfg.task.val_samples,
            device=self.factory.devices[0],
            channels_last=cfg.task.channels_last,
        )
        self.states: list[EnvState] = []
        #: ``run.batch_envs`` resolved ("auto": on for float32 CUDA runs).
        self.batched = cfg.batches_envs()

    @property
    def env_offset(self) -> int:
        return self.factory.env_offset

    def _batch_iterator(self, world_size: int) -> SharedBatchIterator:
        """This process's envs' data; multi-rank: its rows of the global split."""
        cfg, task = self.cfg, self.task
        kwargs: dict[str, Any] = dict(
            batch_size=cfg.task.batch_size,
            seed=cfg.run.seed,
            samples_per_env=cfg.task.train_samples_per_env,
            split=cfg.task.env_split,
            device=self.factory.devices[0],
            channels_last=cfg.task.channels_last,
        )
        if world_size == 1:
            return SharedBatchIterator(task.train_x, task.train_y, n_envs=self.n_envs, **kwargs)
        from esper.training.distributed import RankShardIterator

        return RankShardIterator(
            task.train_x,
            task.train_y,
            n_envs=self.n_envs,
            env_offset=self.env_offset,
            n_global=self.n_envs * world_size,
            **kwargs,
        )

    # ------------------------------------------------------------------ the interface
    def reset(self, rnd: int) -> None:
        """Fresh hosts for round ``rnd`` (seeded by run seed, round and global env)."""
        self.states = self.factory.create_round(rnd)

    def advance(
        self, rnd: int, step: int, times: PhaseTimes, *, layer_stats: bool = False
    ) -> list[EnvEpoch]:
        """One host epoch for every env: train, fused validation + counterfactual (ONE
        transfer), then per env attribution, governor, lifecycle ticks and signals."""
        stats, plans, names = self._host_passes(rnd, step, times, layer_stats=layer_stats)
        return [
            self._after_epoch(env, st, plan, layers, step)
            for env, st, plan, layers in zip(self.states, stats, plans, names, strict=True)
        ]

    def observe(self, step: int) -> Observation:
        """Features and action masks of all envs, batched on the policy's device."""
        envs = self.states
        reports = [env.model.slot_reports() for env in envs]
        deadline = self.cfg.policy.mask_late_germination
        masks = compute_masks(
            reports,
            self.space,
            max_seeds=self.cfg.host.max_seeds,
            device=self.policy_device,
            steps_left=self.horizon - step if deadline else None,
            prune_after_blending=self.cfg.policy.prune_after_blending,
        )
        trackers = [e.tracker for e in envs]
        obs, bp_ids = build_features(
            trackers=trackers,
            reports=reports,
            epoch=step,
            max_epochs=self.horizon,
            last_ops=[e.last_op for e in envs],
            last_success=[e.last_success for e in envs],
            device=self.policy_device,
            hosts=self._hosts(),
        )
        return Observation(obs, bp_ids, masks, reports, trackers)

    def _hosts(self) -> list[HostDescriptor] | None:
        """The envs' host descriptors, observed with a host family (None without)."""
        if not self.cfg.observes_host:
            return None
        return [env.host for env in self.states if env.host is not None]

    def step(self, actions: Sequence[DecodedAction], step: int) -> list[EnvTransition]:
        """Execute each env's action and compute its reward (host-side, no sync)."""
        terminal = step == self.horizon - 1
        out: list[EnvTransition] = []
        for env, action in zip(self.states, actions, strict=True):
            outcome = execute_action(env, action, step=step, initiator=self.initiator)
            inputs, env.reward_memory = build_reward_inputs(
                env,
                action,
                outcome,
                task=self.task.spec,
                terminal=terminal,
                param_basis=self.cfg.reward.param_cost_basis,
            )
            reward = compute_reward(inputs, self.cfg.reward, gamma=self.cfg.ppo.gamma)
            env.stats.reward_sum += reward.total
            out.append(
                EnvTransition(env.index, action, outcome.executed, reward, env.drain_records())
            )
        return out

    def summaries(self) -> list[EnvSummary]:
        """Every env's current metrics and episode totals (computed on demand)."""
        return [
            EnvSummary(
                index=env.index,
                val_acc=env.val_acc,
                val_loss=env.val_loss,
                params=env.model.param_counts(),
                active_seeds=env.model.active_seeds(),
                episode=env.stats,
                host=env.host.name if env.host is not None else "",
            )
            for env in self.states
        ]

    # ------------------------------------------------------------------ host passes
    def _host_passes(
        self, rnd: int, step: int, times: PhaseTimes, *, layer_stats: bool
    ) -> tuple[list[EnvStepStats], list[AblationPlan], list[list[str]]]:
        """Train epoch, fused validation + counterfactual rows, the step's one transfer."""
        envs = self.states
        t0 = time.perf_counter()
        if self.faults.data_error(rnd, step):
            raise InjectedDataError(f"injected data-loader failure at round {rnd}, step {step}")
        nan_envs = frozenset(e.index for e in envs if self.faults.nan_loss(rnd, step, e.index))
        epoch = rnd * self.horizon + step
        plans: list[AblationPlan]
        if self.batched:
            train_epoch_batched(
                envs,
                self.iterator.epoch_stacked(epoch),
                self.opts,
                nan_envs=nan_envs,
                expose_grads=layer_stats,
            )
            t1 = time.perf_counter()
            plans = [self._ablation_plan(env) for env in envs]
            configs = [p.alphas if p.active else None for p in plans]
            val = validate_batched(envs, self.val, configs, self.opts)
        else:
            train_epoch(envs, self.iterator.epoch(epoch), self.opts, nan_envs=nan_envs)
            t1 = time.perf_counter()
            plans = [self._ablation_plan(env) for env in envs]
            alphas = [
                torch.tensor(p.alphas, dtype=torch.float32) if p.active else None for p in plans
            ]
            val = validate_fused(envs, self.val, alphas, self.opts)
        layers = [layer_grad_stats(env.model) for env in envs] if layer_stats else None
        stats = gather_step_stats(envs, val, [t for _, t in layers] if layers else None)
        times.train_ms += (t1 - t0) * 1e3
        times.val_ms += (time.perf_counter() - t1) * 1e3
        names = [n for n, _ in layers] if layers else [[] for _ in envs]
        return stats, plans, names

    def _ablation_plan(self, env: EnvState) -> AblationPlan:
        """Rows of the fused pass: real, leave-one-out, all-off or the full factorial."""
        reports = env.model.slot_reports()
        return build_ablation_configs(
            measurable_seeds(reports),
            len(reports),
            factorial=self.cfg.run.counterfactual_factorial,
            base_alphas=[r.alpha for r in reports],
        )

    def _after_epoch(
        self, env: EnvState, st: EnvStepStats, plan: AblationPlan, names: list[str], step: int
    ) -> EnvEpoch:
        """Counterfactuals, gradient metrics, governor, ticks and signals of one env."""
        env.prev_val_acc, env.prev_val_loss = env.val_acc, env.val_loss
        env.val_acc, env.val_loss = st.val_acc, st.val_loss
        reports = env.model.slot_reports()
        cf = attribute(plan, st.config_accs, [r.slot_id for r in reports], reports)
        for slot, contribution in zip(cf.slots, cf.contributions, strict=True):
            if not math.isnan(contribution):  # measured
                env.model.record_contribution(slot, contribution)
        env.model.apply_grad_norms(st.grad_norms)
        rollback = self._govern(env, st, step)  # after a rollback: restored metrics
        env.model.tick(env.val_acc)
        env.tracker.update(env.val_loss, env.val_acc)
        return EnvEpoch(env.index, st, cf, env.drain_records(), rollback, names)

    def _govern(self, env: EnvState, st: EnvStepStats, step: int) -> Rollback | None:
        """Snapshot a healthy host, or roll a collapsed one back to its snapshot."""
        if not self.cfg.governor.enabled:
            return None
        panic = env.governor.check(step, st.train_loss)
        if panic is None:
            env.governor.maybe_snapshot(step, env.model)
            return None
        reason, threshold = panic
        from_step = env.governor.snapshot_step
        record = env.governor.rollback(
            step,
            env.model,
            reason=reason,
            loss=st.train_loss,
            threshold=threshold,
            clear_optimizers=env.clear_optimizers,
            transitions_affected=0,  # the learner's count, filled in by the trainer
        )
        # The env is the restored model now: its accuracy and loss (what the step's
        # reward, a terminal reward and episode_finished use) must be that model's, not
        # the failed one's. One extra pass and transfer, on rollback steps only.
        (restored,) = gather_step_stats([env], validate_fused([env], self.val, [None], self.opts))
        env.val_acc, env.val_loss = restored.val_acc, restored.val_loss
        env.stats.rollbacks += 1
        env.stats.rollback_penalty += record.penalty
        env.stats.reward_sum += record.penalty
        local = env.index - self.env_offset
        return Rollback(local, from_step, step, record, env.drain_records())
