"""The stage moves over many table cells at once (ADVANCE, the cooldown) make the same
moves and records as one cell at a time, and refuse an illegal move without a change."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from esper.core.constants import STYLE_CURVE
from esper.core.enums import AlphaCurve, AlphaMode, GateId, Initiator, SeedStage
from esper.model import IllegalTransitionError
from esper.model.lifecycle import COOLDOWN_EPOCHS, cooldown_stage_codes, transition_cells
from esper.model.slot_table import COLUMNS, MODE_CODE, STAGE_CODE, SlotTable
from esper.model.stage_moves import (
    CellRecords,
    advance_cells,
    finish_cooldowns,
    germinate_cells,
    set_alpha_targets,
)
from esper.telemetry.events import GateEvaluated, SeedStageChanged

N_ENVS, N_SLOTS = 24, 5
MIN_EPOCHS = 3
ADVANCING = (SeedStage.GERMINATED, SeedStage.TRAINING, SeedStage.BLENDING, SeedStage.HOLDING)


def _advancing_table(rng: np.random.Generator) -> SlotTable:
    """Cells in every stage ADVANCE may meet, each gate's checks passing and failing."""
    t = SlotTable(N_ENVS, N_SLOTS)
    shape = t.shape
    t.stage[:] = np.array([STAGE_CODE[s] for s in ADVANCING])[rng.integers(0, 4, shape)]
    t.seed_id[:] = np.array([f"s{i}" for i in range(N_ENVS * N_SLOTS)]).reshape(shape)
    t.blueprint[:] = "norm"
    t.style[:] = rng.choice([int(s) for s in STYLE_CURVE], shape)
    t.tempo[:] = rng.choice([0, 3, 5], shape)
    t.planned_target[:] = rng.choice([0.5, 1.0], shape)
    t.epochs_in_stage[:] = rng.integers(0, 2 * MIN_EPOCHS, shape)
    t.grad_health[:] = np.where(rng.random(shape) < 0.2, np.nan, rng.random(shape))
    t.grad_norm_ratio[:] = rng.random(shape)
    t.last_acc[:] = rng.uniform(40, 60, shape)
    t.acc_at_stage_start[:] = rng.uniform(40, 60, shape)
    t.alpha_target[:] = rng.choice([0.5, 1.0], shape)
    t.alpha[:] = np.where(rng.random(shape) < 0.7, t.alpha_target, 0.3)
    t.alpha_mode[:] = np.where(
        rng.random(shape) < 0.8, MODE_CODE[AlphaMode.HOLD], MODE_CODE[AlphaMode.UP]
    )
    t.scheduled_prune[:] = rng.random(shape) < 0.1
    return t


def _cells() -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.nonzero(np.ones((N_ENVS, N_SLOTS), dtype=bool))
    return rows, cols


def _same_tables(a: SlotTable, b: SlotTable) -> None:
    for name in COLUMNS:
        x, y = getattr(a, name), getattr(b, name)
        if x.dtype.kind == "f":
            np.testing.assert_array_equal(x, y, err_msg=name)
        else:
            assert (x == y).all(), name


def test_advance_over_many_cells_is_each_cell_advanced_alone() -> None:
    many = _advancing_table(np.random.default_rng(0))
    alone = copy.deepcopy(many)
    stage_before = many.stage.copy()
    rows, cols = _cells()
    slots = [f"slot{c}" for c in cols.tolist()]
    strict = np.random.default_rng(1).random(len(rows)) < 0.5
    kwargs = {"strict": strict, "min_epochs": MIN_EPOCHS}
    passed, records = advance_cells(many, rows, cols, slots, Initiator.POLICY, **kwargs)
    for k in range(len(rows)):
        one = slice(k, k + 1)
        p, r = advance_cells(
            alone, rows[one], cols[one], slots[one], Initiator.POLICY,
            strict=strict[one], min_epochs=MIN_EPOCHS,
        )  # fmt: skip
        assert (bool(p[0]), r[0]) == (bool(passed[k]), records[k])
    _same_tables(many, alone)
    # Not vacuous: every gate ran, passing and failing, strict and not; HOLDING has none.
    gates = [r for cell in records for r in cell if isinstance(r, GateEvaluated)]
    seen = {(g.gate, g.passed, g.strict) for g in gates}
    assert {(gate.value, ok) for gate in (GateId.G1, GateId.G2, GateId.G3) for ok in (True, False)
            if gate != GateId.G1 or ok} <= {(g, ok) for g, ok, _ in seen}  # fmt: skip
    assert {True, False} <= {s for _, _, s in seen}
    holding = STAGE_CODE[SeedStage.HOLDING]
    assert all(records[k] == [] for k in np.nonzero(stage_before[rows, cols] == holding)[0])
    moves = [r for cell in records for r in cell if isinstance(r, SeedStageChanged)]
    assert len(moves) == passed.sum() == sum(g.passed for g in gates)


