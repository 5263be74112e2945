"""The seed lifecycle state machine of one slot (torch-free).

Only the transitions in :data:`esper.core.constants.TRANSITIONS` exist; any other is a
bug and raises :class:`IllegalTransitionError` instead of being ignored. After a prune
the slot cools down: EMBARGO_EPOCHS ticks of embargo (PRUNED, then EMBARGOED) followed
by RESETTING_EPOCHS ticks of RESETTING, so it is DORMANT again after exactly
EMBARGO_EPOCHS + RESETTING_EPOCHS ticks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from esper.core.constants import EMBARGO_EPOCHS, FORWARD_STAGES, RESETTING_EPOCHS, TRANSITIONS
from esper.core.enums import BlendOp, GerminationStyle, SeedStage
from esper.errors import EsperError

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


@dataclass
class SeedLifecycle:
    """Stage, identity and epoch counters of the seed in one slot."""

    stage: SeedStage = SeedStage.DORMANT
    seed_id: str = ""
    blueprint: str = ""
    style: GerminationStyle = GerminationStyle.LINEAR_ADD
    blend_op: BlendOp = BlendOp.ADD
    tempo: int = 0
    #: Alpha target chosen at germination, used when blending starts.
    planned_target: float = 0.0
    age_epochs: int = 0
    epochs_in_stage: int = 0
    #: Ticks left until a pruned slot is DORMANT again (0 outside the cooldown).
    cooldown_remaining: int = 0
    #: A scheduled prune is ramping alpha to 0; the seed is frozen meanwhile.
    scheduled_prune: bool = False
    history: list[SeedStage] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.stage in LIVE_STAGES

    def transition(self, dst: SeedStage) -> int:
        """Move to ``dst`` (raises if illegal); returns the epochs spent in the old stage."""
        check_transition(self.stage, dst)
        spent = self.epochs_in_stage
        self.history.append(self.stage)
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
        self.history = []
        return spent

    def cooldown_tick(self) -> list[tuple[SeedStage, SeedStage, int]]:
        """One epoch of the post-prune cooldown; returns the transitions it made."""
        if self.stage not in COOLDOWN_STAGES:
            return []
        self.cooldown_remaining -= 1
        self.epochs_in_stage += 1
        moves: list[tuple[SeedStage, SeedStage, int]] = []
        wanted = self._cooldown_stage()
        while self.stage != wanted:
            src = self.stage
            dst = next(iter(TRANSITIONS[src]))  # the cooldown chain is linear
            moves.append((src, dst, self.transition(dst)))
        if self.stage == SeedStage.DORMANT:
            self.reset_identity()
        return moves

    def _cooldown_stage(self) -> SeedStage:
        if self.cooldown_remaining <= 0:
            return SeedStage.DORMANT
        if self.cooldown_remaining <= RESETTING_EPOCHS:
            return SeedStage.RESETTING
        return SeedStage.EMBARGOED

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
        self.history = []
        self.reset_identity()
