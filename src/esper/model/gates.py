"""Quality gates checked on the way into a stage (permissive by default, strict option).

Every gate lists its checks by name, passed or failed, in its
:class:`~esper.telemetry.events.GateEvaluated` event, so the event says exactly why a
seed did or did not advance. G0 (germinate) and G5 (fossilize) are functions of one
slot's state that return the event: the operations they guard build or freeze modules,
one env at a time. G1-G3, the gates ADVANCE passes, are checks over many table cells at
once (:data:`ADVANCE_GATES`), since advancing changes no module;
:func:`~esper.model.stage_moves.advance_cells` makes their events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

import numpy as np

from esper.core.constants import (
    G2_MIN_GRADIENT_HEALTH,
    G2_STRICT_MIN_GRAD_RATIO,
    G2_STRICT_MIN_IMPROVEMENT_PP,
    G3_STRICT_MIN_BLENDING_EPOCHS,
    G5_STRICT_MIN_CONTRIBUTION_PP,
)
from esper.core.enums import AlphaMode, GateId, SeedStage
from esper.model.alpha import ALPHA_MAX
from esper.model.lifecycle import SeedLifecycle
from esper.model.metrics import SeedMetrics
from esper.model.slot_table import MODE_CODE, STAGE_CODE, SlotTable
from esper.telemetry.events import GateEvaluated

Check = tuple[str, Any]
_GERMINATED = STAGE_CODE[SeedStage.GERMINATED]
_TRAINING = STAGE_CODE[SeedStage.TRAINING]
_BLENDING = STAGE_CODE[SeedStage.BLENDING]
_HOLD = MODE_CODE[AlphaMode.HOLD]


def gate_record(
    gate: GateId,
    target: SeedStage,
    checks: Iterable[Check],
    strict: bool,
    *,
    slot: str = "",
    seed_id: str = "",
) -> GateEvaluated:
    """The ``gate_evaluated`` event of a check (G0 and G5 have their slot and seed filled
    in by the slot)."""
    passed: list[str] = []
    failed: list[str] = []
    for name, ok in checks:
        (passed if ok else failed).append(name)
    verdict = "passed" if not failed else "failed: " + ", ".join(failed)
    mode = "strict" if strict else "permissive"
    return GateEvaluated(
        slot=slot,
        seed_id=seed_id,
        gate=gate.value,
        target_stage=target.value,
        passed=not failed,
        checks_passed=passed,
        checks_failed=failed,
        message=f"{gate.value} ({mode}) -> {target.value} {verdict}",
        strict=strict,
    )


def healthy(grad_health: Any) -> Any:
    """A measured gradient health at or above G2's floor (for a float or an array)."""
    return np.isfinite(grad_health) & (grad_health >= G2_MIN_GRADIENT_HEALTH)


def gate_g0(
    *,
    seed_id: str,
    blueprint: str,
    blueprint_known: bool,
    stage: SeedStage,
    live_seeds: int,
    max_seeds: int,
    strict: bool,
) -> GateEvaluated:
    """Germinate: identity and blueprint present, slot empty, seed limit not reached."""
    checks = [
        ("seed_id_present", bool(seed_id)),
        ("blueprint_present", bool(blueprint)),
        ("blueprint_known", blueprint_known),
        ("slot_empty", stage == SeedStage.DORMANT),
        ("under_seed_limit", live_seeds < max_seeds),
    ]
    return gate_record(GateId.G0, SeedStage.GERMINATED, checks, strict)


#: An ADVANCE gate's checks over many cells: (name, which cells pass) for every gate
#: mode, then the strict mode's extra checks.
CellChecks = tuple[list[tuple[str, np.ndarray]], list[tuple[str, np.ndarray]]]


def checks_g1(t: SlotTable, rows: np.ndarray, cols: np.ndarray, min_epochs: int) -> CellChecks:
    """Train: the seed has germinated."""
    return [("stage_germinated", t.stage[rows, cols] == _GERMINATED)], []


def checks_g2(t: SlotTable, rows: np.ndarray, cols: np.ndarray, min_epochs: int) -> CellChecks:
    """Blend: trained ``min_epochs`` or more with a measured, healthy gradient (the
    threshold is a parameter so the short telemetry demo can scale it down)."""
    health = t.grad_health[rows, cols]
    improvement = t.last_acc[rows, cols] - t.acc_at_stage_start[rows, cols]
    ratio = t.grad_norm_ratio[rows, cols]
    return [
        ("stage_training", t.stage[rows, cols] == _TRAINING),
        (f"epochs_in_training>={min_epochs}", t.epochs_in_stage[rows, cols] >= min_epochs),
        ("gradient_health_measured", np.isfinite(health)),
        (f"gradient_health>={G2_MIN_GRADIENT_HEALTH}", healthy(health)),
    ], [
        (
            f"stage_improvement>={G2_STRICT_MIN_IMPROVEMENT_PP}pp",
            np.isfinite(improvement) & (improvement >= G2_STRICT_MIN_IMPROVEMENT_PP),
        ),
        (
            f"grad_ratio>={G2_STRICT_MIN_GRAD_RATIO}",
            np.isfinite(ratio) & (ratio >= G2_STRICT_MIN_GRAD_RATIO),
        ),
    ]


def checks_g3(t: SlotTable, rows: np.ndarray, cols: np.ndarray, min_epochs: int) -> CellChecks:
    """Hold: the blend reached alpha 1.0 and the controller is at rest."""
    target = t.alpha_target[rows, cols]
    return [
        ("stage_blending", t.stage[rows, cols] == _BLENDING),
        ("alpha_target_is_1", target == ALPHA_MAX),
        ("alpha_reached_target", t.alpha[rows, cols] == target),
        ("alpha_at_rest", t.alpha_mode[rows, cols] == _HOLD),
        ("not_scheduled_for_prune", ~t.scheduled_prune[rows, cols]),
    ], [
        (
            f"epochs_in_blending>={G3_STRICT_MIN_BLENDING_EPOCHS}",
            t.epochs_in_stage[rows, cols] >= G3_STRICT_MIN_BLENDING_EPOCHS,
        )
    ]


#: The gate ADVANCE passes from each stage it can leave: (gate, stage it leads to, its
#: checks), by the stage's code.
ADVANCE_GATES: Final[dict[int, tuple[GateId, SeedStage, Callable[..., CellChecks]]]] = {
    _GERMINATED: (GateId.G1, SeedStage.TRAINING, checks_g1),
    _TRAINING: (GateId.G2, SeedStage.BLENDING, checks_g2),
    _BLENDING: (GateId.G3, SeedStage.HOLDING, checks_g3),
}


def gate_g5(life: SeedLifecycle, metrics: SeedMetrics, *, strict: bool) -> GateEvaluated:
    """Fossilize: contribution measured and the seed healthy (strict: it helps >= 1 pp)."""
    checks = [
        ("stage_holding", life.stage == SeedStage.HOLDING),
        ("contribution_measured", metrics.contribution_measured),
        ("seed_healthy", bool(healthy(metrics.grad_health))),
    ]
    if strict:
        checks.append(
            (
                f"contribution>={G5_STRICT_MIN_CONTRIBUTION_PP}pp",
                metrics.contribution_measured
                and metrics.contribution >= G5_STRICT_MIN_CONTRIBUTION_PP,
            )
        )
    return gate_record(GateId.G5, SeedStage.FOSSILIZED, checks, strict)
