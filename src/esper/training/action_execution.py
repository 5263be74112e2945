"""Execute one decoded action on one env and report what happened.

The single entry point :func:`execute_action` returns a small typed
:class:`ActionOutcome`; the lifecycle records the model reports land in the env's
``pending`` list and are turned into events by the trainer.
"""

from __future__ import annotations

import msgspec

from esper.core.enums import Initiator, LifecycleOp, PruneReason
from esper.core.records import SlotReport
from esper.policy.actions import DecodedAction
from esper.training.env_factory import make_seed_optimizer
from esper.training.env_state import EnvState


class ActionOutcome(msgspec.Struct, frozen=True, kw_only=True):
    executed: bool
    slot_before: SlotReport | None
    slot_after: SlotReport | None


def _report(env: EnvState, slot_id: str | None) -> SlotReport | None:
    if slot_id is None or slot_id not in env.model.slot_ids:
        return None
    return env.model.slot(slot_id).report()


def _apply(env: EnvState, a: DecodedAction, initiator: Initiator) -> bool:
    model = env.model
    slot = a.slot_id
    if a.op == LifecycleOp.WAIT:
        return True
    if slot is None:
        return False
    if a.op == LifecycleOp.GERMINATE:
        assert a.blueprint is not None
        return model.germinate(
            slot,
            a.blueprint,
            a.style,
            a.tempo,
            a.alpha_target,
            seed_id=env.next_seed_id(),
            current_acc=env.val_acc,
            initiator=initiator,
        )
    if a.op == LifecycleOp.ADVANCE:
        return model.advance(slot, initiator=initiator)
    if a.op == LifecycleOp.SET_ALPHA_TARGET:
        return model.set_alpha_target(
            slot, a.alpha_target, a.alpha_speed, a.alpha_curve, initiator=initiator
        )
    if a.op == LifecycleOp.PRUNE:
        return model.prune(
            slot,
            speed=a.alpha_speed,
            curve=a.alpha_curve,
            reason=PruneReason.POLICY,
            initiator=initiator,
        )
    if a.op == LifecycleOp.FOSSILIZE:
        return model.fossilize(slot, initiator=initiator)
    raise ValueError(f"unknown op {a.op!r}")


def sync_seed_optimizers(env: EnvState) -> None:
    """One SGD per live seed: add optimizers for new seeds, drop those of removed ones."""
    for slot_id in env.model.slot_ids:
        params = env.model.seed_parameters(slot_id)
        if params and slot_id not in env.seed_optimizers:
            env.seed_optimizers[slot_id] = make_seed_optimizer(params, env.host_cfg)
        elif not params and slot_id in env.seed_optimizers:
            del env.seed_optimizers[slot_id]


def execute_action(
    env: EnvState, action: DecodedAction, *, step: int, initiator: Initiator
) -> ActionOutcome:
    """Run the lifecycle op; keep optimizers and governor snapshots in step with it."""
    before = _report(env, action.slot_id)
    executed = _apply(env, action, initiator)
    sync_seed_optimizers(env)
    if executed and action.op == LifecycleOp.FOSSILIZE:
        env.governor.maybe_snapshot(step, env.model, force=True)
    env.last_op = int(action.op)
    env.last_success = executed
    return ActionOutcome(
        executed=executed,
        slot_before=before,
        slot_after=_report(env, action.slot_id),
    )
