"""Counterfactual attribution: which alpha configurations to evaluate, and what they mean.

The fused validation pass evaluates K alpha configurations per env. This module is the
pure maths around it (numpy, no torch), for every env of a step at once:
:func:`ablations` says which rows to run (one flat table of (env, configuration) rows,
each env's rows contiguous, its real configuration first), :func:`attribute` turns the
rows' accuracies into per-seed contributions (real minus leave-one-out), a pairwise
interaction and, where the rows are the full factorial, exact Shapley values. A slot
that could not be measured gets NaN plus the reason, never 0.

Envs are grouped by how many measurable seeds they have (0 to the number of slots), so
the work loops over those few counts and over subsets, never over envs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from esper.core.enums import CounterfactualUnavailable
from esper.model.lifecycle import FORWARD_CODES, OCCUPYING_CODES

#: Above this many active seeds the 2^n factorial is not run (2^3 = 8 configs).
MAX_FACTORIAL_SEEDS = 3
#: Exactly this many seeds gives a well-defined pairwise interaction.
PAIR = 2

NAN = math.nan
REASONS = tuple(CounterfactualUnavailable)
REASON_CODE = {r: i for i, r in enumerate(REASONS)}


def unavailable_reasons(stage: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Why each slot's contribution cannot be measured (codes into :data:`REASONS`;
    AVAILABLE where it can): no seed, a seed outside the forward, alpha 0."""
    return np.select(
        [~OCCUPYING_CODES[stage], ~FORWARD_CODES[stage], alpha <= 0.0],
        [
            REASON_CODE[CounterfactualUnavailable.NO_SEED],
            REASON_CODE[CounterfactualUnavailable.NOT_IN_FORWARD],
            REASON_CODE[CounterfactualUnavailable.ALPHA_ZERO],
        ],
        REASON_CODE[CounterfactualUnavailable.AVAILABLE],
    )


def subset_masks(n: int, *, factorial: bool) -> list[int]:
    """The subsets of ``n`` ablated seeds to evaluate, as bitmasks (bit b: the b-th seed
    on), real first: each seed off and (2+ seeds) all off, or the full 2^n factorial."""
    full = (1 << n) - 1
    if factorial and 0 < n <= MAX_FACTORIAL_SEEDS:
        masks = [full, *(m for m in range(full) if m != full)]
    else:
        masks = [full, *(full & ~(1 << b) for b in range(n))]
        if n >= PAIR:
            masks.append(0)
    return list(dict.fromkeys(masks))


@dataclass(frozen=True)
class Ablations:
    """The configuration rows of one step for ``N`` envs and ``S`` slots.

    ``alphas[r]`` is row r's alpha per slot and ``env[r]`` its env; env i's rows are
    ``first[i] .. first[i] + count[i] - 1``, its real configuration first. ``seeds[i]``
    lists (in slot order, -1 padded) the slots ablated; ``mask[r]`` is the subset of
    them row r keeps on, and ``row_of[i, m]`` the row evaluating subset ``m`` (-1 if not
    evaluated).
    """

    alphas: np.ndarray  # [R, S]
    env: np.ndarray  # [R]
    mask: np.ndarray  # [R]
    first: np.ndarray  # [N]
    count: np.ndarray  # [N]
    seeds: np.ndarray  # [N, S]
    n_seeds: np.ndarray  # [N]
    row_of: np.ndarray  # [N, 2^S]

    def rows(self, i: int) -> np.ndarray:
        """Env ``i``'s configurations [K, S] (its real one first)."""
        start = int(self.first[i])
        return self.alphas[start : start + int(self.count[i])]


