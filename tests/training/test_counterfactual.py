"""Ablation rows, contributions, interaction and exact Shapley values, for many envs."""

from __future__ import annotations

import math
from itertools import permutations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.core.enums import CounterfactualUnavailable as U
from esper.core.enums import SeedStage
from esper.model.slot_table import STAGE_CODE
from esper.training.envs.counterfactual import (
    REASONS,
    ablations,
    attribute,
    unavailable_reasons,
)

S = 4


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


def _measurable(*slots: int, n_slots: int = S) -> np.ndarray:
    out = np.zeros((1, n_slots), dtype=bool)
    out[0, list(slots)] = True
    return out


def _payoff_accs(alphas: np.ndarray, payoff: dict[int, float], active: list[int]) -> np.ndarray:
    """The 'model': accuracy depends on which active seeds are on (alpha > 0)."""
    masks = [sum(1 << b for b, slot in enumerate(active) if row[slot] > 0) for row in alphas]
    return np.array([payoff[m] for m in masks])


def _reasons(n_envs: int, n_slots: int = S) -> np.ndarray:
    return np.full((n_envs, n_slots), REASONS.index(U.NO_SEED))


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(1, 3),
    payoff=st.lists(st.floats(0, 100, allow_nan=False), min_size=8, max_size=8),
)
def test_shapley_equals_brute_force_and_is_efficient(n: int, payoff: list[float]) -> None:
    active = sorted([3, 0, 2][:n])
    alphas = np.array([[0.5 + 0.1 * s for s in range(S)]])
    ab = ablations(alphas, _measurable(*active), factorial=True)
    assert ab.count.tolist() == [2**n]
    table = {m: payoff[m] for m in range(2**n)}
    found = attribute(ab, _payoff_accs(ab.alphas, table, active), _reasons(1))
    expected = brute_force_shapley([table[m] for m in range(2**n)])
    for bit, slot in enumerate(active):
        assert found.shapley[0, slot] == pytest.approx(expected[bit], abs=1e-9)
    measured = [found.shapley[0, s] for s in active]
    assert math.fsum(measured) == pytest.approx(found.real_acc[0] - found.all_off_acc[0], abs=1e-9)
    assert found.exact_shapley[0]
    for slot in set(range(S)) - set(active):
        assert math.isnan(found.shapley[0, slot]) and math.isnan(found.contributions[0, slot])


def test_standard_plan_rows_and_leave_one_out_contributions() -> None:
    alphas = np.array([[1.0, 0.5, 0.25, 0.7]])
    ab = ablations(alphas, _measurable(0, 1, 3), factorial=False)
    # real, three leave-one-outs, all-off
    assert ab.count.tolist() == [5]
    assert ab.alphas[0].tolist() == [1.0, 0.5, 0.25, 0.7]
    assert ab.alphas[ab.row_of[0, 0b101]].tolist() == [1.0, 0.0, 0.25, 0.7]
    assert ab.alphas[ab.row_of[0, 0]].tolist() == [0.0, 0.0, 0.25, 0.0]  # slot 2 not ablated
    accs = np.zeros(5)
    accs[0] = 90.0
    accs[ab.row_of[0, 0b110]] = 85.0
    accs[ab.row_of[0, 0b101]] = 91.0
    accs[ab.row_of[0, 0b011]] = 90.0
    accs[ab.row_of[0, 0]] = 80.0
    reasons = unavailable_reasons(
        np.array([[STAGE_CODE[SeedStage.BLENDING]] * 2 + [STAGE_CODE[SeedStage.TRAINING]] * 2]),
        np.array([[1.0, 0.5, 0.0, 0.7]]),
    )
    found = attribute(ab, accs, reasons)
    assert found.contributions[0, 0] == 5.0
    assert found.contributions[0, 1] == -1.0  # harmful seed: negative contribution
    assert found.contributions[0, 3] == 0.0  # measured zero is 0, not NaN
    assert math.isnan(found.contributions[0, 2])
    assert [REASONS[r] for r in found.reasons[0]] == [
        U.AVAILABLE,
        U.AVAILABLE,
        U.ALPHA_ZERO,
        U.AVAILABLE,
    ]
    assert found.all_off_acc[0] == 80.0 and not found.exact_shapley[0]
    assert math.isnan(found.interaction[0])


