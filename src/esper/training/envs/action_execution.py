"""Execute the envs' actions and report what happened.

:func:`execute_actions` runs the step's actions of every env whose action is not WAIT
(the rest need nothing) and says which took effect. ADVANCE changes no module, so the
envs that advance do so in one table operation over all of them
(:func:`~esper.model.stage_moves.advance_cells`), and so do the envs that set an
alpha target; every other op runs per env through :func:`execute_action`, since it
builds, drops or freezes a seed's modules: Python runs per env only for those. The
lifecycle records land, in env order, in the round's table (reported by the envs that
run per env, :meth:`EnvTable.reporter`; merged for the table operations,
:meth:`EnvTable.merge`) and are turned into events by the recorder.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from esper.core.constants import G2_MIN_TRAINING_EPOCHS
from esper.core.enums import Initiator, LifecycleOp, PruneReason
from esper.model.stage_moves import advance_cells, set_alpha_targets
from esper.policy.actions import (
    HEAD_VALUES,
    ActionSpace,
    DecodedAction,
    decode_action,
    head_column,
)
from esper.telemetry.events import LifecycleEvent
from esper.training.envs.env_state import EnvState, make_seed_optimizer
from esper.training.envs.env_table import EnvTable


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


def execute_actions(
    envs: Sequence[EnvState],
    table: EnvTable,
    heads: np.ndarray,
    space: ActionSpace,
    *,
    step: int,
    initiator: Initiator,
) -> np.ndarray:
    """Every env's action (``heads[i]``: env i's head indices; ``table``: the round's,
    its slot table's column j the space's slot j); returns whether each took effect
    (WAIT always does). Python runs per env only for the ops that build, drop or
    freeze modules; the records land in the table in env order."""
    op = heads[:, 0]
    executed = np.ones(len(envs), dtype=bool)
    acting = np.nonzero(op != LifecycleOp.WAIT)[0]
    start = len(table.records)
    records: list[LifecycleEvent] = []
    rows: list[np.ndarray] = []
    for kind in TABLE_OPS:
        at = acting[op[acting] == kind]
        if len(at):
            made, made_rows = _table_op(kind, table, at, heads, space, initiator, executed)
            records += made
            rows.append(made_rows)
    structural = acting[~np.isin(op[acting], TABLE_OPS)]
    for i, indices in zip(structural.tolist(), heads[structural].tolist(), strict=True):
        action = decode_action(indices, space)
        executed[i] = execute_action(envs[i], action, step=step, initiator=initiator)
    if records:
        table.merge(start, records, np.concatenate(rows))
    return executed


def _table_op(
    kind: LifecycleOp,
    table: EnvTable,
    rows: np.ndarray,
    heads: np.ndarray,
    space: ActionSpace,
    initiator: Initiator,
    executed: np.ndarray,
) -> tuple[list[LifecycleEvent], np.ndarray]:
    """Op ``kind`` (one of :data:`TABLE_OPS`) of envs ``rows`` at once: ``executed``
    filled in for them; returns their records and each record's env row."""
    h, slots = heads[rows], table.slots
    cols = head_column(h, "slot", n_slots=space.n_slots)
    ids = [space.slot_ids[c] for c in cols.tolist()]
    if kind == LifecycleOp.ADVANCE:
        strict = table.strict_gates[rows]
        ok, by_env = advance_cells(
            slots, rows, cols, ids, initiator, strict=strict, min_epochs=G2_MIN_TRAINING_EPOCHS
        )
    else:
        target, speed = (HEAD_VALUES[n][head_column(h, n)] for n in ("alpha_target", "alpha_speed"))
        curve = head_column(h, "alpha_curve")
        ok, by_env = set_alpha_targets(
            slots, rows, cols, ids, initiator, target=target, speed=speed, curve=curve
        )
    executed[rows] = ok
    records = list(itertools.chain.from_iterable(by_env))
    return records, np.repeat(rows, list(map(len, by_env)))


#: The ops that change no module: run as table operations over all the envs choosing
#: them (:mod:`esper.model.stage_moves`), their records merged in env order.
TABLE_OPS = (LifecycleOp.ADVANCE, LifecycleOp.SET_ALPHA_TARGET)