def ablations(alphas: np.ndarray, measurable: np.ndarray, *, factorial: bool) -> Ablations:
    """Rows for every env: ``alphas[N, S]`` are the slots' current alphas, and seeds where
    ``measurable`` are ablated (their alpha set to 0) in every subset that leaves them off;
    every other slot keeps its alpha in every row."""
    n_envs, n_slots = alphas.shape
    n_seeds = measurable.sum(axis=1)
    order = np.argsort(~measurable, axis=1, kind="stable")  # measurable slots first
    seeds = np.where(np.arange(n_slots)[None, :] < n_seeds[:, None], order, -1)
    plans = {n: subset_masks(n, factorial=factorial) for n in np.unique(n_seeds).tolist()}
    rows_per_plan = np.zeros(n_slots + 1, dtype=np.int64)
    for n, masks in plans.items():
        rows_per_plan[n] = len(masks)
    count = rows_per_plan[n_seeds]
    first = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    total = int(count.sum())
    out_alphas = np.zeros((total, n_slots))
    out_mask = np.zeros(total, dtype=np.int64)
    row_of = np.full((n_envs, 1 << n_slots), -1, dtype=np.int64)
    for n, masks in plans.items():
        group = np.nonzero(n_seeds == n)[0]
        bits = np.array(masks, dtype=np.int64)  # [M]
        rows = first[group][:, None] + np.arange(len(masks))[None, :]  # [G, M]
        block = np.repeat(alphas[group][:, None, :], len(masks), axis=1)  # [G, M, S]
        for b in range(n):
            off = (bits >> b & 1) == 0  # [M]: subsets that leave seed b off
            slot = seeds[group, b]
            block[:, off, :] = np.where(
                np.arange(n_slots)[None, None, :] == slot[:, None, None], 0.0, block[:, off, :]
            )
        out_alphas[rows] = block
        out_mask[rows] = bits[None, :]
        row_of[group[:, None], bits[None, :]] = rows
    env = np.repeat(np.arange(n_envs), count)
    return Ablations(out_alphas, env, out_mask, first, count, seeds, n_seeds, row_of)


@dataclass(frozen=True)
class Attribution:
    """Per env: contributions and Shapley values per slot (NaN where not measured), the
    reason per slot, the pairwise interaction and the real and all-off accuracies."""

    contributions: np.ndarray  # [N, S]
    reasons: np.ndarray  # [N, S] codes into REASONS
    shapley: np.ndarray  # [N, S]
    exact_shapley: np.ndarray  # [N]: the rows were the full factorial
    interaction: np.ndarray  # [N]
    real_acc: np.ndarray  # [N]
    all_off_acc: np.ndarray  # [N]
    n_configs: np.ndarray  # [N]


def _shapley(values: list[np.ndarray], n: int) -> list[np.ndarray]:
    """Exact Shapley values of ``n`` players from ``values[m]`` (the payoff of subset m,
    one entry per env), in the order of the textbook sum (so every env gets exactly the
    floats a scalar computation gives)."""
    n_fact = math.factorial(n)
    out = []
    for i in range(n):
        total = np.zeros_like(values[0])
        for m in range(1 << n):
            if m >> i & 1:
                continue
            size = m.bit_count()
            weight = math.factorial(size) * math.factorial(n - size - 1) / n_fact
            total = total + weight * (values[m | 1 << i] - values[m])
        out.append(total)
    return out


def attribute(ab: Ablations, accuracies: np.ndarray, reasons: np.ndarray) -> Attribution:
    """The rows' accuracies (percent, one per row of ``ab``) as an :class:`Attribution`;
    ``reasons`` (:func:`unavailable_reasons`) are kept where a seed was not ablated."""
    n_envs, n_slots = reasons.shape
    acc = np.asarray(accuracies, dtype=np.float64)
    real = acc[ab.first]
    contributions = np.full((n_envs, n_slots), NAN)
    shapley = np.full((n_envs, n_slots), NAN)
    reasons = reasons.copy()
    for n in range(1, int(ab.n_seeds.max(initial=0)) + 1):
        group = np.nonzero(ab.n_seeds == n)[0]
        if not len(group):
            continue
        full = (1 << n) - 1
        for b in range(n):
            slot = ab.seeds[group, b]
            loo = ab.row_of[group, full & ~(1 << b)]
            contributions[group, slot] = real[group] - acc[loo]
            reasons[group, slot] = REASON_CODE[CounterfactualUnavailable.AVAILABLE]
        if (ab.row_of[group[0], : 1 << n] >= 0).all():  # the full factorial was run
            values = [acc[ab.row_of[group, m]] for m in range(1 << n)]
            for b, phi in enumerate(_shapley(values, n)):
                shapley[group, ab.seeds[group, b]] = phi
    all_off = acc[ab.row_of[:, 0]]  # every plan evaluates "all off" (real, with no seed)
    pair = ab.n_seeds == PAIR
    interaction = np.full(n_envs, NAN)
    if pair.any():
        g = np.nonzero(pair)[0]
        interaction[g] = (
            real[g] - acc[ab.row_of[g, 0b10]] - acc[ab.row_of[g, 0b01]] + acc[ab.row_of[g, 0]]
        )
    exact = (ab.n_seeds > 0) & (ab.count == (1 << ab.n_seeds))
    return Attribution(
        contributions=contributions,
        reasons=reasons,
        shapley=shapley,
        exact_shapley=exact,
        interaction=interaction,
        real_acc=real,
        all_off_acc=all_off,
        n_configs=ab.count,
    )
