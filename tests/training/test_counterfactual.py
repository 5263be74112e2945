"""Ablation plans, contributions, interaction and exact Shapley values."""

from __future__ import annotations

import math
from itertools import permutations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.core.enums import CounterfactualUnavailable as U
from esper.core.enums import SeedStage
from esper.core.records import SlotReport
from esper.training.counterfactual import (
    attribute,
    build_ablation_configs,
    measurable_seeds,
    shapley_values,
)

SLOTS = ("s0", "s1", "s2", "s3")


def _seed(slot: str, stage: SeedStage = SeedStage.BLENDING, alpha: float = 0.7) -> SlotReport:
    return SlotReport(slot_id=slot, stage=stage, seed_id=f"x{slot}", alpha=alpha)


def brute_force_shapley(value: list[float]) -> list[float]:
    """Average marginal gain over every join order (the definition)."""
    n = int(math.log2(len(value)))
    sums = [0.0] * n
    orders = list(permutations(range(n)))
    for order in orders:
        mask = 0
        for i in order:
            sums[i] += value[mask | 1 << i] - value[mask]
            mask |= 1 << i
    return [s / len(orders) for s in sums]


def _accuracy_of_row(
    alphas: tuple[float, ...], payoff: dict[int, float], active: list[int]
) -> float:
    """The 'model': accuracy depends on which active seeds are on (alpha > 0)."""
    mask = sum(1 << b for b, slot in enumerate(active) if alphas[slot] > 0)
    return payoff[mask]


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(1, 3),
    payoff=st.lists(st.floats(0, 100, allow_nan=False), min_size=8, max_size=8),
)
def test_shapley_equals_brute_force_and_is_efficient(n: int, payoff: list[float]) -> None:
    active_slots = [3, 0, 2][:n]
    active = [(s, 0.5 + 0.1 * s) for s in active_slots]
    plan = build_ablation_configs(active, 4, factorial=True)
    assert plan.n_configs == 2**n and plan.factorial
    table = {m: payoff[m] for m in range(2**n)}
    accs = [_accuracy_of_row(row, table, active_slots) for row in plan.alphas]
    reports = [_seed(s) if i in active_slots else None for i, s in enumerate(SLOTS)]
    rec = attribute(plan, accs, SLOTS, reports)
    expected = brute_force_shapley([table[m] for m in range(2**n)])
    for bit, slot in enumerate(active_slots):
        assert rec.shapley[slot] == pytest.approx(expected[bit], abs=1e-9)
    measured = [rec.shapley[s] for s in active_slots]
    assert math.fsum(measured) == pytest.approx(rec.real_acc - rec.all_off_acc, abs=1e-9)
    assert rec.exact_shapley
    for slot in set(range(4)) - set(active_slots):
        assert math.isnan(rec.shapley[slot]) and math.isnan(rec.contributions[slot])


def test_standard_plan_rows_and_leave_one_out_contributions() -> None:
    active = [(0, 1.0), (1, 0.5), (3, 0.7)]
    plan = build_ablation_configs(active, 4, factorial=False, base_alphas=[0, 0, 0.25, 0])
    # real, three leave-one-outs, all-off
    assert plan.n_configs == 5 and not plan.factorial
    assert plan.alphas[0] == (1.0, 0.5, 0.25, 0.7)
    assert plan.alphas[plan.loo_rows[1]] == (1.0, 0.0, 0.25, 0.7)
    assert plan.alphas[plan.all_off_row] == (0.0, 0.0, 0.25, 0.0)  # slot 2 not ablated
    accs = [90.0, 0.0, 0.0, 0.0, 0.0]
    accs[plan.loo_rows[0]] = 85.0
    accs[plan.loo_rows[1]] = 91.0
    accs[plan.loo_rows[2]] = 90.0
    accs[plan.all_off_row] = 80.0
    reports = [_seed("s0"), _seed("s1"), _seed("s2", SeedStage.TRAINING, 0.0), _seed("s3")]
    rec = attribute(plan, accs, SLOTS, reports)
    assert rec.contributions[0] == 5.0
    assert rec.contributions[1] == -1.0  # harmful seed: negative contribution
    assert rec.contributions[3] == 0.0  # measured zero is 0, not NaN
    assert math.isnan(rec.contributions[2])
    assert rec.unavailable == (U.AVAILABLE, U.AVAILABLE, U.ALPHA_ZERO, U.AVAILABLE)
    assert rec.all_off_acc == 80.0 and rec.shapley == () and math.isnan(rec.interaction)


def test_two_seed_interaction_and_free_shapley() -> None:
    plan = build_ablation_configs([(0, 1.0), (2, 1.0)], 3, factorial=False)
    assert plan.n_configs == 4 and plan.factorial  # the 4 standard rows are the factorial
    value = {0b00: 50.0, 0b01: 60.0, 0b10: 55.0, 0b11: 70.0}
    accs = [_accuracy_of_row(r, value, [0, 2]) for r in plan.alphas]
    rec = attribute(plan, accs, ("a", "b", "c"), [_seed("a"), None, _seed("c")])
    assert rec.interaction == pytest.approx(70 - 60 - 55 + 50)
    assert rec.contributions[0] == pytest.approx(70 - 55)
    assert rec.unavailable[1] == U.NO_SEED


def test_single_seed_and_no_seed_plans() -> None:
    plan = build_ablation_configs([(1, 0.5)], 2, factorial=False)
    assert plan.n_configs == 2 and plan.loo_rows == (1,) and plan.all_off_row == 1
    rec = attribute(plan, [70.0, 65.0], ("a", "b"), [None, _seed("b")])
    assert rec.contributions[1] == 5.0 and rec.shapley[1] == 5.0
    empty = build_ablation_configs([], 2, factorial=True)
    assert empty.n_configs == 1 and not empty.factorial
    rec0 = attribute(empty, [70.0], ("a", "b"), [None, _seed("b", SeedStage.GERMINATED, 0.0)])
    assert all(math.isnan(c) for c in rec0.contributions)
    assert rec0.unavailable == (U.NO_SEED, U.NOT_IN_FORWARD)
    assert rec0.all_off_acc == rec0.real_acc == 70.0


def test_factorial_is_skipped_above_the_seed_limit() -> None:
    active = [(i, 1.0) for i in range(4)]
    plan = build_ablation_configs(active, 4, factorial=True)
    assert plan.n_configs == 1 + 4 + 1 and not plan.factorial


def test_measurable_seeds_and_validation() -> None:
    reports = [
        _seed("a"),
        _seed("b", SeedStage.TRAINING, 0.0),
        None,
        _seed("d", SeedStage.FOSSILIZED, 1.0),
        _seed("e", SeedStage.EMBARGOED, 0.0),
    ]
    assert measurable_seeds(reports) == [(0, 0.7), (3, 1.0)]
    with pytest.raises(ValueError, match="duplicate"):
        build_ablation_configs([(0, 1.0), (0, 0.5)], 2, factorial=False)
    plan = build_ablation_configs([(0, 1.0)], 1, factorial=False)
    with pytest.raises(ValueError, match="accuracies"):
        attribute(plan, [1.0], ("a",), [_seed("a")])
    with pytest.raises(ValueError, match="2\\^n"):
        shapley_values([1.0, 2.0, 3.0])
