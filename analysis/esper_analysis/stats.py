"""Means with 95 % confidence intervals: over seeds, paired by seed, or unpaired (Welch).

A run's seed is the unit a researcher reports: the episodes of one run share their
policy and its learning, so they are not independent draws. Intervals here are
Student-t intervals over independent values (one per seed, or one difference per
shared seed); Welch's interval compares two groups that cannot be paired. Pure
Python, no SciPy: the t quantiles are a table (1-30 degrees of freedom) and Hill's
expansion beyond it (error under 1e-4 there).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Final

#: The two-sided level of every interval.
LEVEL: Final = 0.95
#: 97.5 % quantiles of Student's t, for 1..30 degrees of freedom.
T_975: Final = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
#: The 97.5 % quantile of the standard normal (the limit of t).
Z_975: Final = 1.959964

#: How an interval was computed (said in tables and JSON beside the numbers).
T_OVER_SEEDS: Final = "t over seeds"
PAIRED_BY_SEED: Final = "paired by seed"
PAIRED_BY_EPISODE: Final = "paired by (round, env)"
WELCH: Final = "unpaired (Welch)"


def t_quantile(df: float) -> float:
    """The 97.5 % quantile of t with ``df`` degrees of freedom (a fractional ``df``,
    from Welch's formula, is rounded down: the interval errs wide, never narrow)."""
    if not df >= 1:
        return math.nan
    whole = math.floor(df)
    if whole <= len(T_975):
        return T_975[whole - 1]
    z, v = Z_975, float(whole)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A mean (or a mean difference) with its standard error and 95 % interval.

    ``low``/``high`` are NaN when the data cannot give an interval (one value).
    """

    mean: float
    std_err: float
    low: float
    high: float
    n: int
    method: str


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def mean_ci(values: Sequence[float], *, method: str = T_OVER_SEEDS) -> Estimate:
    """Mean of independent values (non-finite ones left out) with a t interval."""
    xs = _finite(values)
    if not xs:
        return Estimate(math.nan, math.nan, math.nan, math.nan, 0, method)
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return Estimate(mean, math.nan, math.nan, math.nan, 1, method)
    se = statistics.stdev(xs) / math.sqrt(len(xs))
    half = t_quantile(len(xs) - 1) * se
    return Estimate(mean, se, mean - half, mean + half, len(xs), method)


def paired_ci(differences: Sequence[float], *, method: str = PAIRED_BY_SEED) -> Estimate:
    """Mean of paired differences (one per seed, or per (round, env)) with a t interval."""
    return mean_ci(differences, method=method)


def welch_ci(reference: Sequence[float], other: Sequence[float]) -> Estimate:
    """``mean(other) - mean(reference)`` of two independent samples, Welch's interval
    (unequal variances, Welch-Satterthwaite degrees of freedom); ``n`` counts both."""
    a, b = _finite(reference), _finite(other)
    n = len(a) + len(b)
    if not a or not b:
        return Estimate(math.nan, math.nan, math.nan, math.nan, n, WELCH)
    diff = statistics.fmean(b) - statistics.fmean(a)
    if len(a) < 2 or len(b) < 2:
        return Estimate(diff, math.nan, math.nan, math.nan, n, WELCH)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Estimate(diff, 0.0, diff, diff, n, WELCH)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(df) * se
    return Estimate(diff, se, diff - half, diff + half, n, WELCH)
