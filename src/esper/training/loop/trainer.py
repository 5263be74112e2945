"""The vectorized PPO trainer: N host networks in lockstep, one policy deciding for all.

One round = one episode per env = one PPO update. The loop reads top to bottom::

    envs.reset(rnd)                         fresh, seeded hosts      (envs.HostEnvs)
    for step in range(horizon):
        epochs = envs.advance(rnd, step)    train, validate, govern  (one transfer)
        obs = envs.observe(step)            features and masks
        decision = learner.decide(obs, h)   one batched forward      (one transfer)
        transitions = envs.step(actions)    execute, reward
        learner.record_step(...)            the rollout buffer
        recorder.*(...)                     events                   (recorder.Recorder)
    learner.end_round(rnd)                  GAE, PPO update

Collaborators (hub, task data, policy) are injected; see :mod:`esper.training.run`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from esper.config import Config
from esper.core.enums import Initiator, TelemetryLevel
from esper.data.tasks import TaskData
from esper.training.envs.env_results import PhaseTimes, Rollback
from esper.training.envs.host_envs import HostEnvs
from esper.training.envs.rewards import ordered_sum
from esper.training.learning.learner import Learner
from esper.training.loop.anomaly import TelemetryEscalator, detect_anomalies
from esper.training.loop.faults import FaultPlan
from esper.training.loop.recorder import Recorder

if TYPE_CHECKING:
    from esper.training.loop.distributed import Collective


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
        recorder: Recorder,
        task: TaskData,
        learner: Learner,
        faults: FaultPlan | None = None,
        progress: ProgressFn | None = None,
        collective: Collective | None = None,
    ) -> None:
        self.cfg = cfg
        #: Multi-rank runs: this rank's envs are global envs offset .. offset+n_envs-1.
        self.collective = collective
        self.recorder = recorder
        self.hub = recorder.hub
        self.learner = learner
        self.progress = progress
        self.n_envs = cfg.run.n_envs
        self.horizon = cfg.run.episode_length
        self.faults = faults or FaultPlan()
        self.envs = HostEnvs(
            cfg,
            task,
            space=learner.space,
            policy_device=learner.device,
            amp=learner.resolved_amp,
            initiator=Initiator.HEURISTIC if cfg.policy.kind.rule_based else Initiator.POLICY,
            faults=self.faults,
            env_offset=collective.env_offset(cfg.run.n_envs) if collective is not None else 0,
            world_size=collective.world_size if collective is not None else 1,
        )
        recorder.env_offset = self.envs.env_offset
        self.escalator = TelemetryEscalator(
            self.hub, base=cfg.telemetry.level_enum, rounds=cfg.telemetry.escalation_rounds
        )
        self.state = TrainerState()

    # ------------------------------------------------------------------ the loop
    def run_round(self, rnd: int) -> RoundSummary:
        t_start = time.perf_counter()
        envs, learner, recorder = self.envs, self.learner, self.recorder
        self.escalator.on_round_start(rnd)
        recorder.round_started(
            rnd, n_envs=self.n_envs, horizon=self.horizon,
            entropy_coef=learner.entropy_coef(rnd), lr=learner.learning_rate(rnd),
        )  # fmt: skip
        envs.reset(rnd)
        hidden = learner.begin_round(self.n_envs)
        times = PhaseTimes()
        try:
            for step in range(self.horizon):
                t = PhaseTimes()
                # 1. one host epoch per env: train, validate + counterfactuals, governor
                epoch = envs.advance(
                    rnd, step, t, layer_stats=recorder.enabled(TelemetryLevel.DEBUG)
                )
                self._rollbacks(epoch.rollbacks)
                recorder.epoch(epoch, rnd=rnd, step=step)
                # 2. observe all envs, one batched policy forward
                t0 = time.perf_counter()
                obs = envs.observe(step)
                t1 = time.perf_counter()
                decision = learner.decide(obs, hidden)
                t2 = time.perf_counter()
                # 3. execute the actions; rewards into the buffer
                transitions = envs.step(decision.heads, step)
                normalized = learner.record_step(
                    step, decision, transitions.totals, terminal=step == self.horizon - 1
                )
                # 4. events
                recorder.actions(
                    transitions, decision, normalized, rnd=rnd, step=step, space=learner.space
                )
                self.state.env_steps += self.n_envs
                t.features_ms, t.policy_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3
                t.action_ms = (time.perf_counter() - t2) * 1e3
                if recorder.enabled(TelemetryLevel.NORMAL):
                    recorder.env_steps(envs.summaries(), epoch.stats, t, rnd=rnd, step=step)
                times.add(t)
                hidden = decision.hidden
                self._report(StepProgress(rnd, step, self.cfg.run.rounds, self.horizon))
        except BaseException:  # error or Ctrl-C mid-round: the last step's rewards still count
            with contextlib.suppress(Exception):  # a dead writer must not mask the cause
                recorder.flush_rewards(rnd)
            raise
        summary = self._finish_round(rnd, times, t_start)
        self._report(summary)
        return summary

    # ------------------------------------------------------------------ helpers
    def _rollbacks(self, rollbacks: list[Rollback]) -> None:
        """A rolled-back env's buffer segment is undone and its last decision penalised."""
        for rb in rollbacks:
            affected = self.learner.rollback_transitions(
                rb.local, rb.from_step, rb.to_step, rb.penalty
            )
            rb.record = msgspec.structs.replace(rb.record, transitions_affected=affected)
            self.state.rollbacks += 1

    def _finish_round(self, rnd: int, times: PhaseTimes, t_start: float) -> RoundSummary:
        """End of round: GAE, PPO update, episode and round events."""
        t0 = time.perf_counter()
        metrics = self.learner.end_round(rnd=rnd, inject_nan=self.faults.policy_nan(rnd))
        times.ppo_ms += (time.perf_counter() - t0) * 1e3
        if metrics is not None:
            self.recorder.ppo_update(metrics, rnd=rnd)
            found = detect_anomalies(metrics, self.cfg.telemetry, target_kl=self.cfg.ppo.target_kl)
            self.recorder.anomalies(found, rnd=rnd, escalated=self.escalator.escalates(found))
            self.escalator.report(found, rnd=rnd)
        envs = self.envs.summaries()
        wall = time.perf_counter() - t_start
        totals = [  # summed in env order, as floats (exact across runs)
            float(ordered_sum(envs.episode["reward_sum"].tolist())),
            float(ordered_sum(envs.val_acc.tolist())),
            float(envs.episode["rollbacks"].sum()),
            float(len(envs.index)),
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
        self.recorder.round_finished(summary, times, envs, horizon=self.horizon)
        self.state.round_summaries.append(summary)
        return summary

    def _report(self, item: StepProgress | RoundSummary) -> None:
        if self.progress is not None:
            self.progress(item)
