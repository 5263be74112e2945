"""Which lifecycle ops are legal in which slot: the action masks' rules, torch-free.

:mod:`esper.policy.masks` turns them into the policy's tensors; the telemetry demo
(which must not import torch) asks them what its synthetic policy may do. Both evaluate
the same numpy expressions over ``[N envs, S slots]`` slot columns
(:func:`esper.model.reports.report_columns`), so there is one set of rules.

An op is masked only when it cannot succeed: the lifecycle forbids it (no seed to
prune, a slot taken) or its gate is certain to refuse it by the gate's timing rules
(:func:`esper.model.ticks.advance_ready`, which auto-advance asks too: ADVANCE of a
TRAINING seed before G2's minimum epochs, or of a resting blend whose target is not
alpha 1, G3). See :mod:`esper.policy.masks` for why.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from esper.core.constants import (
    G2_MIN_TRAINING_EPOCHS,
    GERMINATE_BLOCKING,
    GERMINATE_MIN_STEPS_LEFT,
    MIN_PRUNE_AGE,
    PRUNABLE,
    PRUNABLE_AFTER_BLENDING,
)
from esper.core.enums import AlphaMode, LifecycleOp, SeedStage
from esper.model.lifecycle import OCCUPYING_CODES, RETARGETABLE_CODES
from esper.model.slot_table import MODE_CODE, STAGE_CODE, code_set
from esper.model.ticks import advance_ready
from esper.policy.actions import N_OPS

_BLOCKING = code_set(GERMINATE_BLOCKING, STAGE_CODE)
#: The prunable stages, by ``prune_after_blending``.
_PRUNABLE = {
    False: code_set(PRUNABLE, STAGE_CODE),
    True: code_set(PRUNABLE_AFTER_BLENDING, STAGE_CODE),
}


def slot_op_mask(
    col: Mapping[str, np.ndarray],
    *,
    max_seeds: int,
    steps_left: int | None = None,
    prune_after_blending: bool = False,
    g2_min_epochs: int = G2_MIN_TRAINING_EPOCHS,
) -> np.ndarray:
    """Bool ``[N, ops, S]``: op ``o`` is legal in slot ``s`` of env ``n``.

    ``col``: the slot columns (``stage``, ``alpha_mode``, ``age_epochs``,
    ``epochs_in_stage``, ``alpha_target``, ``scheduled_prune``), each ``[N, S]``.
    ``steps_left``: steps of the episode still to play, this one included (``None``: no
    germination deadline). ``prune_after_blending``: PRUNE only seeds that have started
    blending (:data:`PRUNABLE_AFTER_BLENDING`). ``g2_min_epochs``: G2's minimum training
    epochs (the gate's own threshold; the demo scales it down)."""
    stage = col["stage"]
    n, s = stage.shape
    at_rest = col["alpha_mode"] == MODE_CODE[AlphaMode.HOLD]
    steady = ~col["scheduled_prune"].astype(bool)  # a seed being scheduled-pruned accepts no ops

    blocked = _BLOCKING[stage].any(axis=1)
    under_limit = OCCUPYING_CODES[stage].sum(axis=1) < max_seeds
    in_time = steps_left is None or steps_left >= GERMINATE_MIN_STEPS_LEFT
    can_germinate = (~blocked & under_limit & in_time)[:, None]

    slot = np.zeros((n, N_OPS, s), dtype=bool)
    slot[:, LifecycleOp.WAIT] = True
    slot[:, LifecycleOp.GERMINATE] = (stage == STAGE_CODE[SeedStage.DORMANT]) & can_germinate
    slot[:, LifecycleOp.ADVANCE] = steady & advance_ready(
        stage, col["epochs_in_stage"], at_rest, col["alpha_target"], g2_min_epochs=g2_min_epochs
    )
    slot[:, LifecycleOp.FOSSILIZE] = steady & (stage == STAGE_CODE[SeedStage.HOLDING])
    prunable = _PRUNABLE[prune_after_blending]
    slot[:, LifecycleOp.PRUNE] = (
        steady & at_rest & (col["age_epochs"] >= MIN_PRUNE_AGE) & prunable[stage]
    )
    slot[:, LifecycleOp.SET_ALPHA_TARGET] = steady & at_rest & RETARGETABLE_CODES[stage]
    return slot


def op_mask(slot: np.ndarray) -> np.ndarray:
    """Bool ``[N, ops]`` of a :func:`slot_op_mask`: an op is valid exactly when some slot
    is legal for it; WAIT always is."""
    op: np.ndarray = np.asarray(slot.any(axis=2))
    op[:, LifecycleOp.WAIT] = True
    return op
