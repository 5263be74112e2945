"""Execute one decoded action on one env and report what happened.

The single entry point :func:`execute_action` runs for the envs whose action is not
WAIT (the rest need nothing) and says whether the op took effect; the lifecycle records
the model reports land in the round's table (:meth:`EnvTable.reporter`) and are turned
into events by the recorder.
"""

from __future__ import annotations

from esper.core.enums import Initiator, LifecycleOp, PruneReason
from esper.policy.actions import DecodedAction
from esper.training.envs.env_state import EnvState, make_seed_optimizer


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
    opts = env.seed_optimizers
    for slot in env.model.slots_in_order:
        slot_id, present = slot.slot_id, slot.seed is not None
        if present and slot_id not in opts:
            opts[slot_id] = make_seed_optimizer(slot.seed_parameters(), env.host_cfg)
        elif not present and slot_id in opts:
            del opts[slot_id]
    env.table.seed_sgd[env.row] = [s in opts for s in env.model.slot_ids]


def execute_action(
    env: EnvState, action: DecodedAction, *, step: int, initiator: Initiator
) -> bool:
    """Run the lifecycle op of one env that acts (WAIT needs no call); keep governor
    snapshots in step with it. Returns whether it took effect; its seed optimizers are
    brought in line by :func:`sync_seed_optimizers` before the next train pass."""
    executed = _apply(env, action, initiator)
    if executed and action.op == LifecycleOp.FOSSILIZE:
        env.governor.maybe_snapshot(step, env.model, force=True)
    return executed
