"""Quality gates checked on the way into a stage (permissive by default, strict option).

Each gate is a pure function of the slot's state that returns the
:class:`~esper.telemetry.events.GateEvaluated` event itself, listing every check by name,
passed or failed, so the event says exactly why a seed did or did not advance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from esper.core.constants import (
    G2_MIN_GRADIENT_HEALTH,
    G2_MIN_TRAINING_EPOCHS,
    G2_STRICT_MIN_GRAD_RATIO,
    G2_STRICT_MIN_IMPROVEMENT_PP,
    G3_STRICT_MIN_BLENDING_EPOCHS,
    G5_STRICT_MIN_CONTRIBUTION_PP,
)
from esper.core.enums import GateId, SeedStage
from esper.model.alpha import ALPHA_MAX, AlphaController
from esper.model.lifecycle import SeedLifecycle
from esper.model.metrics import SeedMetrics
from esper.telemetry.events import GateEvaluated

Check = tuple[str, bool]


def _result(
    gate: GateId, target: SeedStage, checks: Sequence[Check], strict: bool
) -> GateEvaluated:
    """The ``gate_evaluated`` event of a check (its slot and seed filled in by the slot)."""
    passed = [name for name, ok in checks if ok]
    failed = [name for name, ok in checks if not ok]
    verdict = "passed" if not failed else "failed: " + ", ".join(failed)
    mode = "strict" if strict else "permissive"
    return GateEvaluated(
        slot="",
        seed_id="",
        gate=gate.value,
        target_stage=target.value,
        passed=not failed,
        checks_passed=passed,
        checks_failed=failed,
        message=f"{gate.value} ({mode}) -> {target.value} {verdict}",
        strict=strict,
    )


def _healthy(metrics: SeedMetrics) -> bool:
    return math.isfinite(metrics.grad_health) and metrics.grad_health >= G2_MIN_GRADIENT_HEALTH


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
    return _result(GateId.G0, SeedStage.GERMINATED, checks, strict)


def gate_g1(life: SeedLifecycle, *, strict: bool) -> GateEvaluated:
    """Train: the seed has germinated."""
    checks = [("stage_germinated", life.stage == SeedStage.GERMINATED)]
    return _result(GateId.G1, SeedStage.TRAINING, checks, strict)


def gate_g2(
    life: SeedLifecycle,
    metrics: SeedMetrics,
    *,
    strict: bool,
    min_epochs: int = G2_MIN_TRAINING_EPOCHS,
) -> GateEvaluated:
    """Blend: trained ``min_epochs`` or more with a measured, healthy gradient (the
    threshold is a parameter so the short telemetry demo can scale it down)."""
    checks = [
        ("stage_training", life.stage == SeedStage.TRAINING),
        (f"epochs_in_training>={min_epochs}", life.epochs_in_stage >= min_epochs),
        ("gradient_health_measured", math.isfinite(metrics.grad_health)),
        (f"gradient_health>={G2_MIN_GRADIENT_HEALTH}", _healthy(metrics)),
    ]
    if strict:
        imp = metrics.improvement
        ratio = metrics.grad_norm_ratio
        checks += [
            (
                f"stage_improvement>={G2_STRICT_MIN_IMPROVEMENT_PP}pp",
                math.isfinite(imp) and imp >= G2_STRICT_MIN_IMPROVEMENT_PP,
            ),
            (
                f"grad_ratio>={G2_STRICT_MIN_GRAD_RATIO}",
                math.isfinite(ratio) and ratio >= G2_STRICT_MIN_GRAD_RATIO,
            ),
        ]
    return _result(GateId.G2, SeedStage.BLENDING, checks, strict)


def gate_g3(life: SeedLifecycle, alpha: AlphaController, *, strict: bool) -> GateEvaluated:
    """Hold: the blend reached alpha 1.0 and the controller is at rest."""
    checks = [
        ("stage_blending", life.stage == SeedStage.BLENDING),
        ("alpha_target_is_1", alpha.target == ALPHA_MAX),
        ("alpha_reached_target", alpha.alpha == alpha.target),
        ("alpha_at_rest", alpha.at_rest),
        ("not_scheduled_for_prune", not life.scheduled_prune),
    ]
    if strict:
        checks.append(
            (
                f"epochs_in_blending>={G3_STRICT_MIN_BLENDING_EPOCHS}",
                life.epochs_in_stage >= G3_STRICT_MIN_BLENDING_EPOCHS,
            )
        )
    return _result(GateId.G3, SeedStage.HOLDING, checks, strict)


def gate_g5(life: SeedLifecycle, metrics: SeedMetrics, *, strict: bool) -> GateEvaluated:
    """Fossilize: contribution measured and the seed healthy (strict: it helps >= 1 pp)."""
    checks = [
        ("stage_holding", life.stage == SeedStage.HOLDING),
        ("contribution_measured", metrics.contribution_measured),
        ("seed_healthy", _healthy(metrics)),
    ]
    if strict:
        checks.append(
            (
                f"contribution>={G5_STRICT_MIN_CONTRIBUTION_PP}pp",
                metrics.contribution_measured
                and metrics.contribution >= G5_STRICT_MIN_CONTRIBUTION_PP,
            )
        )
    return _result(GateId.G5, SeedStage.FOSSILIZED, checks, strict)
