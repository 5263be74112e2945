"""Stage moves that change no module, over many (env, slot) cells at once (torch-free).

Why: ADVANCE (a gate G1-G3, then the move and what it does to alpha and the metrics),
SET_ALPHA_TARGET and the post-prune cooldown only rewrite columns of a
:class:`~esper.model.slot_table.SlotTable`. Run cell by cell through the slot's views
they cost tens of Python calls per cell; here each is array expressions over every cell
that needs it, and its records (``gate_evaluated``, ``seed_stage_changed``) are built
from the columns, one list per cell in the order the cell made them. The caller emits
them where the cell's records go; the per-cell operations of
:class:`~esper.model.slot_state.SlotState` run these on their one cell, so there is one
implementation of each rule. A germination's table side (the new identity, alpha and
measurements) is one such operation too; its module is built per env by the caller.

One operation has a fixed cost (a few dozen numpy calls, about 30 us) where the per-cell
code it replaced cost about 6 us per cell: it pays from about 7 cells a step, which a
round of 64 envs reaches (benchmarks/README.md, "Stage moves as table operations").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from esper.core.constants import STYLE_BLEND, STYLE_CURVE
from esper.core.enums import AlphaCurve, AlphaMode, Initiator, SeedStage
from esper.model import gates
from esper.model.alpha import ALPHA_MAX, ALPHA_MIN, force_alphas, retarget_alphas
from esper.model.lifecycle import (
    RETARGETABLE_CODES,
    cooldown_cells,
    effective_alphas,
    transition_cells,
)
from esper.model.slot_table import (
    BLEND_CODE,
    METRICS_COLUMNS,
    MODE_CODE,
    STAGE_CODE,
    STAGES,
    SlotTable,
    blueprint_id,
)
from esper.telemetry.events import LifecycleEvent, SeedStageChanged

#: Per cell, its records in the order it made them.
CellRecords = list[list[LifecycleEvent]]

_TRAINING = STAGE_CODE[SeedStage.TRAINING]
_BLENDING = STAGE_CODE[SeedStage.BLENDING]
_HOLDING = STAGE_CODE[SeedStage.HOLDING]
_HOLD = MODE_CODE[AlphaMode.HOLD]
_GERMINATED = STAGE_CODE[SeedStage.GERMINATED]
#: The alpha curve and blend operator of each germination style, by the style's code.
_STYLE_CURVE = np.zeros(max(map(int, STYLE_CURVE)) + 1, dtype=np.int64)
_STYLE_CURVE[[int(s) for s in STYLE_CURVE]] = [int(c) for c in STYLE_CURVE.values()]
_STYLE_BLEND = np.zeros(max(map(int, STYLE_BLEND)) + 1, dtype=np.int64)
_STYLE_BLEND[[int(s) for s in STYLE_BLEND]] = [BLEND_CODE[b] for b in STYLE_BLEND.values()]


def move_cells(t: SlotTable, rows: np.ndarray, cols: np.ndarray, dst: int) -> np.ndarray:
    """Move every cell to stage ``dst`` (a code) with the move's rules: the metrics start
    the stage at the last accuracy, a blend out of TRAINING ramps alpha to the planned
    target over the tempo, HOLDING rests at alpha 1. Returns the epochs each cell spent
    in its old stage."""
    src = t.stage[rows, cols]
    spent = transition_cells(t, rows, cols, dst)
    t.acc_at_stage_start[rows, cols] = t.last_acc[rows, cols]
    if dst == _BLENDING:
        blend = src == _TRAINING
        r, c = rows[blend], cols[blend]
        curve = _STYLE_CURVE[t.style[r, c]]
        retarget_alphas(t, r, c, t.planned_target[r, c], t.tempo[r, c], curve)
    elif dst == _HOLDING:
        force_alphas(t, rows, cols, ALPHA_MAX)
    return spent


def stage_records(
    t: SlotTable,
    rows: np.ndarray,
    cols: np.ndarray,
    slot_ids: Sequence[str],
    src: np.ndarray,
    spent: np.ndarray,
    initiator: Initiator,
) -> list[SeedStageChanged]:
    """The ``seed_stage_changed`` record of each cell's move from ``src`` (codes) to the
    stage it is in now; ``slot_ids[k]``: cell k's slot."""
    return _stage_changes(
        slot_ids,
        t.seed_id[rows, cols],
        t.blueprint[rows, cols],
        src,
        t.stage[rows, cols],
        spent,
        effective_alphas(t, (rows, cols)),
        initiator,
    )


