"""A seed slot's lifecycle operations without its modules (torch-free).

Why apart from :class:`~esper.model.slot.SeedSlot`: every rule of what an operation
does (which gate it passes, which stage it moves to, what happens to alpha and the
metrics, which events it reports) is bookkeeping over a
:class:`~esper.model.slot_table.SlotTable` cell and needs no torch. ``SeedSlot`` adds
the seed module, its blend gate and the forward pass; the telemetry demo drives this
class directly, so its synthetic lifecycles follow the same code as a training run.
The stage moves (ADVANCE's gates, a move's effects on alpha and the metrics, the
cooldown) are table operations over any number of cells
(:mod:`esper.model.stage_moves`), which a step runs over every env at once; the methods
here run them on this slot's one cell.

Each stage change and gate check is reported through ``emit`` (injected by the owner)
as the event itself; the recorder (or the demo) adds the round, env and step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec
import numpy as np

from esper.core.constants import G2_MIN_TRAINING_EPOCHS, STYLE_BLEND
from esper.core.enums import AlphaCurve, GerminationStyle, Initiator, PruneReason, SeedStage
from esper.core.records import SlotReport
from esper.model import gates
from esper.model.alpha import ALPHA_MIN, AlphaController
from esper.model.lifecycle import BLENDED_STAGES, SeedLifecycle
from esper.model.metrics import SeedMetrics
from esper.model.reports import slot_report
from esper.model.slot_table import COLUMNS, INITIATOR_CODE, INITIATORS, STAGE_CODE, SlotTable
from esper.model.stage_moves import (
    advance_cells,
    germinate_cells,
    move_cells,
    set_alpha_targets,
    stage_records,
)
from esper.telemetry.events import (
    GateEvaluated,
    LifecycleEvent,
    SeedFossilized,
    SeedGerminated,
    SeedPruned,
)

Emit = Callable[[LifecycleEvent], None]


def _discard(_event: LifecycleEvent) -> None:
    pass


class SlotState:
    """Lifecycle, alpha and metrics of one slot (views of one table cell) and the
    operations on them. ``g2_min_epochs``: G2's minimum training epochs."""

    def __init__(
        self,
        slot_id: str,
        *,
        strict: bool = False,
        auto_advance: bool = False,
        table: SlotTable | None = None,
        row: int = 0,
        col: int = 0,
        g2_min_epochs: int = G2_MIN_TRAINING_EPOCHS,
    ) -> None:
        self.slot_id = slot_id
        self.strict = strict
        self.auto_advance = auto_advance
        self.g2_min_epochs = g2_min_epochs
        table = SlotTable(1, 1) if table is None else table
        self.life = SeedLifecycle(table, row, col)
        self.alpha = AlphaController(table=table, row=row, col=col)
        self.metrics = SeedMetrics(table, row, col)
        self.emit: Emit = _discard

    def bind(self, table: SlotTable, row: int, col: int) -> None:
        """Keep this slot's state in another table's cell (copied there first)."""
        old = self.life
        for name in COLUMNS:
            getattr(table, name)[row, col] = getattr(old.table, name)[old.row, old.col]
        self._attach(table, row, col)

    def renew(self, table: SlotTable, row: int, col: int) -> None:
        """Start over in a fresh table's cell (a new round reusing this slot): the seed's
        modules dropped, the state that cell's (nothing copied, nothing reported)."""
        self._drop_seed()
        self._attach(table, row, col)

    def _attach(self, table: SlotTable, row: int, col: int) -> None:
        for view in (self.life, self.alpha, self.metrics):
            view.table, view.row, view.col = table, row, col

    @property
    def n_params(self) -> int:
        """Parameters of the seed (and its blend gate) while one is installed."""
        life = self.life
        return int(life.table.n_params[life.row, life.col])

    @n_params.setter
    def n_params(self, value: int) -> None:
        life = self.life
        life.table.n_params[life.row, life.col] = value

    # --- queries ---------------------------------------------------------------------

    @property
    def stage(self) -> SeedStage:
        return self.life.stage

    @property
    def effective_alpha(self) -> float:
        return self.alpha.alpha if self.life.stage in BLENDED_STAGES else ALPHA_MIN

    def report(self) -> SlotReport:
        life = self.life
        return slot_report(life.table, life.row, life.col, self.slot_id)

    # --- lifecycle operations ----------------------------------------------------------

    def germinate(
        self,
        *,
        seed_id: str,
        blueprint: str,
        style: GerminationStyle,
        tempo: int,
        alpha_target: float,
        current_acc: float,
        n_params: int,
        initiator: Initiator,
    ) -> None:
        """DORMANT -> GERMINATED (G0 already passed; the seed has ``n_params``)."""
        blend_op = STYLE_BLEND[style]
        t, rows, cols = self._cell()
        src = t.stage[rows, cols]
        spent = germinate_cells(
            t,
            rows,
            cols,
            seed_ids=[seed_id],
            blueprints=[blueprint],
            style=np.array([int(style)]),
            tempo=np.array([tempo]),
            planned_target=np.array([alpha_target], dtype=np.float64),
            n_params=np.array([n_params]),
            acc=np.array([current_acc], dtype=np.float64),
        )
        self._emit_all(stage_records(t, rows, cols, [self.slot_id], src, spent, initiator))
        self.emit(
            SeedGerminated(
                slot=self.slot_id,
                seed_id=seed_id,
                blueprint=blueprint,
                style=int(style),
                blend_op=blend_op.value,
                tempo=tempo,
                alpha_target=alpha_target,
                params=n_params,
                acc_at_germination=current_acc,
            )
        )

    def advance(self, initiator: Initiator) -> bool:
        """GERMINATED->TRAINING (G1), TRAINING->BLENDING (G2), BLENDING->HOLDING (G3)."""
        passed, records = advance_cells(
            *self._cell(),
            [self.slot_id],
            initiator,
            strict=np.array([self.strict]),
            min_epochs=self.g2_min_epochs,
        )
        self._emit_all(records[0])
        return bool(passed[0])

    def set_alpha_target(
        self, target: float, speed: int, curve: AlphaCurve, initiator: Initiator
    ) -> bool:
        """Retarget a BLENDING/HOLDING seed at rest (HOLDING goes back to BLENDING)."""
        done, records = set_alpha_targets(
            *self._cell(),
            [self.slot_id],
            initiator,
            target=np.array([target], dtype=np.float64),
            speed=np.array([speed]),
            curve=np.array([int(curve)]),
        )
        self._emit_all(records[0])
        return bool(done[0])

    def prune(
        self, *, speed: int, curve: AlphaCurve, reason: PruneReason, initiator: Initiator
    ) -> bool:
        """Instant (speed 0 or alpha already 0) or scheduled (ramp alpha to 0, then prune)."""
        life = self.life
        if not life.live or life.stage == SeedStage.FOSSILIZED or life.scheduled_prune:
            return False
        if speed == 0 or self.effective_alpha == ALPHA_MIN:
            self._prune_now(reason, initiator, scheduled=False)
            return True
        if not self.alpha.at_rest:
            return False
        if life.stage == SeedStage.HOLDING:
            self._move(SeedStage.BLENDING, initiator)
        self.alpha.retarget(ALPHA_MIN, speed, curve)
        life.scheduled_prune = True
        life.table.prune_initiator[life.row, life.col] = INITIATOR_CODE[initiator]
        self._set_trainable(False)
        return True

    def force_prune(self, reason: PruneReason, initiator: Initiator) -> bool:
        """Prune a live, non-fossilized seed at once (even mid-ramp); used by rollbacks."""
        if not self.life.live or self.life.stage == SeedStage.FOSSILIZED:
            return False
        self._prune_now(reason, initiator, scheduled=False)
        return True

    def fossilize(self, initiator: Initiator) -> bool:
        """HOLDING -> FOSSILIZED through G5."""
        if not self.life.live:
            return False
        result = gates.gate_g5(self.life, self.metrics, strict=self.strict)
        self.emit_gate(result)
        if not result.passed:
            return False
        self._move(SeedStage.FOSSILIZED, initiator)
        m = self.metrics
        self.emit(
            SeedFossilized(
                slot=self.slot_id,
                seed_id=self.life.seed_id,
                blueprint=self.life.blueprint,
                contribution=m.contribution,
                params=self.n_params,
                age_epochs=self.life.age_epochs,
            )
        )
        return True

    def complete_scheduled_prune(self) -> None:
        """A scheduled prune's ramp came to rest at alpha 0: prune now."""
        life = self.life
        initiator = INITIATORS[int(life.table.prune_initiator[life.row, life.col])]
        self._prune_now(PruneReason.SCHEDULED_COMPLETE, initiator, scheduled=True)

    def record_contribution(self, contribution_pp: float) -> None:
        if self.life.live:
            self.metrics.record_contribution(contribution_pp)

    def record_gradients(self, seed_norm: float, host_norm: float, n_host: int) -> None:
        """Take one epoch's gradient norms; only seeds that train are measured."""
        trains = self.life.stage in BLENDED_STAGES or self.life.stage == SeedStage.TRAINING
        if trains and not self.life.scheduled_prune:
            self.metrics.record_gradients(seed_norm, self.n_params, host_norm, n_host)

    # --- hooks for the seed's modules (none here) -----------------------------------------

    def _set_trainable(self, flag: bool) -> None:
        """Freeze or thaw the seed's parameters (a scheduled prune freezes them)."""

    def _drop_seed(self) -> None:
        """Remove the seed's modules (a prune)."""

    # --- internals -------------------------------------------------------------------

    def _cell(self) -> tuple[SlotTable, np.ndarray, np.ndarray]:
        """This slot's table cell, as the table operations take cells."""
        return (self.life.table, *self.life.cells())

    def _emit_all(self, records: Iterable[LifecycleEvent]) -> None:
        for record in records:
            self.emit(record)

    def _move(self, dst: SeedStage, initiator: Initiator) -> None:
        t, rows, cols = self._cell()
        src = t.stage[rows, cols]
        spent = move_cells(t, rows, cols, STAGE_CODE[dst])
        self._emit_all(stage_records(t, rows, cols, [self.slot_id], src, spent, initiator))

    def _prune_now(self, reason: PruneReason, initiator: Initiator, *, scheduled: bool) -> None:
        life = self.life
        stage_at_prune = life.stage
        life.scheduled_prune = False
        self.alpha.force(ALPHA_MIN)
        self._drop_seed()
        self._move(SeedStage.PRUNED, initiator)
        self.emit(
            SeedPruned(
                slot=self.slot_id,
                seed_id=life.seed_id,
                blueprint=life.blueprint,
                reason=reason.value,
                initiator=initiator.value,
                age_epochs=life.age_epochs,
                stage_at_prune=stage_at_prune.value,
                contribution=self.metrics.contribution,
                scheduled=scheduled,
            )
        )

    def emit_gate(self, result: GateEvaluated, *, seed_id: str | None = None) -> None:
        """Report a gate check (G0 passes the candidate seed id before the seed exists)."""
        sid = self.life.seed_id if seed_id is None else seed_id
        self.emit(msgspec.structs.replace(result, slot=self.slot_id, seed_id=sid))
