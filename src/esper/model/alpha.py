"""The alpha controller: how strongly a seed's output is blended into the host.

Alpha moves between a start and a target over a fixed number of epochs along a curve.
It can only be retargeted while at rest (mode HOLD) so a blend in progress is never
silently redirected, and the last step snaps exactly onto the target so curves never
leave a floating-point residue (a "done" blend is exactly 1.0, a pruned one exactly 0).
"""

from __future__ import annotations

import math

from esper.core.constants import SIGMOID_STEEPNESS
from esper.core.enums import AlphaCurve, AlphaMode

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


class AlphaController:
    """Alpha, its start and target, mode, curve and step counters (one per slot)."""

    __slots__ = (
        "alpha",
        "curve",
        "last_delta",
        "mode",
        "start",
        "steps_done",
        "steps_total",
        "target",
    )

    def __init__(self, alpha: float = ALPHA_MIN) -> None:
        self.alpha = alpha
        self.start = alpha
        self.target = alpha
        self.mode = AlphaMode.HOLD
        self.curve = AlphaCurve.LINEAR
        self.steps_total = 0
        self.steps_done = 0
        self.last_delta = 0.0

    @property
    def at_rest(self) -> bool:
        return self.mode == AlphaMode.HOLD

    @property
    def progress(self) -> float:
        """Fraction of the current (or last) ramp completed; 1.0 when there was none."""
        return self.steps_done / self.steps_total if self.steps_total else 1.0

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
        self.start = self.alpha
        self.target = target
        self.curve = curve
        self.steps_done = 0
        if steps == 0 or target == self.alpha:
            self.last_delta = target - self.alpha
            self.alpha = target
            self.steps_total = 0
            self.mode = AlphaMode.HOLD
            return
        self.steps_total = steps
        self.mode = AlphaMode.UP if target > self.alpha else AlphaMode.DOWN

    def step(self) -> float:
        """Advance one tick; returns the change in alpha (0 while at rest)."""
        if self.at_rest:
            self.last_delta = 0.0
            return 0.0
        before = self.alpha
        self.steps_done += 1
        if self.steps_done >= self.steps_total:
            self.alpha = self.target  # snap: no residue from the curve arithmetic
            self.mode = AlphaMode.HOLD
        else:
            frac = curve_value(self.curve, self.steps_done / self.steps_total)
            self.alpha = self.start + (self.target - self.start) * frac
        self.last_delta = self.alpha - before
        return self.last_delta

    def force(self, value: float) -> None:
        """Set alpha and come to rest at once (stage rules such as HOLDING = 1.0)."""
        self.last_delta = value - self.alpha
        self.alpha = value
        self.start = value
        self.target = value
        self.mode = AlphaMode.HOLD
        self.steps_total = 0
        self.steps_done = 0
