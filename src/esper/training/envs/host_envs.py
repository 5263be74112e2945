"""The vectorized host environment: N host networks stepped in lockstep.

:class:`HostEnvs` is to the trainer what a VecEnv is to an on-policy algorithm. It owns
the round's envs (hosts, seeds, optimizers, governor snapshots) and their state as one
:class:`~esper.training.envs.env_table.EnvTable`, the train and validation passes, the
counterfactuals, action execution and step rewards, behind four calls::

    reset(rnd)                        fresh, deterministically seeded hosts
    advance(rnd, step) -> Epoch       one host epoch: train, validate, attribute, govern
    observe(step) -> Observation      features and masks for one batched policy forward
    step(heads, step) -> Transitions  execute, reward, lifecycle records

Each call is array work over every env at once; Python runs per env only where a
model's structure changes (an action other than WAIT, a rollback, a snapshot, a stage
change). It emits no events and knows no learner: rollbacks, penalties and lifecycle
records come back as data (:mod:`esper.training.envs.env_results`). Its one device-to-host
transfer per step is :func:`batch_ops.gather_step_stats` (plus one per rollback, for
the restored model's metrics).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from esper.config import Config
from esper.core.enums import Initiator
from esper.data.iterator import SharedBatchIterator, val_batches
from esper.data.tasks import TaskData
from esper.model.lifecycle import LIVE_CODES, OCCUPYING_CODES, TRAINS_CODES, effective_alphas
from esper.model.metrics import record_contributions, record_gradients
from esper.model.ticks import tick_slots
from esper.policy.actions import ActionSpace
from esper.policy.features import build_features, host_features
from esper.policy.masks import compute_masks
from esper.training.envs.action_execution import execute_actions, sync_seed_optimizers
from esper.training.envs.counterfactual import Ablations, ablations, attribute, unavailable_reasons
from esper.training.envs.env_factory import EnvFactory
from esper.training.envs.env_results import (
    Epoch,
    Lazy,
    Observation,
    PhaseTimes,
    Rollback,
    Summaries,
    Transitions,
)
from esper.training.envs.env_state import EnvState
from esper.training.envs.env_table import EnvTable
from esper.training.envs.rewards import compute_rewards
from esper.training.envs.step_rewards import (
    SLOT_OPS,
    Target,
    param_columns,
    reward_columns,
)
from esper.training.loop.faults import FaultPlan, InjectedDataError
from esper.training.passes.batch_ops import (
    PassOptions,
    StepStats,
    gather_step_stats,
    layer_grad_stats,
    train_epoch,
    validate_fused,
)
from esper.training.passes.host_batching import snapshot_rows, train_epoch_batched, validate_batched

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
        self.table: EnvTable | None = None
        #: With a host family: the hosts' observed descriptors, once per round, and each
        #: env's member name ("" without a family).
        self.host_rows: np.ndarray | None = None
        self.host_names: list[str] = []
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
        from esper.training.loop.distributed import RankShardIterator

        return RankShardIterator(
            task.train_x,
            task.train_y,
            n_envs=self.n_envs,
            env_offset=self.env_offset,
            n_global=self.n_envs * world_size,
            **kwargs,
        )

    @property
    def t(self) -> EnvTable:
        """The round's table (after :meth:`reset`)."""
        assert self.table is not None, "reset() first"
        return self.table

    # ------------------------------------------------------------------ the interface
    def reset(self, rnd: int) -> None:
        """Fresh hosts for round ``rnd`` (seeded by run seed, round and global env)."""
        self.states = self.factory.create_round(rnd, stacked=self.batched and self.factory.stacks())
        self.table = self.states[0].table
        self.table.drain()  # creation reports nothing an event needs
        self.table.round = rnd
        self.host_rows = None
        self.host_names = [env.host.name if env.host is not None else "" for env in self.states]
        if self.cfg.observes_host:
            hosts = [env.host for env in self.states if env.host is not None]
            self.host_rows = host_features(hosts, self.space.slot_ids)

    def advance(
        self, rnd: int, step: int, times: PhaseTimes, *, layer_stats: bool = False
    ) -> Epoch:
        """One host epoch for every env: train, fused validation + counterfactual (ONE
        transfer), then attribution, governor, lifecycle ticks and signals."""
        t = self.t
        t.step = step
        slots = t.slots
        alphas = effective_alphas(slots)
        reasons = unavailable_reasons(slots.stage, alphas)  # the passes change neither
        plan = ablations(alphas, reasons == 0, factorial=self.cfg.run.counterfactual_factorial)
        stats, names = self._host_passes(rnd, step, plan, times, layer_stats=layer_stats)
        t.prev_val_acc[:], t.prev_val_loss[:] = t.val_acc, t.val_loss
        t.val_acc[:], t.val_loss[:] = stats.val_acc, stats.val_loss
        found = attribute(plan, stats.config_accs, reasons)
        r, c = np.nonzero(np.isfinite(found.contributions) & LIVE_CODES[slots.stage])
        record_contributions(slots, (r, c), found.contributions[r, c])
        self._record_gradients(stats.grad_norms)
        rollbacks = self._govern(stats, step)  # after a rollback: restored metrics
        rows = np.arange(t.n)
        tick_slots(slots, rows, t.val_acc, self._slot_of, auto_advance=self.cfg.host.auto_advance)
        t.signals.update(t.val_loss, t.val_acc)
        return Epoch(stats, found, self.space.slot_ids, t.drain(), rollbacks, names)

    def observe(self, step: int) -> Observation:
        """Features and action masks of all envs, batched on the policy's device."""
        t = self.t
        deadline = self.cfg.policy.mask_late_germination
        masks = compute_masks(
            t.slots,
            self.space,
            max_seeds=self.cfg.host.max_seeds,
            device=self.policy_device,
            steps_left=self.horizon - step if deadline else None,
            prune_after_blending=self.cfg.policy.prune_after_blending,
        )
        obs, bp_ids = build_features(
            trackers=t.signals,
            reports=t.slots,
            epoch=step,
            max_epochs=self.horizon,
            last_ops=t.last_op,
            last_success=t.last_success,
            device=self.policy_device,
            hosts=self.host_rows,
        )
        states = self.states
        return Observation(
            obs,
            bp_ids,
            masks,
            Lazy(len(states), lambda i: states[i].model.slot_reports()),
            Lazy(len(states), lambda i: states[i].tracker),
        )

    def step(self, heads: np.ndarray, step: int) -> Transitions:
        """Execute each env's action (``heads[i]``: env i's head indices) and compute
        every reward (host-side, no sync). Only the envs that act run Python."""
        t = self.t
        t.step = step
        op = heads[:, 0]
        target = Target.of(t.slots, np.where(SLOT_OPS[op], heads[:, 1], -1))
        executed = execute_actions(
            self.states, t, heads, self.space, step=step, initiator=self.initiator
        )
        for i in sorted(t.changed):
            sync_seed_optimizers(self.states[i])
        t.changed.clear()
        t.last_op[:], t.last_success[:] = op, executed
        cols = reward_columns(
            t,
            target,
            op,
            executed,
            random_guess_loss=self.task.spec.random_guess_loss,
            terminal=step == self.horizon - 1,
            param_basis=self.cfg.reward.param_cost_basis,
        )
        rewards = compute_rewards(cols, self.cfg.reward, gamma=self.cfg.ppo.gamma)
        t.episode["reward_sum"] += rewards[:, -1]
        return Transitions(heads, executed, rewards, t.drain())

    def summaries(self) -> Summaries:
        """Every env's current metrics and episode totals (computed on demand)."""
        t = self.t
        counts = param_columns(t)
        return Summaries(
            index=self.env_offset + np.arange(t.n),
            val_acc=t.val_acc.copy(),
            val_loss=t.val_loss.copy(),
            host_params=counts.host,
            seed_params=counts.seeds,
            effective_params=counts.effective,
            active_seeds=OCCUPYING_CODES[t.slots.stage].sum(axis=1),
            episode={k: v.copy() for k, v in t.episode.items()},
            hosts=self.host_names,
        )

    # ------------------------------------------------------------------ host passes
    def _host_passes(
        self, rnd: int, step: int, plan: Ablations, times: PhaseTimes, *, layer_stats: bool
    ) -> tuple[StepStats, list[list[str]] | None]:
        """Train epoch, fused validation + counterfactual rows, the step's one transfer."""
        envs = self.states
        t0 = time.perf_counter()
        if self.faults.data_error(rnd, step):
            raise InjectedDataError(f"injected data-loader failure at round {rnd}, step {step}")
        nan_envs = self.faults.nan_envs(rnd, step)
        epoch = rnd * self.horizon + step
        if self.batched:
            train, grads = train_epoch_batched(
                envs,
                self.iterator.epoch_stacked(epoch),
                self.opts,
                nan_envs=nan_envs,
                expose_grads=layer_stats,
            )
            t1 = time.perf_counter()
            head, correct = validate_batched(envs, self.val, plan.alphas, plan.first, self.opts)
        else:
            train, grads = train_epoch(
                envs, self.iterator.epoch(epoch), self.opts, nan_envs=nan_envs
            )
            t1 = time.perf_counter()
            head, correct = validate_fused(envs, self.val, plan.alphas, plan.first, self.opts)
        layers = [layer_grad_stats(env.model) for env in envs] if layer_stats else None
        extras = [s for _, s in layers] if layers else None
        stats = gather_step_stats(train, grads, head, correct, plan.first, extras)
        times.train_ms += (t1 - t0) * 1e3
        times.val_ms += (time.perf_counter() - t1) * 1e3
        return stats, [n for n, _ in layers] if layers else None

    # ------------------------------------------------------------------ after the epoch
    def _slot_of(self, row: int, col: int) -> Any:
        return self.states[row].model.slots_in_order[col]

    def _record_gradients(self, norms: np.ndarray) -> None:
        """Each training seed's gradient norms (the last batch's, clipped) and health."""
        slots = self.t.slots
        trains = TRAINS_CODES[slots.stage] & ~slots.scheduled_prune
        r, c = np.nonzero(trains)
        record_gradients(slots, (r, c), norms[r, c, 0], norms[r, c, 1], self.t.ref_params[r, c])

    def _govern(self, stats: StepStats, step: int) -> list[Rollback]:
        """Snapshot the healthy hosts that are due, roll collapsed ones back."""
        if not self.cfg.governor.enabled:
            return []
        t = self.t
        panics = t.guard.check(stats.train_loss)
        due = t.guard.snapshot_due(step)
        due[[row for row, *_ in panics]] = False
        self._snapshot(due, step)
        return [
            self._rollback(self.states[row], reason, threshold, float(stats.train_loss[row]), step)
            for row, reason, threshold in panics
        ]

    def _snapshot(self, due: np.ndarray, step: int) -> None:
        """Governor snapshots of the due envs: a batched round's hosts cloned at once per
        store, a per-env round's one by one."""
        stores = self.t.stores[1] if self.t.stores is not None else None
        if stores is None:
            for i in np.nonzero(due)[0].tolist():
                self.states[i].governor.take_snapshot(step, self.states[i].model)
            return
        for store in stores:
            rows = np.nonzero(due[store.rows])[0]
            if len(rows):
                snapshot_rows(store, rows, step=step)

    def _rollback(
        self, env: EnvState, reason: Any, threshold: float, loss: float, step: int
    ) -> Rollback:
        """Restore one collapsed env to its snapshot; its accuracy and loss (what the
        step's reward, a terminal reward and episode_finished use) become the restored
        model's: one extra pass and transfer, on rollback steps only."""
        t = self.t
        mark = len(t.records)
        from_step = env.governor.snapshot_step
        record = env.governor.rollback(
            step,
            env.model,
            reason=reason,
            loss=loss,
            threshold=threshold,
            clear_optimizers=env.clear_optimizers,
            transitions_affected=0,  # the learner's count, filled in by the trainer
        )
        pruned, t.records[mark:] = t.records[mark:], []
        t.changed.add(env.row)
        alphas = effective_alphas(t.slots)[env.row : env.row + 1]
        first = np.zeros(1, dtype=np.int64)
        head, correct = validate_fused([env], self.val, alphas, first, self.opts)
        train = torch.zeros(1, 3, device=env.device)
        grads = torch.zeros(1, 0, 2, device=env.device)
        restored = gather_step_stats(train, grads, head, correct, first)
        t.val_acc[env.row], t.val_loss[env.row] = restored.val_acc[0], restored.val_loss[0]
        t.episode["rollbacks"][env.row] += 1
        t.episode["rollback_penalty"][env.row] += record.penalty
        t.episode["reward_sum"][env.row] += record.penalty
        return Rollback(env.row, from_step, step, record, pruned)