def test_two_seed_interaction_and_free_shapley() -> None:
    ab = ablations(np.array([[1.0, 0.0, 1.0]]), _measurable(0, 2, n_slots=3), factorial=False)
    assert ab.count.tolist() == [4]  # the 4 standard rows are the factorial
    value = {0b00: 50.0, 0b01: 60.0, 0b10: 55.0, 0b11: 70.0}
    found = attribute(ab, _payoff_accs(ab.alphas, value, [0, 2]), _reasons(1, 3))
    assert found.exact_shapley[0]
    assert found.interaction[0] == pytest.approx(70 - 60 - 55 + 50)
    assert found.contributions[0, 0] == pytest.approx(70 - 55)
    assert REASONS[found.reasons[0, 1]] == U.NO_SEED


def test_single_seed_and_no_seed_plans() -> None:
    ab = ablations(np.array([[0.0, 0.5]]), _measurable(1, n_slots=2), factorial=False)
    assert ab.count.tolist() == [2] and ab.row_of[0, 0] == 1  # leave-one-out is all-off
    found = attribute(ab, np.array([70.0, 65.0]), _reasons(1, 2))
    assert found.contributions[0, 1] == 5.0 and found.shapley[0, 1] == 5.0
    empty = ablations(np.zeros((1, 2)), np.zeros((1, 2), dtype=bool), factorial=True)
    assert empty.count.tolist() == [1]
    reasons = unavailable_reasons(
        np.array([[STAGE_CODE[SeedStage.DORMANT], STAGE_CODE[SeedStage.GERMINATED]]]),
        np.zeros((1, 2)),
    )
    found0 = attribute(empty, np.array([70.0]), reasons)
    assert np.isnan(found0.contributions).all() and not found0.exact_shapley[0]
    assert [REASONS[r] for r in found0.reasons[0]] == [U.NO_SEED, U.NOT_IN_FORWARD]
    assert found0.all_off_acc[0] == found0.real_acc[0] == 70.0


def test_factorial_is_skipped_above_the_seed_limit() -> None:
    ab = ablations(np.ones((1, 4)), np.ones((1, 4), dtype=bool), factorial=True)
    assert ab.count.tolist() == [1 + 4 + 1]
    found = attribute(ab, np.arange(6.0), _reasons(1))
    assert not found.exact_shapley[0] and np.isnan(found.shapley).all()


def test_reasons_by_stage_and_alpha() -> None:
    stages = [SeedStage.BLENDING, SeedStage.TRAINING, SeedStage.DORMANT, SeedStage.FOSSILIZED,
              SeedStage.EMBARGOED]  # fmt: skip
    reasons = unavailable_reasons(
        np.array([[STAGE_CODE[s] for s in stages]]), np.array([[0.7, 0.0, 0.0, 1.0, 0.0]])
    )
    assert [REASONS[r] for r in reasons[0]] == [
        U.AVAILABLE, U.ALPHA_ZERO, U.NO_SEED, U.AVAILABLE, U.NO_SEED,
    ]  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    envs=st.lists(
        st.tuples(
            st.lists(st.booleans(), min_size=S, max_size=S),
            st.lists(st.floats(0.1, 1.0), min_size=S, max_size=S),
        ),
        min_size=1,
        max_size=6,
    ),
    factorial=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_many_envs_at_once_equal_each_env_alone(
    envs: list[tuple[list[bool], list[float]]], factorial: bool, seed: int
) -> None:
    """Envs with different numbers of seeds in one call: each env's rows, contributions,
    Shapley values and interaction are exactly those of the env computed alone."""
    measurable = np.array([m for m, _ in envs])
    alphas = np.array([a for _, a in envs])
    together = ablations(alphas, measurable, factorial=factorial)
    accs = np.random.default_rng(seed).uniform(0, 100, size=len(together.alphas))
    found = attribute(together, accs, _reasons(len(envs)))
    for i in range(len(envs)):
        alone = ablations(alphas[i : i + 1], measurable[i : i + 1], factorial=factorial)
        rows = slice(together.first[i], together.first[i] + together.count[i])
        assert np.array_equal(together.alphas[rows], alone.alphas)
        single = attribute(alone, accs[rows], _reasons(1))
        for name in ("contributions", "shapley", "interaction", "real_acc", "all_off_acc"):
            assert np.array_equal(getattr(found, name)[i], getattr(single, name)[0], equal_nan=True)
