"""The vectorized PPO trainer: N host networks in lockstep, one policy deciding for all.

One round = one PPO update. Each round starts fresh, seeded hosts; each step is one host
training epoch followed by one policy decision per env:

    1. train epoch (shared batch iterator)        -> batch_ops.train_epoch
    2. fused validation + counterfactual pass     -> batch_ops.validate_fused
       ... and the step's ONE metrics transfer    -> batch_ops.gather_step_stats
    3. governor, slot ticks, signals              -> _after_epoch
    4. features + masks, ONE batched policy forward, ONE transfer -> _decide
    5. per env: execute, reward, buffer           -> _act
    end of round: GAE (last step terminal), PPO update, episode events -> _finish_round

Collaborators (hub, task data, policy) are injected; see :mod:`esper.training.run`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from esper.config import Config
from esper.core.enums import Initiator, PolicyKind, TelemetryLevel
from esper.core.layout import Layout
from esper.core.records import SlotReport
from esper.data.iterator import SharedBatchIterator, val_batches
from esper.data.tasks import TaskData
from esper.policy.actions import N_HEADS, N_OPS, ActionSpace, decode_action
from esper.policy.features import build_features
from esper.policy.masks import ActionMasks, compute_masks
from esper.policy.protocol import PolicyInput
from esper.telemetry import events as ev
from esper.telemetry.hub import Hub
from esper.training import emitters
from esper.training.action_execution import execute_action
from esper.training.anomaly import TelemetryEscalator, detect_anomalies
from esper.training.batch_ops import (
    LAYER_STAT_FIELDS,
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
from esper.training.env_state import EnvState, PendingReward, with_rollback_penalty
from esper.training.faults import FaultPlan, InjectedDataError
from esper.training.learner import Learner
from esper.training.rewards import compute_reward
from esper.training.step_rewards import build_reward_inputs

if TYPE_CHECKING:
    from esper.training.distributed import Collective


@dataclass
class PhaseTimes:
    """Wall-clock milliseconds per phase, accumulated over a round."""

    train_ms: float = 0.0
    val_ms: float = 0.0
    features_ms: float = 0.0
    policy_ms: float = 0.0
    action_ms: float = 0.0
    ppo_ms: float = 0.0

    def add(self, other: PhaseTimes) -> None:
        for name in ("train_ms", "val_ms", "features_ms", "policy_ms", "action_ms", "ppo_ms"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


#: One env's row of the packed decision (the step's single device-to-host transfer).
DECISION_ROW = Layout(
    ("actions", N_HEADS), ("log_prob", 1), ("value", 1), ("op_probs", N_OPS), ("op_mask", N_OPS)
)


@dataclass
class Decision:
    """The policy's choice for all envs, already on the host (one transfer)."""

    rows: list[list[float]]  # one DECISION_ROW per env
    obs_normalized: torch.Tensor  # what the policy saw; what the buffer stores
    blueprint_ids: torch.Tensor
    masks: ActionMasks
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    hidden: tuple[torch.Tensor, torch.Tensor]


@dataclass
class RoundSummary:
    rnd: int
    mean_reward: float
    mean_final_acc: float
    rollbacks: int
    eps: float
    wall_s: float


@dataclass
class StepProgress:
    rnd: int
    step: int
    total_rounds: int
    episode_length: int


ProgressFn = Callable[[StepProgress | RoundSummary], None]


@dataclass
class TrainerState:
    """What survives across rounds (and goes into checkpoints via the Learner)."""

    round_summaries: list[RoundSummary] = field(default_factory=list)
    env_steps: int = 0
    rollbacks: int = 0


