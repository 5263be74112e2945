"""The per-epoch tick of seed slots, over many envs' slots at once.

Every slot ages, its alpha ramp moves, its measurements age and a pruned slot's
cooldown counts down: array updates over a :class:`~esper.model.slot_table.SlotTable`'s
rows. What changes a stage is reported: the cooldown's steps are table
operations over all cells at once (:mod:`esper.model.stage_moves`); a scheduled prune
coming to rest (it drops the seed's modules) and an auto-advance run per cell through
the slot objects; the records of all of them are reported in (env, slot) order.

A model's own :meth:`~esper.model.morphogenetic.MorphogeneticModel.tick` is this
function on its one row; the trainer calls it once for every env of a round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from esper.core.constants import G2_MIN_TRAINING_EPOCHS
from esper.core.enums import AlphaMode, Initiator, SeedStage
from esper.model.alpha import ALPHA_MAX, step_alphas
from esper.model.lifecycle import COOLDOWN_STAGES, LIVE_CODES, cooldown_stage_codes
from esper.model.slot_table import METRICS_COLUMNS, MODE_CODE, STAGE_CODE, SlotTable, code_set
from esper.model.stage_moves import finish_cooldowns

if TYPE_CHECKING:
    from esper.model.slot_state import SlotState

#: The slot object of table cell (row, col): what the per-cell work goes through (a
#: model's :class:`~esper.model.slot.SeedSlot`, or the demo's torch-free ``SlotState``).
SlotOf = Callable[[int, int], "SlotState"]

COOLDOWN_CODES = code_set(COOLDOWN_STAGES, STAGE_CODE)
_DORMANT = STAGE_CODE[SeedStage.DORMANT]
_GERMINATED = STAGE_CODE[SeedStage.GERMINATED]
_TRAINING = STAGE_CODE[SeedStage.TRAINING]
_BLENDING = STAGE_CODE[SeedStage.BLENDING]
_HOLD = MODE_CODE[AlphaMode.HOLD]


def advance_ready(
    stage: np.ndarray,
    epochs_in_stage: np.ndarray,
    at_rest: np.ndarray,
    alpha_target: np.ndarray,
    *,
    g2_min_epochs: int = G2_MIN_TRAINING_EPOCHS,
) -> np.ndarray:
    """Cells whose ADVANCE gate's timing rules can pass (G1 at once, G2 after
    ``g2_min_epochs`` training epochs, G3 once the blend rests at alpha 1); the gate's
    other checks (gradient health, strict extras) still decide. Auto-advance and the
    ADVANCE mask (:mod:`esper.policy.mask_rules`) both ask this."""
    ready: np.ndarray = (
        (stage == _GERMINATED)
        | ((stage == _TRAINING) & (epochs_in_stage >= g2_min_epochs))
        | ((stage == _BLENDING) & at_rest & (alpha_target >= ALPHA_MAX))
    )
    return ready


def advance_due(t: SlotTable, rows: np.ndarray) -> np.ndarray:
    """Auto-advance: :func:`advance_ready` for the cells of ``rows``."""
    return advance_ready(
        t.stage[rows], t.epochs_in_stage[rows], t.alpha_mode[rows] == _HOLD, t.alpha_target[rows]
    )


def tick_slots(
    t: SlotTable, rows: np.ndarray, val_acc: np.ndarray, slot_of: SlotOf, *, auto_advance: bool
) -> None:
    """One epoch for every slot of ``rows`` (``val_acc[i]``: row i's accuracy, percent)."""
    stage = t.stage[rows]
    live = LIVE_CODES[stage]
    cool = COOLDOWN_CODES[stage]
    # The cooldown counts down; live seeds age and observe the epoch.
    t.cooldown_remaining[rows] -= cool
    t.epochs_in_stage[rows] += cool | live
    t.age_epochs[rows] += live
    t.last_acc[rows] = np.where(live, val_acc[:, None], t.last_acc[rows])
    since = t.epochs_since_contribution[rows]
    t.epochs_since_contribution[rows] = np.where(live & (since >= 0), since + 1, since)
    r, c = np.nonzero(live)
    step_alphas(t, (rows[r], c))
    # Stage changes: the cooldown's over all cells at once, then each cell's records
    # reported in (env, slot) order, a scheduled prune or an auto-advance made there.
    moves = cool & (cooldown_stage_codes(t.cooldown_remaining[rows]) != stage)
    pruning = live & t.scheduled_prune[rows] & (t.alpha_mode[rows] == _HOLD)
    advancing = live & ~pruning & advance_due(t, rows) if auto_advance else np.zeros_like(live)
    i, j = np.nonzero(moves | pruning | advancing)
    slots = [slot_of(row, col) for row, col in zip(rows[i].tolist(), j.tolist(), strict=True)]
    cooling = moves[i, j]
    ids = [s.slot_id for s, c in zip(slots, cooling.tolist(), strict=True) if c]
    cooled = iter(finish_cooldowns(t, rows[i[cooling]], j[cooling], ids))
    for slot, cools, prunes in zip(slots, cooling.tolist(), pruning[i, j].tolist(), strict=True):
        if cools:
            for record in next(cooled):
                slot.emit(record)
        elif prunes:
            slot.complete_scheduled_prune()
        else:
            slot.advance(Initiator.SYSTEM)
    # A free slot reports nothing measured.
    freed = ~live & (t.stage[rows] == _DORMANT)
    r, c = np.nonzero(freed)
    t.reset(METRICS_COLUMNS, rows[r], c)
