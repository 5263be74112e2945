"""The one place where training results become telemetry events.

The trainer, the env batch and the learner return plain data (records, transitions,
metrics); :class:`Recorder` turns it into typed events on the hub, in a fixed order per
step. It builds no event from a device tensor, and it checks ``hub.enabled(level)``
before building a ``normal``/``debug`` event, so a lower level costs nothing.

``reward_computed`` lags one step: the next step's governor check may still put a
rollback penalty on a transition, and the event must show it (:meth:`Recorder.epoch`).
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec
import torch

import esper
from esper.config import Config, with_overrides
from esper.core.constants import HEAD_NAMES
from esper.core.enums import PolicyKind, RunStatus, TelemetryLevel
from esper.core.records import (
    REWARD_COMPONENTS,
    CounterfactualRecord,
    GateRecord,
    LifecycleRecord,
    PPOMetrics,
    RewardBreakdown,
    RollbackRecord,
    SeedFossilizedRecord,
    SeedGerminatedRecord,
    SeedPrunedRecord,
    StageChangedRecord,
    make_breakdown,
)
from esper.telemetry import events as ev
from esper.telemetry.hub import Hub
from esper.training.batch_ops import LAYER_STAT_FIELDS
from esper.training.env_results import EnvEpoch, EnvSummary, EnvTransition, PhaseTimes

if TYPE_CHECKING:
    from esper.training.anomaly import Anomaly
    from esper.training.learner import Learner
    from esper.training.trainer import RoundSummary

_RECORD_TAG = SeedGerminatedRecord.__struct_config__.tag_field
#: Lifecycle records whose fields are exactly their event's payload (enums as values).
_SAME_FIELDS: dict[type, type[ev.Event]] = {
    SeedGerminatedRecord: ev.SeedGerminated,
    StageChangedRecord: ev.SeedStageChanged,
    SeedFossilizedRecord: ev.SeedFossilized,
    SeedPrunedRecord: ev.SeedPruned,
}


class DecisionRows(Protocol):
    """What an ``action_taken`` event reads of a decision (:class:`learner.Decision`)."""

    def head_indices(self, i: int) -> list[int]: ...

    def op_mask(self, i: int) -> list[bool]: ...

    def value(self, i: int) -> float: ...

    def log_prob(self, i: int) -> float: ...

    def op_prob(self, i: int, op: int) -> float: ...


@dataclass
class PendingReward:
    """A step's reward, emitted one step late (see the module docstring)."""

    breakdown: RewardBreakdown
    op: str
    normalized: float
    step: int


def with_rollback_penalty(br: RewardBreakdown, penalty: float) -> RewardBreakdown:
    """``br`` with ``penalty`` added to its rollback component (the total stays the sum)."""
    components = {name: getattr(br, name) for name in REWARD_COMPONENTS}
    components["rollback_penalty"] += penalty
    return make_breakdown(**components)


def lifecycle_event(rec: LifecycleRecord, *, rnd: int, env: int, step: int) -> ev.Event:
    """The ``seed_*``/``gate_evaluated`` event of one lifecycle record from the model."""
    same = _SAME_FIELDS.get(type(rec))
    if same is not None:
        # to_builtins turns enums into their values and tuples into lists, as events store
        # them; the record's own tag is not a payload field.
        payload = msgspec.to_builtins(rec)
        payload.pop(_RECORD_TAG, None)
        return same(round=rnd, env=env, step=step, **payload)
    if isinstance(rec, GateRecord):
        res = rec.result
        return ev.GateEvaluated(
            round=rnd,
            env=env,
            step=step,
            slot=rec.slot,
            seed_id=rec.seed_id,
            gate=res.gate.value,
            target_stage=res.target_stage.value,
            passed=res.passed,
            checks_passed=list(res.checks_passed),
            checks_failed=list(res.checks_failed),
            message=res.message,
            strict=res.strict,
        )
    raise TypeError(f"unknown lifecycle record {type(rec).__name__}")  # pragma: no cover


