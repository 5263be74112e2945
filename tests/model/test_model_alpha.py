"""The alpha controller: curves, speeds, retargeting only from HOLD, snapping."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.core.constants import ALPHA_SPEEDS, ALPHA_TARGETS, TEMPOS
from esper.core.enums import AlphaCurve, AlphaMode
from esper.model.alpha import AlphaController, AlphaControllerError, curve_value


@pytest.mark.parametrize("curve", list(AlphaCurve))
def test_curves_run_from_zero_to_one_monotonically(curve: AlphaCurve) -> None:
    values = [curve_value(curve, i / 100) for i in range(101)]
    assert values[0] == pytest.approx(0.0, abs=1e-12)
    assert values[-1] == pytest.approx(1.0, abs=1e-12)
    assert all(b >= a for a, b in itertools.pairwise(values))


def test_curve_shapes() -> None:
    assert curve_value(AlphaCurve.LINEAR, 0.25) == 0.25
    assert curve_value(AlphaCurve.COSINE, 0.5) == pytest.approx(0.5)
    assert curve_value(AlphaCurve.COSINE, 0.25) == pytest.approx((1 - math.cos(math.pi / 4)) / 2)
    # Steeper sigmoids move less early on and more around the middle.
    early = [
        curve_value(c, 0.2)
        for c in (AlphaCurve.SIGMOID_GENTLE, AlphaCurve.SIGMOID, AlphaCurve.SIGMOID_SHARP)
    ]
    assert early[0] > early[1] > early[2]
    assert curve_value(AlphaCurve.SIGMOID, 0.5) == pytest.approx(0.5)


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from(ALPHA_TARGETS),
    st.sampled_from((*ALPHA_TARGETS, 0.0)),
    st.sampled_from(TEMPOS + ALPHA_SPEEDS),
    st.sampled_from(list(AlphaCurve)),
)
def test_ramp_reaches_target_exactly_on_the_last_tick(
    start: float, target: float, steps: int, curve: AlphaCurve
) -> None:
    ctl = AlphaController(start)
    ctl.retarget(target, steps, curve)
    if steps == 0 or target == start:
        assert ctl.alpha == target and ctl.at_rest
        return
    assert ctl.mode == (AlphaMode.UP if target > start else AlphaMode.DOWN)
    lo, hi = min(start, target), max(start, target)
    for i in range(1, steps + 1):
        with pytest.raises(AlphaControllerError):
            ctl.retarget(start, 1, curve)  # only from HOLD
        ctl.step()
        assert lo <= ctl.alpha <= hi
        assert ctl.steps_done == i
        assert ctl.at_rest == (i == steps)
    assert ctl.alpha == target  # snapped, bit-exact
    assert ctl.step() == 0.0 and ctl.alpha == target


def test_linear_ramp_values_and_velocity() -> None:
    ctl = AlphaController()
    ctl.retarget(1.0, 4, AlphaCurve.LINEAR)
    seen = []
    for _ in range(4):
        delta = ctl.step()
        seen.append(ctl.alpha)
        assert delta == pytest.approx(0.25)
    assert seen == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert ctl.progress == 1.0


def test_invalid_requests_raise() -> None:
    ctl = AlphaController()
    with pytest.raises(AlphaControllerError):
        ctl.retarget(1.5, 3, AlphaCurve.LINEAR)
    with pytest.raises(AlphaControllerError):
        ctl.retarget(0.5, -1, AlphaCurve.LINEAR)


def test_force_comes_to_rest() -> None:
    ctl = AlphaController()
    ctl.retarget(1.0, 5, AlphaCurve.COSINE)
    ctl.step()
    ctl.force(1.0)
    assert ctl.alpha == 1.0 and ctl.at_rest and ctl.steps_total == 0