def test_alpha_targets_over_many_cells_are_each_cell_alone() -> None:
    rng = np.random.default_rng(3)
    many = _advancing_table(rng)
    alone = copy.deepcopy(many)
    rows, cols = _cells()
    slots = [f"slot{c}" for c in cols.tolist()]
    n = len(rows)
    values = {
        "target": rng.choice([0.5, 0.7, 1.0], n),
        "speed": rng.choice([0, 3, 5], n),
        "curve": rng.choice([int(c) for c in AlphaCurve], n),
    }
    done, records = set_alpha_targets(many, rows, cols, slots, Initiator.POLICY, **values)
    for k in range(n):
        one = slice(k, k + 1)
        d, r = set_alpha_targets(
            alone, rows[one], cols[one], slots[one], Initiator.POLICY,
            **{name: v[one] for name, v in values.items()},
        )  # fmt: skip
        assert (bool(d[0]), r[0]) == (bool(done[k]), records[k])
    _same_tables(many, alone)
    # Not vacuous: some set, some refused, some HOLDING seeds moved back to BLENDING.
    assert 0 < done.sum() < n
    backs = [r for cell in records for r in cell]
    assert backs and all(
        (r.from_stage, r.to_stage) == (SeedStage.HOLDING.value, SeedStage.BLENDING.value)
        for r in backs
    )
    ramping = many.alpha_mode[rows[done], cols[done]] != MODE_CODE[AlphaMode.HOLD]
    assert ramping.any() and not ramping.all()  # speed 0 jumps at once
    with pytest.raises(ValueError, match="out of range"):
        set_alpha_targets(
            many, rows[:1], cols[:1], slots[:1], Initiator.POLICY,
            target=np.array([1.5]), speed=np.array([0]), curve=np.array([0]),
        )  # fmt: skip


def test_advance_records_follow_each_cell_gate_then_move() -> None:
    t = SlotTable(1, 2)
    t.stage[0] = STAGE_CODE[SeedStage.GERMINATED], STAGE_CODE[SeedStage.TRAINING]
    t.seed_id[0] = "a", "b"
    t.epochs_in_stage[0] = 2, MIN_EPOCHS
    t.grad_health[0, 1] = 1.0
    t.planned_target[0, 1], t.tempo[0, 1] = 1.0, 0
    rows, cols = np.array([0, 0]), np.array([0, 1])
    passed, records = advance_cells(
        t, rows, cols, ["x", "y"], Initiator.SYSTEM, strict=np.zeros(2, bool), min_epochs=MIN_EPOCHS
    )
    assert passed.tolist() == [True, True]
    assert [[type(r).__name__ for r in cell] for cell in records] == [
        ["GateEvaluated", "SeedStageChanged"]
    ] * 2
    gate, move = records[1]
    assert isinstance(gate, GateEvaluated) and isinstance(move, SeedStageChanged)
    assert (gate.slot, gate.seed_id, gate.gate) == ("y", "b", GateId.G2.value)
    # A blend of tempo 0 is at its target at once, and the record shows that alpha.
    assert (move.from_stage, move.to_stage, move.alpha, move.initiator) == (
        SeedStage.TRAINING.value, SeedStage.BLENDING.value, 1.0, Initiator.SYSTEM.value
    )  # fmt: skip
    assert move.epochs_in_prev_stage == MIN_EPOCHS and t.epochs_in_stage[0].tolist() == [0, 0]


