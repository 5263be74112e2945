"""The one place where training results become telemetry events.

The trainer, the env batch and the learner return plain data (records, transitions,
metrics); :class:`Recorder` turns it into typed events on the hub, in a fixed order per
step. It builds no event from a device tensor, and it checks ``hub.enabled(level)``
before building a ``normal``/``debug`` event, so a lower level costs nothing. The
events every env has every step (actions, rewards, counterfactuals, env steps, episode
ends) go to the hub as columns (:class:`~esper.telemetry.event_columns.EventColumns`),
straight from the step's arrays: no Python per env.

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
import numpy as np
import pyarrow as pa
import torch

import esper
from esper.config import Config, with_overrides
from esper.core.constants import ALL_BLUEPRINTS, ALPHA_TARGETS, HEAD_NAMES, RELEVANT_HEADS
from esper.core.enums import LifecycleOp, PolicyKind, RunStatus, TelemetryLevel
from esper.policy.actions import ActionSpace
from esper.telemetry import events as ev
from esper.telemetry.event_columns import EventColumns
from esper.telemetry.events import (
    REWARD_COMPONENTS,
    GovernorRollback,
    PpoUpdate,
)
from esper.telemetry.hub import Hub
from esper.training.envs.counterfactual import REASONS, Attribution
from esper.training.envs.env_results import Epoch, PhaseTimes, Records, Summaries, Transitions
from esper.training.envs.governor import penalized_step
from esper.training.envs.rewards import ordered_sum
from esper.training.passes.batch_ops import LAYER_STAT_FIELDS, StepStats

if TYPE_CHECKING:
    from esper.training.learning.learner import Learner
    from esper.training.loop.anomaly import Anomaly
    from esper.training.loop.trainer import RoundSummary

#: An op's name by its code, and the heads an ``action_taken`` of it reports masked.
OP_NAMES = np.array([op.name for op in LifecycleOp], dtype=object)
#: A counterfactual reason's event value by its code.
REASON_VALUES = np.array([r.value for r in REASONS], dtype=object)
MASKED_HEADS = np.empty(len(LifecycleOp), dtype=object)
MASKED_HEADS[:] = [[h for h in HEAD_NAMES if h not in RELEVANT_HEADS[op]] for op in LifecycleOp]
#: By op code: whether an ``action_taken`` of it names its slot, and its blueprint.
NAMES_SLOT = np.array(["slot" in RELEVANT_HEADS[op] for op in LifecycleOp])
NAMES_BLUEPRINT = np.array(["blueprint" in RELEVANT_HEADS[op] for op in LifecycleOp])
BLUEPRINT_NAMES = np.array(ALL_BLUEPRINTS, dtype=object)
ALPHA_TARGET_VALUES = np.array(ALPHA_TARGETS, dtype=np.float64)
#: A ``reward_computed`` event's breakdown fields, in a breakdown row's column order.
_BREAKDOWN_FIELDS = (*REWARD_COMPONENTS, "total")


class DecisionColumns(Protocol):
    """What ``action_taken`` events read of a decision (:class:`learner.Decision`)."""

    @property
    def op_mask(self) -> np.ndarray: ...

    @property
    def value(self) -> np.ndarray: ...

    @property
    def log_prob(self) -> np.ndarray: ...

    @property
    def op_probs(self) -> np.ndarray: ...


@dataclass
class PendingRewards:
    """A step's rewards, emitted one step late (see the module docstring): the
    breakdowns ``[N, C + 1]`` (total last), the ops and the normalised values."""

    breakdown: np.ndarray
    ops: np.ndarray  # op names (object)
    normalized: np.ndarray
    step: int


#: Column of the rollback penalty in a breakdown row.
_ROLLBACK = REWARD_COMPONENTS.index("rollback_penalty")


def with_rollback_penalty(row: np.ndarray, penalty: float) -> None:
    """Add ``penalty`` to a breakdown row's rollback component, in place; the total stays
    the exact sum of the components (in REWARD_COMPONENTS order, as ``make_breakdown``)."""
    row[_ROLLBACK] += penalty
    row[-1] = ordered_sum(row[:-1].tolist())


class Recorder:
    """Turns one rank's training results into events on ``hub``."""

    def __init__(self, hub: Hub, *, reward_family: str) -> None:
        self.hub = hub
        self.reward_family = reward_family
        self._pending: PendingRewards | None = None  # the last step's rewards
        self._carried: dict[int, float] = {}  # by row: penalties for a reward not computed yet
        #: Global index of this rank's first env (events name envs by global index).
        self.env_offset = 0

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
        eval_sampled: bool = False,
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
                eval_sampled=eval_sampled,
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
        self._pending = None
        self._carried.clear()
        self.hub.emit(
            ev.RoundStarted(
                round=rnd, n_envs=n_envs, episode_length=horizon, entropy_coef=entropy_coef, lr=lr
            )
        )

    def ppo_update(self, m: PpoUpdate, *, rnd: int) -> None:
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
        self, s: RoundSummary, t: PhaseTimes, envs: Summaries, *, horizon: int
    ) -> None:
        """The last rewards, one ``episode_finished`` per env, then ``round_finished``."""
        self.flush_rewards(s.rnd)
        self._episodes(envs, rnd=s.rnd, step=horizon - 1)
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

    def _episodes(self, e: Summaries, *, rnd: int, step: int) -> None:
        ep = e.episode
        columns = {
            "round": rnd,
            "env": e.index,
            "step": step,
            "final_val_acc": e.val_acc,
            "final_val_loss": e.val_loss,
            "host_params": e.host_params,
            "params_added": e.effective_params - e.host_params,
            "seeds_germinated": ep["seeds_germinated"],
            "seeds_fossilized": ep["seeds_fossilized"],
            "seeds_pruned": ep["seeds_pruned"],
            "episode_reward": ep["reward_sum"],
            "rollbacks": ep["rollbacks"],
            "rollback_penalty": ep["rollback_penalty"],
            "host": list(e.hosts),
        }
        self.hub.emit_columns(EventColumns(ev.EpisodeFinished, len(e.index), columns))

    # ------------------------------------------------------------------ step level
    def epoch(self, e: Epoch, *, rnd: int, step: int) -> None:
        """Layer stats (debug), rollbacks, lifecycle records, counterfactuals (normal)."""
        if e.layer_names is not None and e.stats.extra is not None:
            for row, (names, values) in enumerate(zip(e.layer_names, e.stats.extra, strict=True)):
                self._layer_stats(names, values, rnd=rnd, env=self.env_offset + row, step=step)
        for rb in e.rollbacks:
            self._penalize(rb.local, rb.penalty, penalized_step(step))
            self._lifecycle(rb.pruned_records)
            self._rollback(rb.record, rnd=rnd, env=self.env_offset + rb.local)
        self._lifecycle(e.records)
        if self.hub.enabled(TelemetryLevel.NORMAL):
            self._counterfactuals(e.attribution, e.slot_ids, rnd=rnd, step=step)

    def actions(
        self,
        tr: Transitions,
        d: DecisionColumns,
        normalized: np.ndarray,
        *,
        rnd: int,
        step: int,
        space: ActionSpace,
    ) -> None:
        """The previous step's rewards, then the actions' lifecycle records and events."""
        self.flush_rewards(rnd)
        self._lifecycle(tr.records)
        if not self.hub.enabled(TelemetryLevel.NORMAL):
            return
        ops = OP_NAMES[tr.heads[:, 0]]
        self._actions(tr, d, ops, rnd=rnd, step=step, space=space)
        breakdown = tr.rewards.copy()
        for row, carried in self._carried.items():
            with_rollback_penalty(breakdown[row], carried)
        self._carried.clear()
        self._pending = PendingRewards(breakdown, ops, np.asarray(normalized), step)

    def env_steps(
        self, envs: Summaries, stats: StepStats, t: PhaseTimes, *, rnd: int, step: int
    ) -> None:
        """Per env-step numbers; phase times are the step's (shared by all envs)."""
        columns = {
            "round": rnd,
            "env": envs.index,
            "step": step,
            "train_loss": stats.train_loss.copy(),
            "train_acc": stats.train_acc.copy(),
            "val_loss": stats.val_loss.copy(),
            "val_acc": stats.val_acc.copy(),
            "active_seeds": envs.active_seeds,
            "host_params": envs.host_params,
            "seed_params": envs.seed_params,
            "train_ms": t.train_ms,
            "val_ms": t.val_ms,
            "features_ms": t.features_ms,
            "policy_ms": t.policy_ms,
        }
        self.hub.emit_columns(EventColumns(ev.EnvStep, len(envs.index), columns))

    def flush_rewards(self, rnd: int) -> None:
        """Emit every pending ``reward_computed`` (step end, round end, or on error)."""
        p, self._pending = self._pending, None
        if p is None:
            return
        n = len(p.ops)
        columns = {
            "round": rnd,
            "env": self.env_offset + np.arange(n),
            "step": p.step,
            "family": self.reward_family,
            "op": p.ops,
            "normalized": np.array(p.normalized, dtype=np.float64),
            **{f: np.ascontiguousarray(p.breakdown[:, i]) for i, f in enumerate(_BREAKDOWN_FIELDS)},
        }
        self.hub.emit_columns(EventColumns(ev.RewardComputed, n, columns))

    # ------------------------------------------------------------------ helpers
    def _penalize(self, row: int, penalty: float, step: int) -> None:
        """Put a rollback's penalty on the reward of ``step`` (:func:`penalized_step`):
        the pending one (emitted a step late), or, before any was computed, the first to
        come."""
        pending = self._pending
        if pending is not None and pending.step == step:
            with_rollback_penalty(pending.breakdown[row], penalty)
        else:
            self._carried[row] = self._carried.get(row, 0.0) + penalty

    def _lifecycle(self, records: Records) -> None:
        """The models' lifecycle records (placed when reported), in one hub call."""
        if records:
            self.hub.emit_batch(records)

    def _rollback(self, rec: GovernorRollback, *, rnd: int, env: int) -> None:
        self.hub.emit(msgspec.structs.replace(rec, round=rnd, env=env))

    def _counterfactuals(
        self, a: Attribution, slot_ids: tuple[str, ...], *, rnd: int, step: int
    ) -> None:
        n, width = a.contributions.shape
        exact = np.asarray(a.exact_shapley, dtype=bool)
        # Shapley values of the full factorial's rows only (an empty list elsewhere).
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.where(exact, width, 0), out=offsets[1:])
        shapley = pa.ListArray.from_arrays(
            pa.array(offsets), pa.array(a.shapley[exact].reshape(-1), type=pa.float64())
        )
        columns = {
            "round": rnd,
            "env": self.env_offset + np.arange(n),
            "step": step,
            "slots": list(slot_ids),
            "contributions": np.array(a.contributions, dtype=np.float64),
            "unavailable_reasons": REASON_VALUES[a.reasons],
            "shapley": shapley,
            "interaction": np.array(a.interaction, dtype=np.float64),
            "real_acc": np.array(a.real_acc, dtype=np.float64),
            "all_off_acc": np.array(a.all_off_acc, dtype=np.float64),
            "n_configs": np.array(a.n_configs),
            "exact_shapley": exact.copy(),
        }
        self.hub.emit_columns(EventColumns(ev.CounterfactualComputed, n, columns))

    def _actions(
        self,
        tr: Transitions,
        d: DecisionColumns,
        ops: np.ndarray,
        *,
        rnd: int,
        step: int,
        space: ActionSpace,
    ) -> None:
        heads = np.array(tr.heads, dtype=np.int64)
        n, code = len(heads), heads[:, 0]
        op_mask = np.array(d.op_mask, dtype=bool)
        slot_names = np.array(space.slot_ids, dtype=object)
        columns = {
            "round": rnd,
            "env": self.env_offset + np.arange(n),
            "step": step,
            "op": ops,
            "slot": np.where(NAMES_SLOT[code], slot_names[heads[:, 1]], ""),
            "blueprint": np.where(NAMES_BLUEPRINT[code], BLUEPRINT_NAMES[heads[:, 2]], ""),
            "style": heads[:, 3],
            "tempo": heads[:, 4],
            "alpha_target": ALPHA_TARGET_VALUES[heads[:, 5]],
            "alpha_speed": heads[:, 6],
            "alpha_curve": heads[:, 7],
            "executed": np.array(tr.executed, dtype=bool),
            "op_mask": op_mask,
            "n_valid_ops": op_mask.sum(axis=1),
            "masked_heads": MASKED_HEADS[code],
            "value": np.array(d.value, dtype=np.float64),
            "log_prob": np.array(d.log_prob, dtype=np.float64),
            "op_prob": np.array(d.op_probs[np.arange(n), code], dtype=np.float64),
        }
        self.hub.emit_columns(EventColumns(ev.ActionTaken, n, columns))

    def _layer_stats(
        self, names: list[str], values: np.ndarray, *, rnd: int, env: int, step: int
    ) -> None:
        width = len(LAYER_STAT_FIELDS)
        flat = values.tolist()
        for i, name in enumerate(names):
            grad_norm, param_norm, grad_max_abs, zero_frac = flat[i * width : (i + 1) * width]
            self.hub.emit(
                ev.LayerGradStats(
                    round=rnd,
                    env=env,
                    step=step,
                    layer=name,
                    grad_norm=grad_norm,
                    param_norm=param_norm,
                    grad_max_abs=grad_max_abs,
                    zero_frac=zero_frac,
                )
            )
