"""The seed lifecycle state machine of one slot (torch-free).

The state is a view of one cell of a :class:`~esper.model.slot_table.SlotTable`.

Only the transitions in :data:`esper.core.constants.TRANSITIONS` exist; any other is a
bug and raises :class:`IllegalTransitionError` instead of being ignored. After a prune
the slot cools down: EMBARGO_EPOCHS ticks of embargo (PRUNED, then EMBARGOED) followed
by RESETTING_EPOCHS ticks of RESETTING, so it is DORMANT again after exactly
EMBARGO_EPOCHS + RESETTING_EPOCHS ticks.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from esper.core.constants import (
    EMBARGO_EPOCHS,
    FORWARD_STAGES,
    OCCUPYING,
    RESETTING_EPOCHS,
    RETARGETABLE,
    TRANSITIONS,
)
from esper.core.enums import BlendOp, GerminationStyle, SeedStage
from esper.errors import EsperError
from esper.model.alpha import ALPHA_MIN
from esper.model.slot_table import (
    BLEND_CODE,
    BLEND_OPS,
    LIFECYCLE_COLUMNS,
    STAGE_CODE,
    STAGES,
    BlueprintColumn,
    Cell,
    Column,
    SlotTable,
    bool_column,
    code_set,
    float_column,
    int_column,
    str_column,
)

#: A seed module exists in the slot (it may or may not run in the forward pass).
LIVE_STAGES = frozenset(
    {
        SeedStage.GERMINATED,
        SeedStage.TRAINING,
        SeedStage.BLENDING,
        SeedStage.HOLDING,
        SeedStage.FOSSILIZED,
    }
)
#: The seed's output is mixed into the host's (alpha applies).
BLENDED_STAGES = frozenset({SeedStage.BLENDING, SeedStage.HOLDING, SeedStage.FOSSILIZED})
#: The seed reads the host activation detached, so the host trains as if alone.
ISOLATED_STAGES = frozenset({SeedStage.GERMINATED, SeedStage.TRAINING})
#: Post-prune cooldown; the slot is unusable until it is DORMANT again.
COOLDOWN_STAGES = frozenset({SeedStage.PRUNED, SeedStage.EMBARGOED, SeedStage.RESETTING})
COOLDOWN_EPOCHS = EMBARGO_EPOCHS + RESETTING_EPOCHS

assert FORWARD_STAGES <= LIVE_STAGES


class IllegalTransitionError(EsperError, RuntimeError):
    """A stage change outside the lifecycle's transition table was attempted."""


def check_transition(src: SeedStage, dst: SeedStage) -> None:
    """Raise unless ``src -> dst`` is an allowed lifecycle transition."""
    if dst not in TRANSITIONS[src]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[src])) or "none (terminal)"
        raise IllegalTransitionError(
            f"illegal seed transition {src.value} -> {dst.value} (allowed from "
            f"{src.value}: {allowed})"
        )


class SeedLifecycle(Cell):
    """Stage, identity and epoch counters of the seed in one slot (a view of one cell of
    a :class:`~esper.model.slot_table.SlotTable`; see there)."""

    __slots__ = ()

    stage: Column[SeedStage] = Column("stage", STAGES.__getitem__, STAGE_CODE.__getitem__)
    seed_id = str_column("seed_id")
    blueprint = BlueprintColumn()
    style: Column[GerminationStyle] = Column("style", GerminationStyle, int)
    blend_op: Column[BlendOp] = Column("blend_op", BLEND_OPS.__getitem__, BLEND_CODE.__getitem__)
    tempo = int_column("tempo")
    #: Alpha target chosen at germination, used when blending starts.
    planned_target = float_column("planned_target")
    age_epochs = int_column("age_epochs")
    epochs_in_stage = int_column("epochs_in_stage")
    #: Ticks left until a pruned slot is DORMANT again (0 outside the cooldown).
    cooldown_remaining = int_column("cooldown_remaining")
    #: A scheduled prune is ramping alpha to 0; the seed is frozen meanwhile.
    scheduled_prune = bool_column("scheduled_prune")

    @property
    def live(self) -> bool:
        return self.stage in LIVE_STAGES

    def transition(self, dst: SeedStage) -> int:
        """Move to ``dst`` (raises if illegal); returns the epochs spent in the old stage."""
        return int(transition_cells(self.table, *self.cells(), STAGE_CODE[dst])[0])

    def cooldown_tick(self) -> list[tuple[SeedStage, SeedStage, int]]:
        """One epoch of the post-prune cooldown; returns the transitions it made."""
        if self.stage not in COOLDOWN_STAGES:
            return []
        self.cooldown_remaining -= 1
        self.epochs_in_stage += 1
        return [
            (STAGES[int(src[0])], STAGES[int(dst[0])], int(spent[0]))
            for _, src, dst, spent in cooldown_cells(self.table, *self.cells())
        ]

    def reset_identity(self) -> None:
        """Forget the departed seed (the slot is free)."""
        self.table.reset(IDENTITY_COLUMNS, self.row, self.col)

    def clear(self) -> None:
        """Return to DORMANT without a transition: used only when restoring a snapshot."""
        self.stage = SeedStage.DORMANT
        self.epochs_in_stage = 0
        self.reset_identity()


