"""The reward rows' checks: every component and the total's minimum, maximum and
non-zero count, and the rows whose components do not add up to their total.

On a table read whole they are polars queries (:func:`stats`, :func:`flagged_rows`).
Read one row group at a time (:mod:`esper_analysis.reward_stream`), :class:`RowChecks`
folds each row group into running statistics and counts the rows that may not add up
in one native pass (``_grouped.c``), and asks polars for the exact check of a row group
only where some row may fail it; without the native module, or on a row group with
nulls, every row group is checked by the same polars queries. Both ways give the same
tables: a minimum or maximum of zero is reported as 0.0 whatever its sign, which the
order of comparisons would otherwise decide.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import polars as pl
import pyarrow as pa

from esper_analysis.reward_partials import COMPONENTS, SUMMED, native_module

#: Absolute tolerance of the components-sum-to-total check.
SUM_TOLERANCE: Final = 1e-6
#: The columns of the flagged-rows table (before its ``diff``).
FLAGGED_COLUMNS: Final = ["round", "env", "step", "op", "total", "component_sum", *COMPONENTS]


def with_check(lf: pl.LazyFrame) -> pl.LazyFrame:
    """``lf`` with ``component_sum`` and ``sum_ok`` (a null component counts as 0: an
    older schema's reward did not have it; a NaN anywhere fails the check)."""
    component_sum = pl.sum_horizontal([pl.col(c).fill_null(0.0) for c in COMPONENTS])
    diff = (pl.col("component_sum") - pl.col("total")).abs()
    return lf.with_columns(component_sum=component_sum).with_columns(
        sum_ok=(diff <= SUM_TOLERANCE).fill_null(False) & diff.is_not_nan()
    )


def stats(lf: pl.LazyFrame) -> pl.LazyFrame:
    """One row: a struct of min, max and non-zero count per summed column (sum and mean
    come from the partials, in their deterministic order). ``+ 0.0`` makes a zero
    positive."""
    return lf.select(
        pl.struct(
            min=pl.col(c).min() + 0.0, max=pl.col(c).max() + 0.0, nonzero=(pl.col(c) != 0).sum()
        ).alias(c)
        for c in SUMMED
    )


def flagged_rows(checked: pl.LazyFrame) -> pl.LazyFrame:
    """The rows of a :func:`with_check` frame whose components do not add up."""
    return checked.filter(~pl.col("sum_ok")).select(
        pl.col(c).cast(pl.String) if c == "op" else pl.col(c) for c in FLAGGED_COLUMNS
    )


def combined_stats(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """:func:`stats` of a whole table from those of its parts."""
    return pl.concat(parts).select(
        pl.struct(
            min=pl.col(c).struct.field("min").min(),
            max=pl.col(c).struct.field("max").max(),
            nonzero=pl.col(c).struct.field("nonzero").sum().cast(pl.UInt32),
        ).alias(c)
        for c in SUMMED
    )


class RowChecks:
    """The checks of a reward table read one row group at a time (called with each);
    ``native=False``: polars' queries even where the native pass is built."""

    def __init__(self, *, native: bool = True) -> None:
        self._native = native_module() if native else None
        k = len(SUMMED)
        self._low, self._high = np.full(k, np.inf), np.full(k, -np.inf)
        self._values, self._nans, self._nonzero = (np.zeros(k, dtype=np.int64) for _ in "vnz")
        self._stats: list[pl.DataFrame] = []
        self._flagged: list[pl.DataFrame] = []

    def __call__(self, table: pa.Table) -> None:
        columns = [table.column(c).chunk(0) for c in SUMMED]
        if self._native is None or any(col.null_count for col in columns):
            self._polars(table, with_stats=True)
            return
        values = [col.to_numpy() for col in columns]  # the components, then the total
        running = (self._low, self._high, self._values, self._nans, self._nonzero)
        if self._native.check_rows(values, SUM_TOLERANCE, *running):
            self._polars(table, with_stats=False)  # the exact check decides
        elif not self._flagged:
            self._polars(table.slice(0, 0), with_stats=False)  # the table's empty shape

    def _polars(self, table: pa.Table, *, with_stats: bool) -> None:
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        checked = with_check(frame.lazy())
        if with_stats:
            part, flagged = pl.collect_all([stats(checked), flagged_rows(checked)])
            self._stats.append(part)
        else:
            flagged = flagged_rows(checked).collect()
        self._flagged.append(flagged)

    def results(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The statistics of every row seen (one row, as :func:`stats`) and the flagged
        rows in row order."""
        return combined_stats([self._native_stats(), *self._stats]), pl.concat(self._flagged)

    def _native_stats(self) -> pl.DataFrame:
        """The running statistics as one :func:`stats` row (min/max null where no row
        was folded in, NaN where every value was NaN)."""
        seen = self._values > 0
        nan_only = ~seen & (self._nans > 0)
        low = np.where(seen, self._low + 0.0, np.nan)
        high = np.where(seen, self._high + 0.0, np.nan)
        return pl.DataFrame(
            [
                pl.Series(
                    c,
                    [
                        {
                            "min": float(low[j]) if seen[j] or nan_only[j] else None,
                            "max": float(high[j]) if seen[j] or nan_only[j] else None,
                            "nonzero": int(self._nonzero[j]),
                        }
                    ],
                    dtype=_STATS_DTYPE,
                )
                for j, c in enumerate(SUMMED)
            ]
        )


_STATS_DTYPE: Final = pl.Struct({"min": pl.Float64, "max": pl.Float64, "nonzero": pl.UInt32})
