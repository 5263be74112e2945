"""Reward breakdowns per env, episode, op and component, with a sum check on every row.

The component list is :data:`esper.core.records.REWARD_COMPONENTS`, so a component
added to the reward is picked up here without edits. A row is flagged when its
components do not sum to its total within :data:`SUM_TOLERANCE` (a NaN anywhere flags
it too). A component column missing from an older schema reads as null and counts as
0 in the sum, which is what that older reward computed; the summary names it.

Grouped sums and means are added up in numpy in a fixed order (per finest group in row
order, then rolled up over those groups), so every call gives the same bits (a parallel
group-by adds floats in an order that varies from call to call).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Final

import numpy as np
import polars as pl

from esper.core.records import REWARD_COMPONENTS
from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult

#: Absolute tolerance of the components-sum-to-total check.
SUM_TOLERANCE: Final = 1e-6
_COMPONENTS: Final = list(REWARD_COMPONENTS)


@dataclasses.dataclass(frozen=True)
class RewardBreakdown(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "by_component": "Reward components (whole run)",
        "by_env": "Reward by env",
        "by_episode": "Reward by episode (round, env)",
        "by_op": "Reward by op",
        "by_round": "Mean reward components per round",
        "flagged": "Rows whose components do not sum to the total",
    }
    #: Terminal tables keep totals; per-component detail is in by_component (and JSON).
    TEXT_COLUMNS: ClassVar[dict[str, tuple[str, ...]]] = {
        "by_env": ("env", "rows", "total"),
        "by_episode": ("rank", "round", "env", "rows", "total", "episode_reward_reported"),
        "by_op": ("op", "rows", "total", "mean_total"),
        "flagged": ("round", "env", "step", "op", "total", "component_sum", "diff"),
    }
    TEXT_SKIP: ClassVar[frozenset[str]] = frozenset({"by_round"})

    by_component: pl.DataFrame
    by_env: pl.DataFrame
    by_episode: pl.DataFrame
    by_op: pl.DataFrame
    by_round: pl.DataFrame
    flagged: pl.DataFrame
    rows: int
    flagged_rows: int
    tolerance: float
    missing_components: list[str]


_SUMMED: Final = [*_COMPONENTS, "total"]
#: The finest grouping; every table's keys are a subset of it (read with the components).
_FINE: Final = ["rank", "round", "env", "op"]
#: Above this many chunks a summed column is copied into one before its sums are taken.
_MAX_CHUNKS_IN_PLACE: Final = 64
#: Keys are coded directly (no per-key renumbering) while their combinations number at
#: most this many per row: the bincounts over the codes stay as cheap as one pass.
_MAX_DIRECT_CODES: Final = 4


class _Partials:
    """Row counts, sums and non-null counts of every summed column per finest group
    (rank, round, env, op), accumulated in row order. Every table is a roll-up of these
    partials, so the large frame is grouped once and its columns are read in place."""

    def __init__(self, df: pl.DataFrame) -> None:
        self.radix = _mixed_radix(df, _FINE) if df.height else None
        self._digits: dict[int, np.ndarray] = {}
        if self.radix is None:
            group, n, self._keys = _key_grouped(df, _FINE)
        else:
            # Sum straight into one slot per code, and keep the codes in use: no pass
            # over the rows to renumber them first.
            group = df.select(self.radix.code).to_series().to_numpy()
            n = self.radix.size
        rows = np.bincount(group, minlength=n)
        #: The slots in use (every one on the key path); on the radix path they are the
        #: finest groups' mixed-radix codes (group ``g`` is ``codes[g]``).
        self.codes = used = np.flatnonzero(rows)
        self.rows = rows[used]
        self.sums: dict[str, np.ndarray] = {}
        self.present: dict[str, np.ndarray] = {}
        for c in _SUMMED:
            col = df[c].cast(pl.Float64)
            nulls = col.null_count()
            sums = _sums_in_row_order(col.fill_null(0.0) if nulls else col, group, n)
            self.sums[c] = sums[used]
            if nulls:
                present = np.bincount(group, weights=col.is_not_null().to_numpy(), minlength=n)
                self.present[c] = present[used]
            else:
                self.present[c] = self.rows

    def rolled_up(self, keys: list[str]) -> tuple[np.ndarray, int, pl.DataFrame]:
        """Group id per finest group for ``keys``, the number of groups and their key
        values. On the mixed-radix path each key's digit is arithmetic on the finest
        group's code (no second grouping of the key frame)."""
        if self.radix is None:
            return _grouped(self._keys, keys)
        sizes = [len(values) for values in self.radix.digits]
        code = np.zeros(len(self.codes), dtype=np.int64)
        size = 1
        digits = []
        for key in keys:
            i = _FINE.index(key)
            code = code * sizes[i] + self._digit(i)
            size *= sizes[i]
            digits.append(self.radix.digits[i])
        group, used, key_values = _decoded(code, size, digits)
        return group, len(used), key_values

    def _digit(self, i: int) -> np.ndarray:
        """Key ``i``'s digit of every finest group's code, computed once for all tables."""
        if i not in self._digits:
            assert self.radix is not None
            sizes = [len(values) for values in self.radix.digits]
            stride = int(np.prod(sizes[i + 1 :], dtype=np.int64))
            self._digits[i] = (self.codes // stride) % sizes[i]
        return self._digits[i]

    @property
    def keys(self) -> pl.DataFrame:
        """Each finest group's key values (decoded on demand on the radix path: the
        tables decode only their own keys)."""
        if self.radix is None:
            return self._keys
        return _key_values(self.codes, self.radix.digits)

    @property
    def groups(self) -> int:
        """The number of finest groups."""
        return len(self.rows)


def _sums_in_row_order(values: pl.Series, group: np.ndarray, n: int) -> np.ndarray:
    """Per-group sums of ``values`` (no nulls) added in row order, chunk by chunk: each
    chunk is read in place (a contiguous copy of the column would cost more than the
    sums), and ``np.add.at`` adds in the same order as one ``np.bincount`` over the
    whole column, so the bits do not depend on how the column is chunked. A column in
    many small chunks (a run of many small part files) is made contiguous first: one
    call per chunk would then cost more than the copy."""
    if values.n_chunks() > _MAX_CHUNKS_IN_PLACE:
        values = values.rechunk()
    out = np.zeros(n)
    start = 0
    for chunk in values.get_chunks():
        stop = start + chunk.len()
        np.add.at(out, group[start:stop], chunk.to_numpy())
        start = stop
    return out


def _renumber(codes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes in ``[0, size)`` renumbered densely to ``[0, groups)`` (order kept), and
    the codes in use (group ``g`` is ``used[g]``)."""
    present = np.bincount(codes, minlength=size) > 0
    return (np.cumsum(present) - 1)[codes], np.flatnonzero(present)


def _compress(codes: np.ndarray, size: int) -> tuple[np.ndarray, int]:
    """Codes in ``[0, size)`` renumbered densely, and the number of groups."""
    group, used = _renumber(codes, size)
    return group, len(used)


def _dense_codes(series: pl.Series) -> tuple[np.ndarray, int]:
    """Dense integer code per row of one key column, and the number of codes: an offset
    for integers spanning a small range, a categorical encoding for strings, a sort
    otherwise (which code a value gets does not matter: the tables are sorted by key)."""
    if series.dtype.is_integer():
        values = series.to_numpy()
        lo, hi = int(values.min()), int(values.max())
        if hi - lo <= max(len(values), 1):
            return _compress((values - lo).astype(np.int64), hi - lo + 1)
        uniq, inverse = np.unique(values, return_inverse=True)
        return inverse.astype(np.int64), len(uniq)
    codes = series.cast(pl.String).cast(pl.Categorical).to_physical().to_numpy().astype(np.int64)
    return _compress(codes, int(codes.max()) + 1)


def _group_codes(df: pl.DataFrame, keys: list[str]) -> tuple[np.ndarray, int]:
    """One dense group id per row for the combination of ``keys``."""
    if not df.height:
        return np.empty(0, dtype=np.int64), 0
    group, n = _dense_codes(df[keys[0]])
    for key in keys[1:]:
        codes, size = _dense_codes(df[key])
        combined = group * size + codes
        if n * size <= 4 * max(df.height, 1):
            group, n = _compress(combined, n * size)
        else:
            uniq, inverse = np.unique(combined, return_inverse=True)
            group, n = inverse.astype(np.int64), len(uniq)
    return group, n


@dataclasses.dataclass(frozen=True)
class _Radix:
    """Every combination of some keys numbered as one mixed-radix integer: ``code`` per
    row (a polars expression), each key's distinct values in digit order, and the
    number of codes."""

    code: pl.Expr
    digits: list[pl.Series]
    size: int


def _mixed_radix(df: pl.DataFrame, keys: list[str]) -> _Radix | None:
    """The mixed-radix numbering of ``keys`` (each key's offset from its minimum, or its
    rank among the sorted distinct strings); None when a key has nulls or the
    combinations outnumber :data:`_MAX_DIRECT_CODES` rows."""
    code: pl.Expr = pl.lit(0, dtype=pl.Int64)
    digits: list[pl.Series] = []
    size = 1
    limit = _MAX_DIRECT_CODES * max(df.height, 1)
    for key in keys:
        series = df[key]
        if series.null_count():
            return None
        if series.dtype.is_integer():
            lo, hi = int(series.min()), int(series.max())  # type: ignore[arg-type]
            if size * (hi - lo + 1) > limit:  # checked before the range is built
                return None
            digit = pl.col(key).cast(pl.Int64) - lo
            values = pl.Series(key, np.arange(lo, hi + 1), dtype=series.dtype)
        elif series.dtype == pl.String:
            values = series.unique().sort()
            digit = pl.col(key).cast(pl.Enum(values.to_list())).to_physical().cast(pl.Int64)
        else:
            return None
        size *= len(values)
        if size > limit:
            return None
        code = code * len(values) + digit
        digits.append(values)
    return _Radix(code, digits, size)


def _decoded(
    code: np.ndarray, size: int, digits: list[pl.Series]
) -> tuple[np.ndarray, np.ndarray, pl.DataFrame]:
    """Dense group ids of mixed-radix ``code`` values, the codes in use (group ``g`` is
    code ``used[g]``), and each group's key values decoded from its code."""
    group, used = _renumber(code, size)
    return group, used, _key_values(used, digits)


def _key_values(codes: np.ndarray, digits: list[pl.Series]) -> pl.DataFrame:
    """Each mixed-radix code's key values, one column per digit."""
    rest = codes.copy()
    columns = []
    for values in reversed(digits):
        columns.append(values.gather(rest % len(values)))
        rest //= len(values)
    return pl.DataFrame(columns[::-1])


def _grouped(df: pl.DataFrame, keys: list[str]) -> tuple[np.ndarray, int, pl.DataFrame]:
    """Group id per row, the number of groups, and each group's key values.

    Fast path: one mixed-radix code per row (:func:`_radix_grouped`). Else per-key
    codes (:func:`_key_grouped`).
    """
    radix = _mixed_radix(df, keys) if df.height else None
    if radix is None:
        return _key_grouped(df, keys)
    group, codes, key_values = _radix_grouped(df, radix)
    return group, len(codes), key_values


def _radix_grouped(df: pl.DataFrame, radix: _Radix) -> tuple[np.ndarray, np.ndarray, pl.DataFrame]:
    """Group id per row, the codes in use, and each group's key values: the code is
    computed by polars in a single pass, made dense with one bincount, and decoded."""
    codes = df.select(radix.code).to_series().to_numpy()
    return _decoded(codes, radix.size, radix.digits)


def _key_grouped(df: pl.DataFrame, keys: list[str]) -> tuple[np.ndarray, int, pl.DataFrame]:
    """Group id per row from per-key codes (:func:`_group_codes`), the number of groups,
    and key values taken from a row of each group."""
    group, n = _group_codes(df, keys)
    first = np.empty(n, dtype=np.int64)
    first[group] = np.arange(df.height)
    return group, n, df[first].select(keys)


def _group_sums(partials: _Partials, keys: list[str], *, mean: bool = False) -> pl.DataFrame:
    """Row count plus the sum (or mean, over non-null values) of every component and of
    the total per key, rolled up from the partials in their fixed order. Nulls (a
    component an older schema lacks) are skipped, like polars' own sum and mean."""
    if not partials.groups:
        empty = [pl.Series("rows", [], dtype=pl.UInt32)]
        empty += [pl.Series(c, [], dtype=pl.Float64) for c in _SUMMED]
        return partials.keys.select(keys).with_columns(empty)
    group, n, key_values = partials.rolled_up(keys)
    out = [
        pl.Series("rows", np.bincount(group, weights=partials.rows, minlength=n), dtype=pl.UInt32)
    ]
    for c in _SUMMED:
        total = np.bincount(group, weights=partials.sums[c], minlength=n)
        if not mean:
            out.append(pl.Series(c, total, dtype=pl.Float64))
            continue
        present = np.bincount(group, weights=partials.present[c], minlength=n)
        means = np.divide(total, present, out=np.zeros(n), where=present > 0)
        out.append(pl.Series(c, means).scatter(np.flatnonzero(present == 0), None))
    return key_values.with_columns(out)


def _with_check(lf: pl.LazyFrame) -> pl.LazyFrame:
    component_sum = pl.sum_horizontal([pl.col(c).fill_null(0.0) for c in _COMPONENTS])
    diff = (pl.col("component_sum") - pl.col("total")).abs()
    return lf.with_columns(component_sum=component_sum).with_columns(
        sum_ok=(diff <= SUM_TOLERANCE).fill_null(False) & diff.is_not_nan()
    )


def _missing_components(run: Run) -> list[str]:
    """Components absent from every reward_computed file (older schema versions)."""
    files = run.files.get("reward_computed", [])
    if not files:
        return []
    present: set[str] = set()
    for f in files:
        present.update(f.column_names())
    return [c for c in _COMPONENTS if c not in present]


def reward_breakdown(run: Run) -> RewardBreakdown:
    """Totals per env, episode, op and component; flags rows that do not add up."""
    lf = _with_check(run.scan("reward_computed"))
    episodes = run.scan("episode_finished").select(
        "rank", "round", "env", pl.col("episode_reward").alias("episode_reward_reported")
    )
    by_component_exprs = [
        pl.struct(  # sum and mean come from the partials (deterministic order)
            min=pl.col(c).min(),
            max=pl.col(c).max(),
            nonzero=(pl.col(c) != 0).sum(),
        ).alias(c)
        for c in [*_COMPONENTS, "total"]
    ]
    plans = [
        lf.select(by_component_exprs),
        lf.select(*_FINE, *_SUMMED),
        episodes,
        lf.filter(~pl.col("sum_ok"))
        .select("round", "env", "step", "op", "total", "component_sum", *_COMPONENTS)
        .with_columns(diff=pl.col("component_sum") - pl.col("total"))
        .sort("round", "env", "step"),
    ]
    comp, rows, reported, flagged = pl.collect_all(plans)
    partials = _Partials(rows)
    del rows  # peak memory: every table below is a roll-up of the partials
    by_component = _component_table(comp, partials)
    by_env = _group_sums(partials, ["env"]).sort("env")
    by_episode = (
        _group_sums(partials, ["rank", "round", "env"])
        .join(reported, on=["rank", "round", "env"], how="left")
        .sort("round", "env", "rank")
    )
    by_op = (
        _group_sums(partials, ["op"])
        .with_columns(mean_total=pl.col("total") / pl.col("rows"))
        .sort("op")
    )
    by_round = _group_sums(partials, ["round"], mean=True).sort("round")
    return RewardBreakdown(
        by_component=by_component,
        by_env=by_env,
        by_episode=by_episode,
        by_op=by_op,
        by_round=by_round,
        flagged=flagged,
        rows=int(by_env["rows"].sum()) if by_env.height else 0,
        flagged_rows=flagged.height,
        tolerance=SUM_TOLERANCE,
        missing_components=_missing_components(run),
    )


def _component_table(wide: pl.DataFrame, partials: _Partials) -> pl.DataFrame:
    """One row per component (and the total) from the one-row struct aggregate; sum and
    mean are numpy's over the per-group partial sums, in their fixed order (see the
    module docstring)."""
    table = []
    for name in _SUMMED:
        stats = dict(wide[name][0] or {}) if wide.height else {}
        present = int(partials.present[name].sum())
        if present:
            stats["sum"] = float(np.sum(partials.sums[name]))
            stats["mean"] = stats["sum"] / present
        table.append({"component": name, **{k: stats.get(k) for k in _STAT_KEYS}})
    return pl.DataFrame(table, schema=_COMPONENT_SCHEMA)


_STAT_KEYS: Final = ("sum", "mean", "min", "max", "nonzero")
_COMPONENT_SCHEMA: Final = pl.Schema(
    {
        "component": pl.String,
        "sum": pl.Float64,
        "mean": pl.Float64,
        "min": pl.Float64,
        "max": pl.Float64,
        "nonzero": pl.Int64,
    }
)