def _legal_moves() -> np.ndarray:
    legal = np.zeros((len(STAGES), len(STAGES)), dtype=bool)
    for src, dsts in TRANSITIONS.items():
        legal[STAGE_CODE[src], [STAGE_CODE[d] for d in dsts]] = True
    return legal


#: ``LEGAL[src, dst]``: whether ``src -> dst`` is in the transition table (codes).
LEGAL: Final = _legal_moves()
#: Which stage codes blend the seed's output in (alpha applies).
BLENDED_CODES: Final = code_set(BLENDED_STAGES, STAGE_CODE)
#: Which stage codes have a seed module in the slot.
LIVE_CODES: Final = code_set(LIVE_STAGES, STAGE_CODE)
#: Which stage codes hold the slot (count against the seed limit).
OCCUPYING_CODES: Final = code_set(OCCUPYING, STAGE_CODE)
#: Which stage codes run the seed in the forward pass.
FORWARD_CODES: Final = code_set(FORWARD_STAGES, STAGE_CODE)
#: Which stage codes train the seed in a train pass (unless it is scheduled for prune).
TRAINS_CODES: Final = code_set(BLENDED_STAGES | {SeedStage.TRAINING}, STAGE_CODE)
#: Which stage codes let the alpha target be changed.
RETARGETABLE_CODES: Final = code_set(RETARGETABLE, STAGE_CODE)
_PRUNED = STAGE_CODE[SeedStage.PRUNED]
_DORMANT = STAGE_CODE[SeedStage.DORMANT]
#: The departed seed's identity and counters, forgotten once its slot is free.
IDENTITY_COLUMNS: Final = {
    name: LIFECYCLE_COLUMNS[name]
    for name in (
        "seed_id", "blueprint", "blueprint_id", "tempo", "planned_target", "age_epochs",
        "cooldown_remaining", "scheduled_prune",
    )
}  # fmt: skip
#: The next stage of the post-prune chain (PRUNED -> EMBARGOED -> RESETTING -> DORMANT),
#: by code; -1 outside it.
COOLDOWN_NEXT: Final = np.full(len(STAGES), -1, dtype=np.int64)
COOLDOWN_NEXT[[STAGE_CODE[s] for s in COOLDOWN_STAGES]] = [
    STAGE_CODE[next(iter(TRANSITIONS[s]))] for s in COOLDOWN_STAGES
]


def effective_alphas(t: SlotTable, where: Any = ...) -> np.ndarray:
    """Alpha where the seed's output is blended in, else 0, at cells ``where`` (any
    index; all of them by default)."""
    out: np.ndarray = np.where(BLENDED_CODES[t.stage[where]], t.alpha[where], ALPHA_MIN)
    return out


def transition_cells(t: SlotTable, rows: np.ndarray, cols: np.ndarray, dst: Any) -> np.ndarray:
    """Move every cell ``[rows, cols]`` to stage code(s) ``dst`` (raises, changing
    nothing, if any move is illegal); returns the epochs each spent in its old stage. A
    move to PRUNED starts the cooldown."""
    src = t.stage[rows, cols]
    dst = np.broadcast_to(dst, src.shape)
    legal = LEGAL[src, dst]
    if not legal.all():
        bad = int(np.argmin(legal))
        check_transition(STAGES[src[bad]], STAGES[dst[bad]])
    spent: np.ndarray = t.epochs_in_stage[rows, cols]
    t.stage[rows, cols] = dst
    t.epochs_in_stage[rows, cols] = 0
    pruned = dst == _PRUNED
    t.cooldown_remaining[rows[pruned], cols[pruned]] = COOLDOWN_EPOCHS
    t.scheduled_prune[rows[pruned], cols[pruned]] = False
    return spent


def cooldown_cells(
    t: SlotTable, rows: np.ndarray, cols: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """The cooldown's stage changes due at cells ``[rows, cols]`` (after the tick moved
    their counters), made: per link of the chain, ``(cells, src, dst, spent)`` with
    ``cells`` indexing ``rows``. A cell that reaches DORMANT forgets its seed."""
    moves = []
    wanted = cooldown_stage_codes(t.cooldown_remaining[rows, cols])
    at = np.arange(len(rows))
    while True:
        at = at[t.stage[rows[at], cols[at]] != wanted[at]]
        if not len(at):
            break
        r, c = rows[at], cols[at]
        src = t.stage[r, c]
        dst = COOLDOWN_NEXT[src]
        if np.any(dst < 0):
            raise ValueError("a cooldown move was asked of a slot outside the cooldown")
        moves.append((at, src, dst, transition_cells(t, r, c, dst)))
    freed = t.stage[rows, cols] == _DORMANT
    t.reset(IDENTITY_COLUMNS, rows[freed], cols[freed])
    return moves


def cooldown_stage_codes(remaining: np.ndarray) -> np.ndarray:
    """The cooldown stage (code) of slots with ``remaining`` ticks left: EMBARGOED, then
    RESETTING for the last RESETTING_EPOCHS, DORMANT at 0."""
    return np.where(
        remaining <= 0,
        STAGE_CODE[SeedStage.DORMANT],
        np.where(
            remaining <= RESETTING_EPOCHS,
            STAGE_CODE[SeedStage.RESETTING],
            STAGE_CODE[SeedStage.EMBARGOED],
        ),
    )
