"""Counterfactual attribution: which alpha configurations to evaluate, and what they mean.

The fused validation pass evaluates K alpha configurations per env in one forward. This
module is the pure maths around it (no torch): :func:`build_ablation_configs` says which
rows to run, :func:`attribute` turns the K accuracies into per-seed contributions
(real minus leave-one-out), a pairwise interaction and, from a full factorial, exact
Shapley values. A slot that could not be measured gets NaN plus the reason, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from esper.core.constants import FORWARD_STAGES
from esper.core.enums import CounterfactualUnavailable
from esper.core.records import CounterfactualRecord, SlotReport

#: Above this many active seeds the 2^n factorial is not run (2^3 = 8 configs).
MAX_FACTORIAL_SEEDS = 3
#: Exactly this many seeds gives a well-defined pairwise interaction.
PAIR = 2

NAN = math.nan


class AblationPlan(msgspec.Struct, frozen=True, kw_only=True):
    """The alpha matrix ``[K, n_slots]`` and which row answers which question.

    ``subset_rows[m]`` is the row evaluating the subset of active seeds whose bits are
    set in ``m`` (bit i = ``active[i]`` on); it is filled only for the full factorial.
    """

    n_slots: int
    alphas: tuple[tuple[float, ...], ...]
    active: tuple[int, ...]
    loo_rows: tuple[int, ...]
    all_off_row: int
    subset_rows: tuple[int, ...] = ()
    real_row: int = 0

    @property
    def n_configs(self) -> int:
        return len(self.alphas)

    @property
    def factorial(self) -> bool:
        return bool(self.subset_rows)


def unavailable_reason(report: SlotReport | None) -> CounterfactualUnavailable:
    """Why a slot's contribution cannot be measured (AVAILABLE when it can)."""
    if report is None or not report.active:
        return CounterfactualUnavailable.NO_SEED
    if report.stage not in FORWARD_STAGES:
        return CounterfactualUnavailable.NOT_IN_FORWARD
    if report.alpha <= 0.0:
        return CounterfactualUnavailable.ALPHA_ZERO
    return CounterfactualUnavailable.AVAILABLE


def measurable_seeds(reports: Sequence[SlotReport | None]) -> list[tuple[int, float]]:
    """``(slot_index, alpha)`` of every seed whose removal can change the output."""
    return [
        (i, r.alpha)
        for i, r in enumerate(reports)
        if r is not None and unavailable_reason(r) == CounterfactualUnavailable.AVAILABLE
    ]


def build_ablation_configs(
    active: Sequence[tuple[int, float]],
    n_slots: int,
    *,
    factorial: bool,
    max_factorial_seeds: int = MAX_FACTORIAL_SEEDS,
    base_alphas: Sequence[float] | None = None,
) -> AblationPlan:
    """Rows: real; each active seed off; all off (2+ seeds); or the full 2^n factorial.

    ``base_alphas`` holds every slot's current alpha (default 0) so seeds that are not
    ablated keep their real alpha in every row; ablation sets a seed's alpha to 0.
    """
    slots = [i for i, _ in active]
    if len(set(slots)) != len(slots):
        raise ValueError(f"duplicate active slots: {slots}")
    if any(not 0 <= i < n_slots for i in slots):
        raise ValueError(f"active slot out of range [0, {n_slots}): {slots}")
    base = [0.0] * n_slots if base_alphas is None else [float(a) for a in base_alphas]
    if len(base) != n_slots:
        raise ValueError(f"base_alphas has {len(base)} entries, expected {n_slots}")
    for i, alpha in active:
        base[i] = float(alpha)
    n = len(active)

    def row(on_mask: int) -> tuple[float, ...]:
        alphas = list(base)
        for bit, slot in enumerate(slots):
            if not on_mask >> bit & 1:
                alphas[slot] = 0.0
        return tuple(alphas)

    full = (1 << n) - 1
    if factorial and 0 < n <= max_factorial_seeds:
        # Real first, then every other subset; row of subset m is found via subset_rows.
        masks = [full, *(m for m in range(full) if m != full)]
    else:
        masks = [full, *(full & ~(1 << b) for b in range(n))]
        if n >= PAIR:
            masks.append(0)
    row_of: dict[int, int] = {}
    for m in masks:
        row_of.setdefault(m, len(row_of))
    ordered = sorted(row_of, key=row_of.__getitem__)
    return AblationPlan(
        n_slots=n_slots,
        alphas=tuple(row(m) for m in ordered),
        active=tuple(slots),
        loo_rows=tuple(row_of[full & ~(1 << b)] for b in range(n)),
        all_off_row=row_of.get(0, -1),
        # Two seeds' standard rows already are the full factorial: Shapley comes free.
        subset_rows=(
            tuple(row_of[m] for m in range(full + 1)) if n and len(row_of) == 1 << n else ()
        ),
    )