class Recorder:
    """Turns one rank's training results into events on ``hub``."""

    def __init__(self, hub: Hub, *, reward_family: str) -> None:
        self.hub = hub
        self.reward_family = reward_family
        self._pending: dict[int, PendingReward] = {}  # env index -> last step's reward
        self._carried: dict[int, float] = {}  # penalties for a transition not computed yet

    def enabled(self, level: TelemetryLevel) -> bool:
        return self.hub.enabled(level)

    # ------------------------------------------------------------------ run level
    def run_started(
        self,
        cfg: Config,
        learner: Learner,
        parent: str,
        start_round: int,
        *,
        eval_checkpoint: str = "",
    ) -> None:
        resolved = with_overrides(cfg, {"run.amp": learner.resolved_amp.value})
        env_devices = [str(d) for d in (cfg.run.env_devices or [cfg.run.device])]
        compiled = bool(cfg.policy.compile and cfg.policy.kind == PolicyKind.PPO)
        self.hub.emit(
            ev.RunStarted(
                config_json=resolved.to_json(),
                config_hash=cfg.fingerprint(),
                parent_run_id=parent,
                resumed_from_round=start_round if parent or start_round else -1,
                esper_version=esper.__version__,
                torch_version=str(torch.__version__),
                python_version=sys.version.split()[0],
                platform=platform.platform(),
                device=str(learner.device),
                env_devices=env_devices,
                amp=learner.resolved_amp.value,
                compile_policy=compiled,
                policy_kind=cfg.policy.kind.value,
                task=cfg.task.name.value,
                n_envs=cfg.run.n_envs,
                episode_length=cfg.run.episode_length,
                rounds=cfg.run.rounds,
                seed=cfg.run.seed,
                telemetry_level=TelemetryLevel(cfg.telemetry.level_enum).name.lower(),
                deterministic=learner.device.type == "cpu",
                eval_checkpoint=eval_checkpoint,
                argv=msgspec.json.encode(sys.argv).decode(),
            )
        )

    def checkpoint_loaded(self, path: str, *, next_round: int, parent: str, seq: int) -> None:
        self.hub.emit(
            ev.CheckpointLoaded(
                path=path, next_round=next_round, parent_run_id=parent, seq_position=seq
            )
        )

    def checkpoint_saved(self, path: str, *, size: int, next_round: int, seq: int) -> None:
        self.hub.emit(
            ev.CheckpointSaved(path=path, bytes=size, next_round=next_round, seq_position=seq)
        )

    def run_finished(
        self, status: RunStatus, *, rounds: int, env_steps: int, wall: float, rollbacks: int,
        error: str,
    ) -> None:  # fmt: skip
        self.hub.emit(
            ev.RunFinished(
                status=status.value,
                rounds_completed=rounds,
                env_steps=env_steps,
                wall_s=wall,
                eps=env_steps / wall if wall > 0 else 0.0,
                events_emitted=self.hub.events_emitted + 1,  # this one included
                rollbacks=rollbacks,
                error=error,
            )
        )

    # ------------------------------------------------------------------ round level
    def round_started(
        self, rnd: int, *, n_envs: int, horizon: int, entropy_coef: float, lr: float
    ) -> None:
        self._pending.clear()
        self._carried.clear()
        self.hub.emit(
            ev.RoundStarted(
                round=rnd, n_envs=n_envs, episode_length=horizon, entropy_coef=entropy_coef, lr=lr
            )
        )

    def ppo_update(self, m: PPOMetrics, *, rnd: int) -> None:
        self.hub.emit(msgspec.structs.replace(m, round=rnd))  # the metrics are the event

    def anomalies(self, found: Sequence[Anomaly], *, rnd: int, escalated: bool) -> None:
        for a in found:
            self.hub.emit(
                ev.AnomalyDetected(
                    round=rnd,
                    kind=a.kind.value,
                    detail=a.detail,
                    value=a.value,
                    threshold=a.threshold,
                    escalated=escalated,
                )
            )

    def round_finished(
        self, s: RoundSummary, t: PhaseTimes, envs: Sequence[EnvSummary], *, horizon: int
    ) -> None:
        """The last rewards, one ``episode_finished`` per env, then ``round_finished``."""
        self.flush_rewards(s.rnd)
        for e in envs:
            self._episode(e, rnd=s.rnd, step=horizon - 1)
        self.hub.emit(
            ev.RoundFinished(
                round=s.rnd,
                wall_s=s.wall_s,
                eps=s.eps,
                mean_episode_reward=s.mean_reward,
                mean_final_accuracy=s.mean_final_acc,
                rollbacks=s.rollbacks,
                train_ms=t.train_ms,
                val_ms=t.val_ms,
                policy_ms=t.features_ms + t.policy_ms,
                action_ms=t.action_ms,
                ppo_ms=t.ppo_ms,
            )
        )

    def _episode(self, e: EnvSummary, *, rnd: int, step: int) -> None:
        s = e.episode
        self.hub.emit(
            ev.EpisodeFinished(
                round=rnd,
                env=e.index,
                step=step,
                final_val_acc=e.val_acc,
                final_val_loss=e.val_loss,
                host_params=e.params.host,
                params_added=e.params.effective - e.params.host,
                seeds_germinated=s.seeds_germinated,
                seeds_fossilized=s.seeds_fossilized,
                seeds_pruned=s.seeds_pruned,
                episode_reward=s.reward_sum,
                rollbacks=s.rollbacks,
                rollback_penalty=s.rollback_penalty,
                host=e.host,
            )
        )

    # ------------------------------------------------------------------ step level
    def epoch(self, epochs: Sequence[EnvEpoch], *, rnd: int, step: int) -> None:
        """Layer stats (debug), then per env: rollback, lifecycle, counterfactual."""
        for e in epochs:
            self._layer_stats(e, rnd=rnd, step=step)
        normal = self.hub.enabled(TelemetryLevel.NORMAL)
        for e in epochs:
            if e.rollback is not None:
                rb = e.rollback
                self._penalize(e.index, rb.penalty)
                self._lifecycle(rb.pruned_records, rnd=rnd, env=e.index, step=step)
                self._rollback(rb.record, rnd=rnd, env=e.index, step=step)
            self._lifecycle(e.records, rnd=rnd, env=e.index, step=step)
            if normal:
                self._counterfactual(e.counterfactual, rnd=rnd, env=e.index, step=step)

    def actions(
        self,
        transitions: Sequence[EnvTransition],
        d: DecisionRows,
        normalized: Sequence[float],
        *,
        rnd: int,
        step: int,
    ) -> None:
        """The previous step's rewards, then per env its lifecycle records and action."""
        self.flush_rewards(rnd)
        normal = self.hub.enabled(TelemetryLevel.NORMAL)
        for i, tr in enumerate(transitions):
            self._lifecycle(tr.records, rnd=rnd, env=tr.index, step=step)
            if normal:
                self._action(tr, d, i, rnd=rnd, step=step)
        if not normal:
            return
        for tr, norm in zip(transitions, normalized, strict=True):
            br = tr.reward
            carried = self._carried.pop(tr.index, 0.0)
            if carried:
                br = with_rollback_penalty(br, carried)
            self._pending[tr.index] = PendingReward(br, tr.action.op.name, norm, step)

    def env_steps(
        self,
        envs: Sequence[EnvSummary],
        epochs: Sequence[EnvEpoch],
        t: PhaseTimes,
        *,
        rnd: int,
        step: int,
    ) -> None:
        """Per env-step numbers; phase times are the step's (shared by all envs)."""
        for e, epoch in zip(envs, epochs, strict=True):
            st = epoch.stats
            self.hub.emit(
                ev.EnvStep(
                    round=rnd,
                    env=e.index,
                    step=step,
                    train_loss=st.train_loss,
                    train_acc=st.train_acc,
                    val_loss=st.val_loss,
                    val_acc=st.val_acc,
                    active_seeds=e.active_seeds,
                    host_params=e.params.host,
                    seed_params=e.params.seeds,
                    train_ms=t.train_ms,
                    val_ms=t.val_ms,
                    features_ms=t.features_ms,
                    policy_ms=t.policy_ms,
                )
            )

    def flush_rewards(self, rnd: int) -> None:
        """Emit every pending ``reward_computed`` (step end, round end, or on error)."""
        pending, self._pending = self._pending, {}
        for env, p in pending.items():
            self.hub.emit(  # the breakdown is the event: its context added
                msgspec.structs.replace(
                    p.breakdown,
                    round=rnd,
                    env=env,
                    step=p.step,
                    family=self.reward_family,
                    op=p.op,
                    normalized=p.normalized,
                )
            )

    # ------------------------------------------------------------------ helpers
    def _penalize(self, env: int, penalty: float) -> None:
        """A rollback penalised the decision that led into the failed epoch: the pending
        reward, or (panic at step 0, before any decision) the first one to come."""
        pending = self._pending.get(env)
        if pending is None:
            self._carried[env] = self._carried.get(env, 0.0) + penalty
        else:
            pending.breakdown = with_rollback_penalty(pending.breakdown, penalty)

    def _lifecycle(
        self, records: Sequence[LifecycleRecord], *, rnd: int, env: int, step: int
    ) -> None:
        for rec in records:
            self.hub.emit(lifecycle_event(rec, rnd=rnd, env=env, step=step))

    def _rollback(self, rec: RollbackRecord, *, rnd: int, env: int, step: int) -> None:
        self.hub.emit(
            ev.GovernorRollback(
                round=rnd,
                env=env,
                step=step,
                reason=rec.reason.value,
                loss=rec.loss,
                threshold=rec.threshold,
                restored_to_step=rec.restored_to_step,
                penalized_step=max(step - 1, 0),
                seeds_pruned=list(rec.seeds_pruned),
                transitions_affected=rec.transitions_affected,
                penalty=rec.penalty,
            )
        )

    def _counterfactual(self, rec: CounterfactualRecord, *, rnd: int, env: int, step: int) -> None:
        self.hub.emit(
            ev.CounterfactualComputed(
                round=rnd,
                env=env,
                step=step,
                slots=list(rec.slots),
                contributions=list(rec.contributions),
                unavailable_reasons=[r.value for r in rec.unavailable],
                shapley=list(rec.shapley),
                interaction=rec.interaction,
                real_acc=rec.real_acc,
                all_off_acc=rec.all_off_acc,
                n_configs=rec.n_configs,
                exact_shapley=rec.exact_shapley,
            )
        )

    def _action(self, tr: EnvTransition, d: DecisionRows, i: int, *, rnd: int, step: int) -> None:
        a = tr.action
        indices = d.head_indices(i)
        head = dict(zip(HEAD_NAMES, indices, strict=True))
        op_mask = d.op_mask(i)
        self.hub.emit(
            ev.ActionTaken(
                round=rnd,
                env=tr.index,
                step=step,
                op=a.op.name,
                slot=a.slot_id or "",
                blueprint=a.blueprint or "",
                style=head["style"],
                tempo=head["tempo"],
                alpha_target=a.alpha_target,
                alpha_speed=head["alpha_speed"],
                alpha_curve=head["alpha_curve"],
                executed=tr.executed,
                op_mask=op_mask,
                n_valid_ops=sum(op_mask),
                masked_heads=[h for h in HEAD_NAMES if h not in a.relevant_heads],
                value=d.value(i),
                log_prob=d.log_prob(i),
                op_prob=d.op_prob(i, indices[0]),
            )
        )

    def _layer_stats(self, e: EnvEpoch, *, rnd: int, step: int) -> None:
        width = len(LAYER_STAT_FIELDS)
        values = e.stats.extra
        for i, name in enumerate(e.layer_names):
            grad_norm, param_norm, grad_max_abs, zero_frac = values[i * width : (i + 1) * width]
            self.hub.emit(
                ev.LayerGradStats(
                    round=rnd,
                    env=e.index,
                    step=step,
                    layer=name,
                    grad_norm=grad_norm,
                    param_norm=param_norm,
                    grad_max_abs=grad_max_abs,
                    zero_frac=zero_frac,
                )
            )
