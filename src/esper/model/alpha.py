"""The alpha controller: how strongly a seed's output is blended into the host.

Alpha moves between a start and a target over a fixed number of epochs along a curve.
It can only be retargeted while at rest (mode HOLD) so a blend in progress is never
silently redirected, and the last step snaps exactly onto the target so curves never
leave a floating-point residue (a "done" blend is exactly 1.0, a pruned one exactly 0).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from esper.core.constants import SIGMOID_STEEPNESS
from esper.core.enums import AlphaCurve, AlphaMode
from esper.model.slot_table import (
    MODE_CODE,
    MODES,
    Cell,
    Column,
    SlotTable,
    float_column,
    int_column,
)

ALPHA_MIN = 0.0
ALPHA_MAX = 1.0
_HALF = 0.5


class AlphaControllerError(RuntimeError):
    """The controller was asked for something its rules forbid (a bug in the caller)."""


def _logistic(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def curve_value(curve: AlphaCurve, progress: float) -> float:
    """Fraction of the way from start to target after ``progress`` in [0, 1].

    Every curve maps 0 -> 0 and 1 -> 1; the sigmoid curves are rescaled logistics so
    their steepness changes the shape but not the end points.
    """
    p = min(max(progress, 0.0), 1.0)
    if curve == AlphaCurve.LINEAR:
        return p
    if curve == AlphaCurve.COSINE:
        return _HALF * (1.0 - math.cos(math.pi * p))
    k = SIGMOID_STEEPNESS[curve]
    lo, hi = _logistic(-k * _HALF), _logistic(k * _HALF)
    return (_logistic(k * (p - _HALF)) - lo) / (hi - lo)


class AlphaController(Cell):
    """Alpha, its start and target, mode, curve and step counters of one slot (a view of
    one cell of a :class:`~esper.model.slot_table.SlotTable`; ``AlphaController(a)``
    alone is a controller resting at ``a``)."""

    __slots__ = ()

    alpha = float_column("alpha")
    start = float_column("alpha_start")
    target = float_column("alpha_target")
    mode: Column[AlphaMode] = Column("alpha_mode", MODES.__getitem__, MODE_CODE.__getitem__)
    curve: Column[AlphaCurve] = Column("alpha_curve", AlphaCurve, int)
    steps_total = int_column("alpha_steps_total")
    steps_done = int_column("alpha_steps_done")
    last_delta = float_column("alpha_last_delta")

    def __init__(
        self, alpha: float = ALPHA_MIN, *, table: SlotTable | None = None, row: int = 0,
        col: int = 0,
    ) -> None:  # fmt: skip
        super().__init__(table, row, col)
        if table is None:
            self.reset(alpha)

    def reset(self, alpha: float = ALPHA_MIN) -> None:
        """At rest at ``alpha``, no ramp (a fresh controller)."""
        self.force(alpha)
        self.curve = AlphaCurve.LINEAR
        self.last_delta = 0.0

    @property
    def at_rest(self) -> bool:
        return self.mode == AlphaMode.HOLD

    @property
    def progress(self) -> float:
        """Fraction of the current (or last) ramp completed; 1.0 when there was none."""
        total = self.steps_total
        return self.steps_done / total if total else 1.0

    def retarget(self, target: float, steps: int, curve: AlphaCurve) -> None:
        """Start a ramp to ``target`` over ``steps`` ticks (0: jump at once).

        Raises if the controller is moving: retargeting is allowed only from HOLD.
        """
        if not self.at_rest:
            raise AlphaControllerError(
                f"cannot retarget alpha while {self.mode.value} "
                f"({self.steps_done}/{self.steps_total} steps to {self.target})"
            )
        if not ALPHA_MIN <= target <= ALPHA_MAX:
            raise AlphaControllerError(f"alpha target {target} outside [0, 1]")
        if steps < 0:
            raise AlphaControllerError(f"alpha ramp length must be >= 0, got {steps}")
        retarget_alphas(self.table, self.row, self.col, target, steps, int(curve))

    def step(self) -> float:
        """Advance one tick; returns the change in alpha (0 while at rest)."""
        step_alphas(self.table, (self.row, self.col))
        return self.last_delta

    def force(self, value: float) -> None:
        """Set alpha and come to rest at once (stage rules such as HOLDING = 1.0)."""
        force_alphas(self.table, self.row, self.col, value)


#: Ramps up to this many ticks take their curve values from one precomputed table
#: (exactly :func:`curve_value`'s floats); longer ones (never the action space's) are
#: computed cell by cell.
CURVE_TABLE_STEPS = 32
_CURVE_TABLE = np.array(
    [
        [
            [
                curve_value(c, done / total) if total else 1.0
                for done in range(CURVE_TABLE_STEPS + 1)
            ]
            for total in range(CURVE_TABLE_STEPS + 1)
        ]
        for c in AlphaCurve
    ],
    dtype=np.float64,
)
_HOLD = MODE_CODE[AlphaMode.HOLD]
_UP = MODE_CODE[AlphaMode.UP]
_DOWN = MODE_CODE[AlphaMode.DOWN]


def force_alphas(t: SlotTable, rows: Any, cols: Any, value: Any) -> None:
    """:meth:`AlphaController.force` at every cell ``[rows, cols]`` (any index)."""
    t.alpha_last_delta[rows, cols] = value - t.alpha[rows, cols]
    t.alpha[rows, cols] = value
    t.alpha_start[rows, cols] = value
    t.alpha_target[rows, cols] = value
    t.alpha_mode[rows, cols] = _HOLD
    t.alpha_steps_total[rows, cols] = 0
    t.alpha_steps_done[rows, cols] = 0


def retarget_alphas(
    t: SlotTable, rows: Any, cols: Any, target: Any, steps: Any, curve: Any
) -> None:
    """:meth:`AlphaController.retarget` at every cell ``[rows, cols]``, without its
    checks (the callers' stage rules guarantee them): a ramp to ``target`` over
    ``steps`` ticks along ``curve`` (codes), or a jump where ``steps`` is 0 or alpha is
    there already."""
    alpha = t.alpha[rows, cols]
    jump = (np.asarray(steps) == 0) | (target == alpha)
    t.alpha_start[rows, cols] = alpha
    t.alpha_target[rows, cols] = target
    t.alpha_curve[rows, cols] = curve
    t.alpha_steps_done[rows, cols] = 0
    t.alpha_last_delta[rows, cols] = np.where(jump, target - alpha, t.alpha_last_delta[rows, cols])
    t.alpha[rows, cols] = np.where(jump, target, alpha)
    t.alpha_steps_total[rows, cols] = np.where(jump, 0, steps)
    t.alpha_mode[rows, cols] = np.where(jump, _HOLD, np.where(target > alpha, _UP, _DOWN))


def step_alphas(t: SlotTable, where: Any) -> None:
    """One tick of every alpha controller at ``where`` (an index into the table's
    ``[env, slot]`` cells): :meth:`AlphaController.step`, over all of them at once."""
    mode = t.alpha_mode[where]
    moving = mode != _HOLD
    before = t.alpha[where]
    done = t.alpha_steps_done[where] + moving
    total = t.alpha_steps_total[where]
    finished = moving & (done >= total)
    ramping = moving & ~finished
    curve = t.alpha_curve[where]
    inside = total <= CURVE_TABLE_STEPS
    frac = _CURVE_TABLE[
        curve, np.minimum(total, CURVE_TABLE_STEPS), np.minimum(done, CURVE_TABLE_STEPS)
    ]
    if not np.all(inside | ~ramping):  # a ramp longer than the table: cell by cell
        frac = np.where(
            inside,
            frac,
            np.vectorize(lambda c, d, n: curve_value(AlphaCurve(int(c)), d / n))(
                curve, done, np.maximum(total, 1)
            ),
        )
    start, target = t.alpha_start[where], t.alpha_target[where]
    alpha = np.where(finished, target, np.where(ramping, start + (target - start) * frac, before))
    t.alpha[where] = alpha
    t.alpha_steps_done[where] = done
    t.alpha_mode[where] = np.where(finished, _HOLD, mode)
    t.alpha_last_delta[where] = np.where(moving, alpha - before, 0.0)
