"""Turn trainer records into telemetry events.

Pure functions: each takes host-side values the step has already transferred (never a
device tensor), builds one event and emits it. Callers check ``hub.enabled(level)``
before building the inputs of ``normal``/``debug`` events so a lower level costs
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from esper.core.constants import HEAD_NAMES
from esper.core.records import (
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
)
from esper.telemetry import events as ev
from esper.telemetry.hub import Hub

if TYPE_CHECKING:
    from esper.training.trainer import PhaseTimes, RoundSummary

_RECORD_TAG = SeedGerminatedRecord.__struct_config__.tag_field
#: Lifecycle records whose fields are exactly their event's payload (enums as values).
_SAME_FIELDS: dict[type, type[ev.Event]] = {
    SeedGerminatedRecord: ev.SeedGerminated,
    StageChangedRecord: ev.SeedStageChanged,
    SeedFossilizedRecord: ev.SeedFossilized,
    SeedPrunedRecord: ev.SeedPruned,
}


def emit_lifecycle(hub: Hub, rec: LifecycleRecord, *, rnd: int, env: int, step: int) -> None:
    """One lifecycle record from the model becomes one ``seed_*``/``gate_evaluated`` event."""
    event: ev.Event
    same = _SAME_FIELDS.get(type(rec))
    if same is not None:
        # to_builtins turns enums into their values and tuples into lists, as events store
        # them; the record's own tag is not a payload field.
        payload = msgspec.to_builtins(rec)
        payload.pop(_RECORD_TAG, None)
        event = same(round=rnd, env=env, step=step, **payload)
    elif isinstance(rec, GateRecord):
        res = rec.result
        event = ev.GateEvaluated(
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
    else:  # pragma: no cover - exhaustive over LifecycleRecord
        raise TypeError(f"unknown lifecycle record {type(rec).__name__}")
    hub.emit(event)


def emit_reward(
    hub: Hub,
    br: RewardBreakdown,
    *,
    family: str,
    op: str,
    normalized: float,
    rnd: int,
    env: int,
    step: int,
) -> None:
    hub.emit(
        ev.RewardComputed(
            round=rnd,
            env=env,
            step=step,
            family=family,
            op=op,
            # every breakdown field (tests/training/test_record_event_fields.py)
            **{name: getattr(br, name) for name in RewardBreakdown.__struct_fields__},
            normalized=normalized,
        )
    )


def emit_counterfactual(
    hub: Hub, rec: CounterfactualRecord, *, rnd: int, env: int, step: int
) -> None:
    hub.emit(
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


def emit_rollback(
    hub: Hub, rec: RollbackRecord, *, penalized_step: int, rnd: int, env: int, step: int
) -> None:
    hub.emit(
        ev.GovernorRollback(
            round=rnd,
            env=env,
            step=step,
            reason=rec.reason.value,
            loss=rec.loss,
            threshold=rec.threshold,
            restored_to_step=rec.restored_to_step,
            penalized_step=penalized_step,
            seeds_pruned=list(rec.seeds_pruned),
            transitions_affected=rec.transitions_affected,
            penalty=rec.penalty,
        )
    )


def emit_action(
    hub: Hub,
    *,
    indices: Sequence[int],
    op_name: str,
    slot: str,
    blueprint: str,
    alpha_target: float,
    executed: bool,
    op_mask: list[bool],
    value: float,
    log_prob: float,
    op_prob: float,
    rnd: int,
    env: int,
    step: int,
    relevant: frozenset[str],
) -> None:
    """``indices`` are the raw head indices in HEAD_NAMES order."""
    head = dict(zip(HEAD_NAMES, indices, strict=True))
    hub.emit(
        ev.ActionTaken(
            round=rnd,
            env=env,
            step=step,
            op=op_name,
            slot=slot,
            blueprint=blueprint,
            style=head["style"],
            tempo=head["tempo"],
            alpha_target=alpha_target,
            alpha_speed=head["alpha_speed"],
            alpha_curve=head["alpha_curve"],
            executed=executed,
            op_mask=op_mask,
            n_valid_ops=sum(op_mask),
            masked_heads=[h for h in HEAD_NAMES if h not in relevant],
            value=value,
            log_prob=log_prob,
            op_prob=op_prob,
        )
    )


def emit_ppo(hub: Hub, m: PPOMetrics, *, rnd: int) -> None:
    fields = {name: getattr(m, name) for name in PPOMetrics.__struct_fields__}
    hub.emit(ev.PpoUpdate(round=rnd, **fields))


def round_finished_event(s: RoundSummary, t: PhaseTimes) -> ev.RoundFinished:
    """The ``round_finished`` event of a round's summary and phase times."""
    return ev.RoundFinished(
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