class VectorizedTrainer:
    def __init__(
        self,
        cfg: Config,
        *,
        hub: Hub,
        task: TaskData,
        learner: Learner,
        faults: FaultPlan | None = None,
        progress: ProgressFn | None = None,
        collective: Collective | None = None,
    ) -> None:
        self.cfg = cfg
        #: Multi-rank runs: this rank's envs are global envs offset .. offset+n_envs-1.
        self.collective = collective
        self.hub = hub
        self.task = task
        self.learner = learner
        self.faults = faults or FaultPlan()
        self.progress = progress
        offset = collective.env_offset(cfg.run.n_envs) if collective is not None else 0
        self.factory = EnvFactory(cfg, task.spec, env_offset=offset)
        self.space: ActionSpace = learner.space
        self.device = learner.device
        self.n_envs = cfg.run.n_envs
        self.horizon = cfg.run.episode_length
        self.opts = PassOptions(amp=learner.resolved_amp, channels_last=cfg.task.channels_last)
        self.iterator = self._batch_iterator(task)
        self.val = val_batches(
            task.val_x,
            task.val_y,
            cfg.task.batch_size * 4,
            limit=cfg.task.val_samples,
            device=self.factory.devices[0],
            channels_last=cfg.task.channels_last,
        )
        self.initiator = (
            Initiator.HEURISTIC if cfg.policy.kind == PolicyKind.HEURISTIC else Initiator.POLICY
        )
        self.escalator = TelemetryEscalator(
            hub, base=cfg.telemetry.level_enum, rounds=cfg.telemetry.escalation_rounds
        )
        self.state = TrainerState()

    def _batch_iterator(self, task: TaskData) -> SharedBatchIterator:
        """This process's envs' data; multi-rank: its rows of the global split."""
        cfg, world = self.cfg, self.collective.world_size if self.collective else 1
        kwargs: dict[str, Any] = dict(
            batch_size=cfg.task.batch_size,
            seed=cfg.run.seed,
            samples_per_env=cfg.task.train_samples_per_env,
            device=self.factory.devices[0],
            channels_last=cfg.task.channels_last,
        )
        if world == 1:
            return SharedBatchIterator(task.train_x, task.train_y, n_envs=self.n_envs, **kwargs)
        from esper.training.distributed import RankShardIterator

        return RankShardIterator(
            task.train_x,
            task.train_y,
            n_envs=self.n_envs,
            env_offset=self.factory.env_offset,
            n_global=self.n_envs * world,
            **kwargs,
        )

    # ------------------------------------------------------------------ the loop
    def run_round(self, rnd: int) -> RoundSummary:
        t_start = time.perf_counter()
        self.escalator.on_round_start(rnd)
        self.hub.emit(self._round_started(rnd))
        envs = self.factory.create_round(rnd)
        times = PhaseTimes()
        hidden = self.learner.begin_round(self.n_envs)
        try:
            for step in range(self.horizon):
                step_times = PhaseTimes()
                stats, plans = self._host_work(envs, rnd, step, step_times)
                self._after_epoch(envs, stats, plans, rnd, step)
                decision = self._decide(envs, step, hidden, step_times)
                self._act(envs, decision, rnd, step, step_times)
                self._emit_env_steps(envs, stats, rnd, step, step_times)
                times.add(step_times)
                hidden = decision.hidden
                self._report_progress(StepProgress(rnd, step, self.cfg.run.rounds, self.horizon))
        except BaseException:  # error or Ctrl-C mid-round: the last step's rewards still count
            with contextlib.suppress(Exception):  # a dead writer must not mask the cause
                self._emit_pending_rewards(envs, rnd)
            raise
        summary = self._finish_round(envs, rnd, hidden, times, t_start)
        self._report_progress(summary)
        return summary

    # ------------------------------------------------------------------ phases
    def _host_work(
        self, envs: list[EnvState], rnd: int, step: int, times: PhaseTimes
    ) -> tuple[list[EnvStepStats], list[AblationPlan]]:
        """Steps 1-2: train epoch, fused validation + counterfactual, one transfer."""
        t0 = time.perf_counter()
        if self.faults.data_error(rnd, step):
            raise InjectedDataError(f"injected data-loader failure at round {rnd}, step {step}")
        nan_envs = frozenset(e.index for e in envs if self.faults.nan_loss(rnd, step, e.index))
        epoch = rnd * self.horizon + step
        train_epoch(envs, self.iterator.epoch(epoch), self.opts, nan_envs=nan_envs)
        t1 = time.perf_counter()
        plans = [self._ablation_plan(env) for env in envs]
        alphas = [torch.tensor(p.alphas, dtype=torch.float32) if p.active else None for p in plans]
        val = validate_fused(envs, self.val, alphas, self.opts)
        layer_stats = None
        if self.hub.enabled(TelemetryLevel.DEBUG):
            layer_stats = [layer_grad_stats(env.model) for env in envs]
        extras = [t for _, t in layer_stats] if layer_stats is not None else None
        stats = gather_step_stats(envs, val, extras)
        if layer_stats is not None:
            for env, st, (names, _) in zip(envs, stats, layer_stats, strict=True):
                self._emit_layer_stats(env, names, st.extra, rnd, step)
        times.train_ms += (t1 - t0) * 1e3
        times.val_ms += (time.perf_counter() - t1) * 1e3
        return stats, plans

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
        self,
        envs: list[EnvState],
        stats: list[EnvStepStats],
        plans: list[AblationPlan],
        rnd: int,
        step: int,
    ) -> None:
        """Step 3: counterfactuals, gradient metrics, governor, ticks, signals, events."""
        normal = self.hub.enabled(TelemetryLevel.NORMAL)
        for env, st, plan in zip(envs, stats, plans, strict=True):
            env.prev_val_acc, env.prev_val_loss = env.val_acc, env.val_loss
            env.val_acc, env.val_loss = st.val_acc, st.val_loss
            reports = env.model.slot_reports()
            cf = attribute(plan, st.config_accs, [r.slot_id for r in reports], reports)
            for slot, contribution in zip(cf.slots, cf.contributions, strict=True):
                if not math.isnan(contribution):  # measured
                    env.model.record_contribution(slot, contribution)
            env.model.apply_grad_norms(st.grad_norms)
            self._governor_check(env, st, rnd, step)  # after a rollback: restored metrics
            env.model.tick(env.val_acc)
            env.tracker.update(env.val_loss, env.val_acc)
            self._emit_records(env, rnd, step)
            if normal:
                emitters.emit_counterfactual(self.hub, cf, rnd=rnd, env=env.index, step=step)

    def _governor_check(self, env: EnvState, st: EnvStepStats, rnd: int, step: int) -> None:
        if not self.cfg.governor.enabled:
            return
        panic = env.governor.check(step, st.train_loss)
        if panic is None:
            env.governor.maybe_snapshot(step, env.model)
            return
        reason, threshold = panic
        penalty = env.governor.penalty
        affected = self.learner.rollback_transitions(
            env.index - self.factory.env_offset, env.governor.snapshot_step, step, penalty
        )
        record = env.governor.rollback(
            step,
            env.model,
            reason=reason,
            loss=st.train_loss,
            threshold=threshold,
            clear_optimizers=env.clear_optimizers,
            transitions_affected=affected,
        )
        # The env is the restored model now: its accuracy and loss (what the step's
        # reward, a terminal reward and episode_finished use) must be that model's, not
        # the failed one's. One extra pass and transfer, on rollback steps only.
        (restored,) = gather_step_stats([env], validate_fused([env], self.val, [None], self.opts))
        env.val_acc, env.val_loss = restored.val_acc, restored.val_loss
        env.stats.rollbacks += 1
        env.stats.rollback_penalty += record.penalty
        env.stats.reward_sum += record.penalty
        env.penalize_last_reward(record.penalty)  # its reward_computed shows it too
        self.state.rollbacks += 1
        self._emit_records(env, rnd, step)  # the seeds the rollback pruned
        emitters.emit_rollback(
            self.hub, record, penalized_step=max(step - 1, 0), rnd=rnd, env=env.index, step=step
        )

    def _decide(
        self,
        envs: list[EnvState],
        step: int,
        hidden: tuple[torch.Tensor, torch.Tensor],
        times: PhaseTimes,
    ) -> Decision:
        """Step 4: features and masks for all envs, ONE policy forward, ONE transfer."""
        t0 = time.perf_counter()
        reports = [env.model.slot_reports() for env in envs]
        masks = compute_masks(
            reports, self.space, max_seeds=self.cfg.host.max_seeds, device=self.device
        )
        obs, bp_ids = self._features(envs, step, reports)
        t1 = time.perf_counter()
        obs_normalized = self.learner.normalize_obs(obs)
        inp = PolicyInput(
            obs=obs_normalized,
            blueprint_ids=bp_ids,
            masks=masks,
            reports=reports,
            trackers=[e.tracker for e in envs],
        )
        out = self.learner.act(inp, hidden)
        parts = {  # DECISION_ROW's fields, in its order
            "actions": out.actions.float(),
            "log_prob": out.log_probs.sum(dim=1, keepdim=True),
            "value": out.value.reshape(-1, 1).float(),
            "op_probs": out.op_probs.float(),
            "op_mask": masks.op.float(),
        }
        assert tuple(parts) == DECISION_ROW.names
        rows = torch.cat(list(parts.values()), dim=1).cpu().tolist()  # the single transfer
        DECISION_ROW.check(rows[0])
        times.features_ms += (t1 - t0) * 1e3
        times.policy_ms += (time.perf_counter() - t1) * 1e3
        return Decision(
            rows=rows,
            obs_normalized=obs_normalized,
            blueprint_ids=bp_ids,
            masks=masks,
            actions=out.actions,
            log_probs=out.log_probs,
            values=out.value,
            hidden=out.hidden,
        )

    def _features(
        self,
        envs: list[EnvState],
        step: int,
        reports: list[tuple[SlotReport, ...]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return build_features(
            trackers=[e.tracker for e in envs],
            reports=reports if reports is not None else [e.model.slot_reports() for e in envs],
            epoch=step,
            max_epochs=self.horizon,
            last_ops=[e.last_op for e in envs],
            last_success=[e.last_success for e in envs],
            device=self.device,
        )

    def _act(
        self,
        envs: list[EnvState],
        d: Decision,
        rnd: int,
        step: int,
        times: PhaseTimes,
    ) -> None:
        """Step 5: per env decode, execute, reward; one buffer write for all envs."""
        t0 = time.perf_counter()
        terminal = step == self.horizon - 1
        normal = self.hub.enabled(TelemetryLevel.NORMAL)
        self._emit_pending_rewards(envs, rnd)  # the previous step's, past its governor check
        raw: list[float] = []
        breakdowns = []
        op_names: list[str] = []
        for env, row in zip(envs, d.rows, strict=True):
            indices = [int(v) for v in DECISION_ROW.get(row, "actions")]
            action = decode_action(indices, self.space)
            op_names.append(action.op.name)
            outcome = execute_action(env, action, step=step, initiator=self.initiator)
            inputs = build_reward_inputs(
                env, action, outcome, task=self.task.spec, terminal=terminal
            )
            br = compute_reward(inputs, self.cfg.reward, gamma=self.cfg.ppo.gamma)
            env.stats.reward_sum += br.total
            raw.append(br.total)
            breakdowns.append(br)
            self._emit_records(env, rnd, step)
            if normal:
                op_mask = [bool(v) for v in DECISION_ROW.get(row, "op_mask")]
                emitters.emit_action(
                    self.hub,
                    indices=indices,
                    op_name=action.op.name,
                    slot=action.slot_id or "",
                    blueprint=action.blueprint or "",
                    alpha_target=action.alpha_target,
                    executed=outcome.executed,
                    op_mask=op_mask,
                    value=DECISION_ROW.one(row, "value"),
                    log_prob=DECISION_ROW.one(row, "log_prob"),
                    op_prob=DECISION_ROW.get(row, "op_probs")[indices[0]],
                    rnd=rnd,
                    env=env.index,
                    step=step,
                    relevant=action.relevant_heads,
                )
        normalized = self.learner.record_step(step, d, raw, terminal=terminal)
        if normal:
            for env, br, norm, op in zip(envs, breakdowns, normalized, op_names, strict=True):
                if env.carried_penalty:
                    br = with_rollback_penalty(br, env.carried_penalty)
                    env.carried_penalty = 0.0
                env.pending_reward = PendingReward(br, op, norm, step)
        self.state.env_steps += self.n_envs
        times.action_ms += (time.perf_counter() - t0) * 1e3

    def _finish_round(
        self,
        envs: list[EnvState],
        rnd: int,
        hidden: tuple[torch.Tensor, torch.Tensor],
        times: PhaseTimes,
        t_start: float,
    ) -> RoundSummary:
        """End of round: GAE, PPO update, episode and round events."""
        t0 = time.perf_counter()
        metrics = self.learner.end_round(rnd=rnd, inject_nan=self.faults.policy_nan(rnd))
        times.ppo_ms += (time.perf_counter() - t0) * 1e3
        if metrics is not None:
            emitters.emit_ppo(self.hub, metrics, rnd=rnd)
            self.escalator.report(
                detect_anomalies(metrics, target_kl=self.cfg.ppo.target_kl), rnd=rnd
            )
        self._emit_pending_rewards(envs, rnd)
        for env in envs:
            self._emit_episode(env, rnd)
        wall = time.perf_counter() - t_start
        totals = [
            sum(e.stats.reward_sum for e in envs),
            sum(e.val_acc for e in envs),
            sum(e.stats.rollbacks for e in envs),
            len(envs),
        ]
        if self.collective is not None:  # the round over all ranks' envs
            totals = self.collective.sum_floats(totals)
        summary = RoundSummary(
            rnd=rnd,
            mean_reward=totals[0] / totals[3],
            mean_final_acc=totals[1] / totals[3],
            rollbacks=int(totals[2]),
            eps=totals[3] * self.horizon / wall if wall > 0 else 0.0,
            wall_s=wall,
        )
        self.hub.emit(emitters.round_finished_event(summary, times))
        self.state.round_summaries.append(summary)
        return summary

    # ------------------------------------------------------------------ events
    def _emit_pending_rewards(self, envs: list[EnvState], rnd: int) -> None:
        """``reward_computed`` lags one step so a rollback penalty reaches its event too."""
        family = self.cfg.reward.family.value
        for env in envs:
            p = env.pending_reward
            if p is None:
                continue
            env.pending_reward = None
            emitters.emit_reward(
                self.hub,
                p.breakdown,
                family=family,
                op=p.op,
                normalized=p.normalized,
                rnd=rnd,
                env=env.index,
                step=p.step,
            )

    def _emit_records(self, env: EnvState, rnd: int, step: int) -> None:
        for rec in env.drain_records():
            env.stats.count(rec)
            emitters.emit_lifecycle(self.hub, rec, rnd=rnd, env=env.index, step=step)

    def _emit_env_steps(
        self,
        envs: list[EnvState],
        stats: list[EnvStepStats],
        rnd: int,
        step: int,
        t: PhaseTimes,
    ) -> None:
        """Per env-step numbers; phase times are the step's (shared by all envs)."""
        if not self.hub.enabled(TelemetryLevel.NORMAL):
            return
        for env, st in zip(envs, stats, strict=True):
            counts = env.model.param_counts()
            active = sum(1 for r in env.model.slot_reports() if r.active)
            self.hub.emit(
                ev.EnvStep(
                    round=rnd,
                    env=env.index,
                    step=step,
                    train_loss=st.train_loss,
                    train_acc=st.train_acc,
                    val_loss=st.val_loss,
                    val_acc=st.val_acc,
                    active_seeds=active,
                    host_params=counts.host,
                    seed_params=counts.seeds,
                    train_ms=t.train_ms,
                    val_ms=t.val_ms,
                    features_ms=t.features_ms,
                    policy_ms=t.policy_ms,
                )
            )

    def _emit_layer_stats(
        self, env: EnvState, names: list[str], values: tuple[float, ...], rnd: int, step: int
    ) -> None:
        width = len(LAYER_STAT_FIELDS)
        for i, name in enumerate(names):
            grad_norm, param_norm, grad_max_abs, zero_frac = values[i * width : (i + 1) * width]
            self.hub.emit(
                ev.LayerGradStats(
                    round=rnd,
                    env=env.index,
                    step=step,
                    layer=name,
                    grad_norm=grad_norm,
                    param_norm=param_norm,
                    grad_max_abs=grad_max_abs,
                    zero_frac=zero_frac,
                )
            )

    def _emit_episode(self, env: EnvState, rnd: int) -> None:
        counts = env.model.param_counts()
        s = env.stats
        self.hub.emit(
            ev.EpisodeFinished(
                round=rnd,
                env=env.index,
                step=self.horizon - 1,
                final_val_acc=env.val_acc,
                final_val_loss=env.val_loss,
                host_params=counts.host,
                params_added=counts.effective - counts.host,
                seeds_germinated=s.seeds_germinated,
                seeds_fossilized=s.seeds_fossilized,
                seeds_pruned=s.seeds_pruned,
                episode_reward=s.reward_sum,
                rollbacks=s.rollbacks,
                rollback_penalty=s.rollback_penalty,
            )
        )

    def _round_started(self, rnd: int) -> ev.RoundStarted:
        return ev.RoundStarted(
            round=rnd,
            n_envs=self.n_envs,
            episode_length=self.horizon,
            entropy_coef=self.learner.entropy_coef(rnd),
            lr=self.learner.learning_rate(rnd),
        )

    def _report_progress(self, item: StepProgress | RoundSummary) -> None:
        if self.progress is not None:
            self.progress(item)