def shapley_values(value: Sequence[float]) -> list[float]:
    """Exact Shapley values from ``value[m]`` = payoff of subset bitmask ``m`` (2^n entries)."""
    n = int(math.log2(len(value)))
    if 1 << n != len(value):
        raise ValueError(f"need 2^n subset values, got {len(value)}")
    n_fact = math.factorial(n)
    out = []
    for i in range(n):
        total = 0.0
        for m in range(1 << n):
            if m >> i & 1:
                continue
            size = m.bit_count()
            weight = math.factorial(size) * math.factorial(n - size - 1) / n_fact
            total += weight * (value[m | 1 << i] - value[m])
        out.append(total)
    return out


def attribute(
    plan: AblationPlan,
    accuracies: Sequence[float],
    slot_ids: Sequence[str],
    reports: Sequence[SlotReport | None],
) -> CounterfactualRecord:
    """Turn the K fused-forward accuracies (percent) into an attribution record."""
    if len(accuracies) != plan.n_configs:
        raise ValueError(f"got {len(accuracies)} accuracies for {plan.n_configs} configs")
    if not len(slot_ids) == len(reports) == plan.n_slots:
        raise ValueError("slot_ids, reports and the plan must cover the same slots")
    acc = [float(a) for a in accuracies]
    real = acc[plan.real_row]
    contributions = [NAN] * plan.n_slots
    reasons = [unavailable_reason(r) for r in reports]
    for bit, slot in enumerate(plan.active):
        contributions[slot] = real - acc[plan.loo_rows[bit]]
        reasons[slot] = CounterfactualUnavailable.AVAILABLE
    for slot in range(plan.n_slots):
        if slot not in plan.active and reasons[slot] == CounterfactualUnavailable.AVAILABLE:
            # Measurable in principle but not ablated by this plan (caller's choice).
            reasons[slot] = CounterfactualUnavailable.DISABLED
    shapley: tuple[float, ...] = ()
    if plan.factorial:
        phi = shapley_values([acc[r] for r in plan.subset_rows])
        per_slot = [NAN] * plan.n_slots
        for bit, slot in enumerate(plan.active):
            per_slot[slot] = phi[bit]
        shapley = tuple(per_slot)
    interaction = NAN
    if len(plan.active) == PAIR:
        # v(12) - v(1) - v(2) + v(0): leave-one-out of seed b is "only the other seed".
        interaction = real - acc[plan.loo_rows[0]] - acc[plan.loo_rows[1]] + acc[plan.all_off_row]
    return CounterfactualRecord(
        slots=tuple(slot_ids),
        contributions=tuple(contributions),
        unavailable=tuple(reasons),
        shapley=shapley,
        interaction=interaction,
        real_acc=real,
        all_off_acc=acc[plan.all_off_row] if plan.all_off_row >= 0 else NAN,
        n_configs=plan.n_configs,
        exact_shapley=plan.factorial,
    )
