"""What a slot reports (:class:`~esper.core.records.SlotReport`), from its table cells.

One definition of each reported field for both readers: :func:`report_columns` gives the
fields of many cells as arrays (the policy's features and masks read these for every env
at once), and :func:`slot_report` one cell's as a :class:`SlotReport` (for the code that
reads one slot: rule-based policies, tests, the counterfactual reasons' callers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from esper.core.enums import AlphaCurve
from esper.core.records import SlotReport
from esper.model.alpha import ALPHA_MIN
from esper.model.lifecycle import BLENDED_CODES, LIVE_CODES
from esper.model.slot_table import (
    BLEND_OPS,
    MODES,
    STAGE_CODE,
    STAGES,
    SlotTable,
    blueprint_id,
)


def report_columns(t: SlotTable, where: Any = slice(None)) -> dict[str, np.ndarray]:
    """The numeric :class:`SlotReport` fields of the cells at ``where``, as arrays (enum
    fields as codes: ``stage`` into STAGES, ``blend_op`` into BLEND_OPS, ``alpha_mode``
    into MODES; ``blueprint_id`` besides the name)."""
    stage = t.stage[where]
    blended = BLENDED_CODES[stage]
    live = LIVE_CODES[stage]
    return {
        "stage": stage,
        "blueprint_id": t.blueprint_id[where],
        "blend_op": t.blend_op[where],
        # A seed outside the blend contributes nothing, whatever its controller holds.
        "alpha": np.where(blended, t.alpha[where], ALPHA_MIN),
        # Before blending starts, the target chosen at germination.
        "alpha_target": np.where(blended, t.alpha_target[where], t.planned_target[where]),
        "alpha_mode": t.alpha_mode[where],
        "alpha_curve": t.alpha_curve[where],
        "alpha_steps_total": t.alpha_steps_total[where],
        "alpha_steps_done": t.alpha_steps_done[where],
        "alpha_velocity": t.alpha_last_delta[where],
        "tempo": t.tempo[where],
        "age_epochs": t.age_epochs[where],
        "epochs_in_stage": t.epochs_in_stage[where],
        "acc_at_germination": t.acc_at_germination[where],
        "acc_at_stage_start": t.acc_at_stage_start[where],
        "improvement": t.last_acc[where] - t.acc_at_stage_start[where],
        "contribution": t.contribution[where],
        "contribution_velocity": t.contribution_velocity[where],
        "epochs_since_contribution": t.epochs_since_contribution[where],
        "grad_norm_ratio": t.grad_norm_ratio[where],
        "grad_health": t.grad_health[where],
        "params": np.where(live, t.n_params[where], 0),
        "embargo_remaining": t.cooldown_remaining[where],
        "scheduled_prune": t.scheduled_prune[where],
    }


def slot_report(t: SlotTable, row: int, col: int, slot_id: str) -> SlotReport:
    """Cell (row, col) as the slot ``slot_id``'s report."""
    c = {k: v.item() for k, v in report_columns(t, (row, col)).items()}
    return SlotReport(
        slot_id=slot_id,
        stage=STAGES[c["stage"]],
        seed_id=str(t.seed_id[row, col]),
        blueprint=str(t.blueprint[row, col]),
        blend_op=BLEND_OPS[c["blend_op"]],
        alpha=c["alpha"],
        alpha_target=c["alpha_target"],
        alpha_mode=MODES[c["alpha_mode"]],
        alpha_curve=int(AlphaCurve(c["alpha_curve"])),
        alpha_steps_total=c["alpha_steps_total"],
        alpha_steps_done=c["alpha_steps_done"],
        alpha_velocity=c["alpha_velocity"],
        tempo=c["tempo"],
        age_epochs=c["age_epochs"],
        epochs_in_stage=c["epochs_in_stage"],
        acc_at_germination=c["acc_at_germination"],
        acc_at_stage_start=c["acc_at_stage_start"],
        improvement=c["improvement"],
        contribution=c["contribution"],
        contribution_velocity=c["contribution_velocity"],
        epochs_since_contribution=c["epochs_since_contribution"],
        grad_norm_ratio=c["grad_norm_ratio"],
        grad_health=c["grad_health"],
        params=c["params"],
        embargo_remaining=c["embargo_remaining"],
        scheduled_prune=c["scheduled_prune"],
    )


#: :func:`report_columns`'s fields read straight from a report (the rest are codes).
_PLAIN_FIELDS = (
        "alpha", "alpha_target", "alpha_curve", "alpha_steps_total", "alpha_steps_done",
        "alpha_velocity", "tempo", "age_epochs", "epochs_in_stage", "acc_at_germination",
        "acc_at_stage_start", "improvement", "contribution", "contribution_velocity",
        "epochs_since_contribution", "grad_norm_ratio", "grad_health", "params",
        "embargo_remaining", "scheduled_prune",
)  # fmt: skip
_BLEND_CODE = {b: i for i, b in enumerate(BLEND_OPS)}
_MODE_CODE = {m: i for i, m in enumerate(MODES)}


def columns_of_reports(reports: Sequence[Sequence[SlotReport]]) -> dict[str, np.ndarray]:
    """:func:`report_columns` of ``[N][S]`` reports (every env listing its slots in one
    order): what a caller holding reports rather than a table passes to the features
    and masks."""
    n, s = len(reports), len(reports[0]) if reports else 0
    flat = [r for env in reports for r in env]
    out = {name: np.array([getattr(r, name) for r in flat]).reshape(n, s) for name in _PLAIN_FIELDS}
    out["stage"] = np.array([STAGE_CODE[r.stage] for r in flat], dtype=np.int64).reshape(n, s)
    out["blueprint_id"] = np.array([blueprint_id(r.blueprint) for r in flat], dtype=np.int64)
    out["blueprint_id"] = out["blueprint_id"].reshape(n, s)
    out["blend_op"] = np.array([_BLEND_CODE[r.blend_op] for r in flat], dtype=np.int64)
    out["blend_op"] = out["blend_op"].reshape(n, s)
    out["alpha_mode"] = np.array([_MODE_CODE[r.alpha_mode] for r in flat], dtype=np.int64)
    out["alpha_mode"] = out["alpha_mode"].reshape(n, s)
    return out
