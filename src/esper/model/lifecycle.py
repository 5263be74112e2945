"""The seed lifecycle state machine of one slot (torch-free).

The state is a view of one cell of a :class:`~esper.model.slot_table.SlotTable`.

Only the transitions in :data:`esper.core.constants.TRANSITIONS` exist; any other is a
bug and raises :class:`IllegalTransitionError` instead of being ignored. After a prune
the slot cools down: EMBARGO_EPOCHS ticks of embargo (PRUNED, then EMBARGOED) followed
by RESETTING_EPOCHS ticks of RESETTING, so it is DORMANT again after exactly
EMBARGO_EPOCHS + RESETTING_EPOCHS ticks.
"""

from __future__ import annotations

import numpy as np

from esper.core.constants import EMBARGO_EPOCHS, FORWARD_STAGES, RESETTING_EPOCHS, TRANSITIONS
from esper.core.enums import BlendOp, GerminationStyle, SeedStage
from esper.errors import EsperError
from esper.model.slot_table import (
    BLEND_CODE,
    BLEND_OPS,
    STAGE_CODE,
    STAGES,
    BlueprintColumn,
    Cell,
    Column,
    bool_column,
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
        check_transition(self.stage, dst)
        spent = self.epochs_in_stage
        self.stage = dst
        self.epochs_in_stage = 0
        if dst == SeedStage.PRUNED:
            self.cooldown_remaining = COOLDOWN_EPOCHS
            self.scheduled_prune = False
        return spent

    def germinate(
        self,
        *,
        seed_id: str,
        blueprint: str,
        style: GerminationStyle,
        blend_op: BlendOp,
        tempo: int,
        planned_target: float,
    ) -> int:
        """DORMANT -> GERMINATED with a fresh identity and zeroed counters."""
        spent = self.transition(SeedStage.GERMINATED)
        self.seed_id = seed_id
        self.blueprint = blueprint
        self.style = style
        self.blend_op = blend_op
        self.tempo = tempo
        self.planned_target = planned_target
        self.age_epochs = 0
        return spent

    def cooldown_moves(self) -> list[tuple[SeedStage, SeedStage, int]]:
        """The transitions the cooldown is due (after its counter moved); makes them."""
        moves: list[tuple[SeedStage, SeedStage, int]] = []
        wanted = cooldown_stage(self.cooldown_remaining)
        while self.stage != wanted:
            src = self.stage
            dst = next(iter(TRANSITIONS[src]))  # the cooldown chain is linear
            moves.append((src, dst, self.transition(dst)))
        if self.stage == SeedStage.DORMANT:
            self.reset_identity()
        return moves

    def cooldown_tick(self) -> list[tuple[SeedStage, SeedStage, int]]:
        """One epoch of the post-prune cooldown; returns the transitions it made."""
        if self.stage not in COOLDOWN_STAGES:
            return []
        self.cooldown_remaining -= 1
        self.epochs_in_stage += 1
        return self.cooldown_moves()

    def reset_identity(self) -> None:
        """Forget the departed seed (the slot is free)."""
        self.seed_id = ""
        self.blueprint = ""
        self.tempo = 0
        self.planned_target = 0.0
        self.age_epochs = 0
        self.cooldown_remaining = 0
        self.scheduled_prune = False

    def clear(self) -> None:
        """Return to DORMANT without a transition: used only when restoring a snapshot."""
        self.stage = SeedStage.DORMANT
        self.epochs_in_stage = 0
        self.reset_identity()


def cooldown_stage(remaining: int) -> SeedStage:
    """The cooldown stage a slot with ``remaining`` ticks left is in."""
    if remaining <= 0:
        return SeedStage.DORMANT
    if remaining <= RESETTING_EPOCHS:
        return SeedStage.RESETTING
    return SeedStage.EMBARGOED


def cooldown_stage_codes(remaining: np.ndarray) -> np.ndarray:
    """:func:`cooldown_stage` over an array of counters (stage codes)."""
    return np.where(
        remaining <= 0,
        STAGE_CODE[SeedStage.DORMANT],
        np.where(
            remaining <= RESETTING_EPOCHS,
            STAGE_CODE[SeedStage.RESETTING],
            STAGE_CODE[SeedStage.EMBARGOED],
        ),
    )