def _stage_changes(
    slot_ids: Sequence[str],
    seed_ids: np.ndarray,
    blueprints: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    spent: np.ndarray,
    alphas: np.ndarray,
    initiator: Initiator,
) -> list[SeedStageChanged]:
    """``seed_stage_changed`` records from their columns (stages as codes)."""
    return [
        SeedStageChanged(
            slot=slot,
            seed_id=seed_id,
            blueprint=blueprint,
            from_stage=STAGES[a].value,
            to_stage=STAGES[b].value,
            epochs_in_prev_stage=n,
            alpha=alpha,
            initiator=initiator.value,
        )
        for slot, seed_id, blueprint, a, b, n, alpha in zip(
            slot_ids,
            seed_ids.tolist(),
            blueprints.tolist(),
            src.tolist(),
            dst.tolist(),
            spent.tolist(),
            alphas.tolist(),
            strict=True,
        )
    ]


def germinate_cells(
    t: SlotTable,
    rows: np.ndarray,
    cols: np.ndarray,
    *,
    seed_ids: Sequence[str],
    blueprints: Sequence[str],
    style: np.ndarray,
    tempo: np.ndarray,
    planned_target: np.ndarray,
    n_params: np.ndarray,
    acc: np.ndarray,
) -> np.ndarray:
    """The table side of germinating at every cell (DORMANT -> GERMINATED; G0 passed,
    the seed's modules built by the caller): a new identity, alpha at rest at 0, nothing
    measured but the accuracy ``acc`` at germination. Returns the epochs each cell spent
    DORMANT."""
    spent = transition_cells(t, rows, cols, _GERMINATED)
    t.seed_id[rows, cols] = seed_ids
    t.blueprint[rows, cols] = blueprints
    t.blueprint_id[rows, cols] = [blueprint_id(b) for b in blueprints]
    t.style[rows, cols] = style
    t.blend_op[rows, cols] = _STYLE_BLEND[style]
    t.tempo[rows, cols] = tempo
    t.planned_target[rows, cols] = planned_target
    t.age_epochs[rows, cols] = 0
    t.n_params[rows, cols] = n_params
    force_alphas(t, rows, cols, ALPHA_MIN)
    t.alpha_curve[rows, cols] = int(AlphaCurve.LINEAR)
    t.alpha_last_delta[rows, cols] = 0.0
    t.reset(METRICS_COLUMNS, rows, cols)
    for column in (t.acc_at_germination, t.acc_at_stage_start, t.last_acc):
        column[rows, cols] = acc
    return spent