def test_germination_over_many_cells_is_each_cell_alone() -> None:
    rng = np.random.default_rng(4)
    many = SlotTable(N_ENVS, N_SLOTS)
    many.contribution[:], many.alpha[:] = 3.0, 0.4  # a departed seed's leftovers
    alone = copy.deepcopy(many)
    rows, cols = _cells()
    n = len(rows)
    values = {
        "seed_ids": [f"s{k}" for k in range(n)],
        "blueprints": rng.choice(["norm", "conv_small"], n).tolist(),
        "style": rng.choice([int(s) for s in STYLE_CURVE], n),
        "tempo": rng.choice([3, 5, 8], n),
        "planned_target": rng.choice([0.5, 1.0], n),
        "n_params": rng.integers(10, 1000, n),
        "acc": rng.uniform(10, 90, n),
    }
    spent = germinate_cells(many, rows, cols, **values)
    for k in range(n):
        one = slice(k, k + 1)
        alone_spent = germinate_cells(
            alone, rows[one], cols[one], **{name: v[one] for name, v in values.items()}
        )
        assert alone_spent.tolist() == spent[one].tolist()
    _same_tables(many, alone)
    assert (many.stage == STAGE_CODE[SeedStage.GERMINATED]).all()
    assert (many.alpha == 0.0).all() and np.isnan(many.contribution).all()
    np.testing.assert_array_equal(many.acc_at_stage_start[rows, cols], values["acc"])
    with pytest.raises(IllegalTransitionError):  # the cells are no longer empty
        germinate_cells(many, rows[:1], cols[:1], **{k: v[:1] for k, v in values.items()})


def _cooling_table() -> SlotTable:
    """Cooling cells at every point of the cooldown, just after the tick moved their
    counters (a PRUNED cell has been pruned one tick ago)."""
    t = SlotTable(N_ENVS, N_SLOTS)
    for k in range(N_ENVS * N_SLOTS):
        r, c = divmod(k, N_SLOTS)
        before = COOLDOWN_EPOCHS - k % COOLDOWN_EPOCHS  # the counter before the tick
        cooling = cooldown_stage_codes(np.array(before))
        t.stage[r, c] = STAGE_CODE[SeedStage.PRUNED] if before == COOLDOWN_EPOCHS else cooling
        t.cooldown_remaining[r, c] = before - 1
        t.epochs_in_stage[r, c] = k % 4
        t.seed_id[r, c], t.blueprint[r, c] = f"s{k}", "norm"
    return t


def test_cooldown_over_many_cells_is_each_cell_alone() -> None:
    many = _cooling_table()
    alone = copy.deepcopy(many)
    rows, cols = _cells()
    slots = [f"slot{c}" for c in cols.tolist()]
    records: CellRecords = finish_cooldowns(many, rows, cols, slots)
    for k in range(len(rows)):
        one = slice(k, k + 1)
        assert finish_cooldowns(alone, rows[one], cols[one], slots[one])[0] == records[k]
    _same_tables(many, alone)
    chains = {tuple((r.from_stage, r.to_stage) for r in cell) for cell in records}
    p, e, r, d = (s.value for s in (SeedStage.PRUNED, SeedStage.EMBARGOED,
                                    SeedStage.RESETTING, SeedStage.DORMANT))  # fmt: skip
    assert chains == {((p, e),), ((e, r),), ((r, d),), ()}  # () : nothing due yet
    made = [r for cell in records for r in cell]
    assert {(r.alpha, r.initiator) for r in made} == {(0.0, Initiator.SYSTEM.value)}
    assert [r.seed_id for r in made] == [f"s{k}" for k, cell in enumerate(records) if cell]
    freed = many.stage == STAGE_CODE[SeedStage.DORMANT]
    assert (
        freed.any() and (many.seed_id[freed] == "").all() and (many.blueprint_id[freed] == 0).all()
    )


def test_an_illegal_move_among_many_changes_nothing() -> None:
    t = _advancing_table(np.random.default_rng(2))
    before = copy.deepcopy(t)
    rows, cols = _cells()
    dst = np.full(len(rows), STAGE_CODE[SeedStage.PRUNED])
    dst[7] = STAGE_CODE[SeedStage.DORMANT]  # no live stage goes straight back
    with pytest.raises(IllegalTransitionError, match="-> DORMANT"):
        transition_cells(t, rows, cols, dst)
    _same_tables(t, before)
    transition_cells(t, rows, cols, STAGE_CODE[SeedStage.PRUNED])
    assert (t.cooldown_remaining == COOLDOWN_EPOCHS).all() and not t.scheduled_prune.any()