def advance_cells(
    t: SlotTable,
    rows: np.ndarray,
    cols: np.ndarray,
    slot_ids: Sequence[str],
    initiator: Initiator,
    *,
    strict: np.ndarray,
    min_epochs: int,
) -> tuple[np.ndarray, CellRecords]:
    """ADVANCE at every cell: GERMINATED -> TRAINING through G1, TRAINING -> BLENDING
    through G2 (``min_epochs`` of training), BLENDING -> HOLDING through G3; ``strict``:
    per cell, whether its gates are strict. Returns which cells moved and their records
    (the gate check, then the move if it passed; nothing where no gate applies)."""
    n = len(rows)
    stage = t.stage[rows, cols]
    passed = np.zeros(n, dtype=bool)
    records: CellRecords = [[] for _ in range(n)]
    seed_ids = t.seed_id[rows, cols].tolist()
    for code, (gate, target, checks) in gates.ADVANCE_GATES.items():
        at = np.nonzero(stage == code)[0]
        if not len(at):
            continue
        base, extra = checks(t, rows[at], cols[at], min_epochs)
        names = [name for name, _ in base + extra]
        oks = np.stack([ok for _, ok in base + extra], axis=1)
        is_strict = strict[at]
        passed[at] = oks[:, : len(base)].all(axis=1) & (~is_strict | oks[:, len(base) :].all(1))
        width = np.where(is_strict, len(names), len(base)).tolist()
        for k, ok, s, w in zip(at.tolist(), oks.tolist(), is_strict.tolist(), width, strict=True):
            checked = zip(names[:w], ok[:w], strict=True)
            records[k].append(
                gates.gate_record(gate, target, checked, s, slot=slot_ids[k], seed_id=seed_ids[k])
            )
        moved = at[passed[at]]
        r, c = rows[moved], cols[moved]
        spent = move_cells(t, r, c, STAGE_CODE[target])
        moved_slots = [slot_ids[k] for k in moved.tolist()]
        made = stage_records(t, r, c, moved_slots, stage[moved], spent, initiator)
        for k, record in zip(moved.tolist(), made, strict=True):
            records[k].append(record)
    return passed, records


def set_alpha_targets(
    t: SlotTable,
    rows: np.ndarray,
    cols: np.ndarray,
    slot_ids: Sequence[str],
    initiator: Initiator,
    *,
    target: np.ndarray,
    speed: np.ndarray,
    curve: np.ndarray,
) -> tuple[np.ndarray, CellRecords]:
    """SET_ALPHA_TARGET at every cell: a BLENDING or HOLDING seed at rest, not being
    pruned and not at ``target`` already, ramps there over ``speed`` ticks along
    ``curve`` (codes; per cell), a HOLDING one back in BLENDING first. Returns which
    cells were retargeted and their records (the move back to BLENDING, if any)."""
    if not np.all((target >= ALPHA_MIN) & (target <= ALPHA_MAX)) or np.any(speed < 0):
        raise ValueError(f"alpha targets {target} / speeds {speed} out of range")
    stage = t.stage[rows, cols]
    ok = (
        RETARGETABLE_CODES[stage]
        & ~t.scheduled_prune[rows, cols]
        & (t.alpha_mode[rows, cols] == _HOLD)
        & (target != t.alpha[rows, cols])
    )
    records: CellRecords = [[] for _ in range(len(rows))]
    back = np.nonzero(ok & (stage == _HOLDING))[0]
    r, c = rows[back], cols[back]
    spent = move_cells(t, r, c, _BLENDING)
    moved_slots = [slot_ids[k] for k in back.tolist()]
    made = stage_records(t, r, c, moved_slots, stage[back], spent, initiator)
    for k, record in zip(back.tolist(), made, strict=True):
        records[k].append(record)
    at = np.nonzero(ok)[0]
    retarget_alphas(t, rows[at], cols[at], target[at], speed[at], curve[at])
    return ok, records


def finish_cooldowns(
    t: SlotTable, rows: np.ndarray, cols: np.ndarray, slot_ids: Sequence[str]
) -> CellRecords:
    """The cooldown's stage changes due at every cell (after the tick moved its
    counter), made, with their records (the departed seed's identity on each, though a
    cell that reaches DORMANT forgets it)."""
    records: CellRecords = [[] for _ in range(len(rows))]
    slots = np.array(slot_ids, dtype=object)
    seed_ids, blueprints = t.seed_id[rows, cols], t.blueprint[rows, cols]  # copies
    for at, src, dst, spent in cooldown_cells(t, rows, cols):
        no_blend = np.full(len(at), ALPHA_MIN)  # no cooldown stage blends
        made = _stage_changes(
            slots[at].tolist(), seed_ids[at], blueprints[at], src, dst, spent, no_blend,
            Initiator.SYSTEM,
        )  # fmt: skip
        for k, record in zip(at.tolist(), made, strict=True):
            records[k].append(record)
    return records
