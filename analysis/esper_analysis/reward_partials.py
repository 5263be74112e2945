"""Reward partials: row counts and sums of every reward column per finest group (rank,
round, env, op), from which every table of the reward breakdown is rolled up.

Sums are added in numpy (or ``_grouped.c``) in a fixed order, per finest group in row
order, then rolled up over those groups in code order, so every call gives the same
bits (a parallel group-by adds floats in an order that varies from call to call). The
groups are numbered by one mixed-radix code where the keys' ranges allow it
(:class:`Radix`), else by per-key dense codes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import ModuleType
from typing import Final

import numpy as np
import polars as pl

from esper.core.native import load_native
from esper.core.records import REWARD_COMPONENTS

#: The reward components, in the reward's order.
COMPONENTS: Final = list(REWARD_COMPONENTS)

#: The summed columns: every component and the total.
SUMMED: Final = [*COMPONENTS, "total"]
#: The finest grouping; every table's keys are a subset of it (read with the components).
FINE: Final = ["rank", "round", "env", "op"]
#: Above this many chunks a summed column is copied into one before its sums are taken.
_MAX_CHUNKS_IN_PLACE: Final = 64
#: The one-pass grouped sums (``_grouped.c``), or None where not built or turned off.
_native = load_native("esper_analysis._grouped")
#: Keys are coded directly (no per-key renumbering) while their combinations number at
#: most this many per row: the bincounts over the codes stay as cheap as one pass.
_MAX_DIRECT_CODES: Final = 4


@dataclasses.dataclass
class Partials:
    """Row counts, sums and non-null counts of every summed column per finest group
    (rank, round, env, op), accumulated in row order. Every table is a roll-up of these
    partials, so the large frame is grouped once and its columns are read in place."""

    radix: Radix | None
    #: The finest groups: on the radix path their mixed-radix codes, ascending (group
    #: ``g`` is ``codes[g]``); on the key path ``0..groups-1``, with ``key_values``.
    codes: np.ndarray
    rows: np.ndarray
    sums: dict[str, np.ndarray]
    present: dict[str, np.ndarray]
    key_values: pl.DataFrame | None = None
    _digits: dict[int, np.ndarray] = dataclasses.field(default_factory=dict, init=False, repr=False)

    @classmethod
    def of(cls, df: pl.DataFrame) -> Partials:
        """The partials of a frame of :data:`FINE` and :data:`SUMMED` columns."""
        radix = mixed_radix(df, FINE) if df.height else None
        keys = None
        if radix is None:
            group, n, keys = _key_grouped(df, FINE)
        else:
            # Sum straight into one slot per code, and keep the codes in use: no pass
            # over the rows to renumber them first.
            group = df.select(radix.code).to_series().to_numpy()
            n = radix.size
        summed = []
        present: dict[str, np.ndarray] = {}
        for c in SUMMED:
            col = df[c].cast(pl.Float64)
            if col.null_count():
                present[c] = np.bincount(group, weights=col.is_not_null().to_numpy(), minlength=n)
                col = col.fill_null(0.0)
            summed.append(col)
        rows, sums = _grouped_sums(summed, group, n)
        used = np.flatnonzero(rows)
        counts = rows[used]
        return cls(
            radix,
            used,
            counts,
            columns_of(sums, used),
            {c: present[c][used] if c in present else counts for c in SUMMED},
            keys,
        )

    def rolled_up(self, keys: list[str]) -> tuple[np.ndarray, int, pl.DataFrame]:
        """Group id per finest group for ``keys``, the number of groups and their key
        values. On the mixed-radix path each key's digit is arithmetic on the finest
        group's code (no second grouping of the key frame)."""
        if self.radix is None:
            assert self.key_values is not None
            return _grouped(self.key_values, keys)
        sizes = [len(values) for values in self.radix.digits]
        code = np.zeros(len(self.codes), dtype=np.int64)
        size = 1
        digits = []
        for key in keys:
            i = FINE.index(key)
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
            assert self.key_values is not None
            return self.key_values
        return _key_values(self.codes, self.radix.digits)

    @property
    def groups(self) -> int:
        """The number of finest groups."""
        return len(self.rows)


def native_module() -> ModuleType | None:
    """The native passes (``_grouped.c``), or None where not built or turned off."""
    return _native


def columns_of(sums: np.ndarray, slots: np.ndarray) -> dict[str, np.ndarray]:
    """Each summed column's values at ``slots`` of a (column, slot) table, contiguous
    (``take`` along the slots keeps each column's values together)."""
    return dict(zip(SUMMED, np.take(sums, slots, axis=1), strict=True))


def _grouped_sums(
    columns: list[pl.Series], group: np.ndarray, n: int, *, native: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Rows per group and the per-group sums (column, group) of the columns (no nulls),
    added in row order
    (:func:`add_grouped`), each chunk read in place: a contiguous copy of 13 columns
    would cost more than the sums. Columns in many small chunks (a run of many small
    part files), or chunked unlike each other, are made contiguous first."""
    layouts = {tuple(ch.len() for ch in col.get_chunks()) for col in columns}
    if len(layouts) > 1 or max(map(len, layouts), default=0) > _MAX_CHUNKS_IN_PLACE:
        columns = [col.rechunk() for col in columns]
    rows = np.zeros(n, dtype=np.int64)
    sums = np.zeros((len(columns), n))
    start = 0
    for chunks in zip(*(col.get_chunks() for col in columns), strict=True):
        stop = start + chunks[0].len()
        add_grouped(sums, rows, group[start:stop], [c.to_numpy() for c in chunks], native=native)
        start = stop
    return rows, sums


def add_grouped(
    sums: np.ndarray,
    rows: np.ndarray,
    group: np.ndarray,
    columns: Sequence[np.ndarray],
    *,
    native: bool = True,
) -> None:
    """``rows[g] += 1`` and ``sums[j, g] += columns[j][i]`` for every row ``i`` of group
    ``g = group[i]``, in row order. Both ways add each group's values one by one in row
    order, so they give the same bits, and calls chunk by chunk give the bits of one call
    over the whole column: the native one (``_grouped.c``) does every column in one
    pass without the GIL, numpy one ``np.add.at`` per column (``native=False``: numpy
    even where the native one is built)."""
    if native and _native is not None and sums.flags.c_contiguous:
        _native.add_grouped(sums.reshape(-1), rows, group, list(columns))
        return
    rows += np.bincount(group, minlength=len(rows))
    for j, values in enumerate(columns):
        np.add.at(sums[j], group, values)


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
    otherwise (which code a value gets does not matter: the tables are sorted by key).
    A null is a value of its own."""
    if series.dtype.is_integer():
        if series.null_count():  # nulls: one more code, after the largest value
            largest = series.max()
            series = series.fill_null(0 if largest is None else int(largest) + 1)  # type: ignore[arg-type]
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
class Radix:
    """Every combination of some keys numbered as one mixed-radix integer: ``code`` per
    row (a polars expression), each key's distinct values in digit order, and the
    number of codes."""

    code: pl.Expr
    digits: list[pl.Series]
    size: int


def mixed_radix(df: pl.DataFrame, keys: list[str]) -> Radix | None:
    """The mixed-radix numbering of ``keys`` (each key's offset from its minimum, or its
    rank among the sorted distinct strings); None when a key has nulls or the
    combinations outnumber :data:`_MAX_DIRECT_CODES` rows."""
    digits: list[pl.Series] = []
    size = 1
    limit = direct_code_limit(df.height)
    for key in keys:
        series = df[key]
        if series.null_count():
            return None
        if series.dtype.is_integer():
            lo, hi = int(series.min()), int(series.max())  # type: ignore[arg-type]
            if size * (hi - lo + 1) > limit:  # checked before the range is built
                return None
            values = pl.Series(key, np.arange(lo, hi + 1), dtype=series.dtype)
        elif series.dtype == pl.String:
            values = series.unique().sort()
        else:
            return None
        size *= len(values)
        if size > limit:
            return None
        digits.append(values)
    return radix_of(digits)


def direct_code_limit(rows: int) -> int:
    """The most codes a mixed-radix numbering of ``rows`` rows may have."""
    return _MAX_DIRECT_CODES * max(rows, 1)


def radix_of(digits: list[pl.Series]) -> Radix:
    """The mixed-radix numbering whose digits are these keys' values: a range of
    integers from the smallest, or sorted strings."""
    code: pl.Expr = pl.lit(0, dtype=pl.Int64)
    size = 1
    for values in digits:
        key = values.name
        if values.dtype.is_integer():
            digit = pl.col(key).cast(pl.Int64) - int(values[0])
        else:
            digit = pl.col(key).cast(pl.Enum(values.to_list())).to_physical().cast(pl.Int64)
        code = code * len(values) + digit
        size *= len(values)
    return Radix(code, digits, size)


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
    radix = mixed_radix(df, keys) if df.height else None
    if radix is None:
        return _key_grouped(df, keys)
    group, codes, key_values = _radix_grouped(df, radix)
    return group, len(codes), key_values


def _radix_grouped(df: pl.DataFrame, radix: Radix) -> tuple[np.ndarray, np.ndarray, pl.DataFrame]:
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


def group_sums(partials: Partials, keys: list[str], *, mean: bool = False) -> pl.DataFrame:
    """Row count plus the sum (or mean, over non-null values) of every component and of
    the total per key, rolled up from the partials in their fixed order. Nulls (a
    component an older schema lacks) are skipped, like polars' own sum and mean."""
    if not partials.groups:
        empty = [pl.Series("rows", [], dtype=pl.UInt32)]
        empty += [pl.Series(c, [], dtype=pl.Float64) for c in SUMMED]
        return partials.keys.select(keys).with_columns(empty)
    group, n, key_values = partials.rolled_up(keys)
    # Every column of the partials rolled up in one pass: group by group in the finest
    # groups' order, the additions of ``np.bincount(group, weights=...)``.
    columns = [partials.rows.astype(np.float64), *(partials.sums[c] for c in SUMMED)]
    # A column without nulls is present in every row: its count is the rows' (the
    # partials hold the rows' array itself for it), added once.
    counted = [c for c in SUMMED if mean and partials.present[c] is not partials.rows]
    columns += [partials.present[c].astype(np.float64) for c in counted]
    totals = np.zeros((len(columns), n))
    add_grouped(totals, np.zeros(n, dtype=np.int64), group, columns)
    out = [pl.Series("rows", totals[0], dtype=pl.UInt32, strict=False)]
    where = {c: 1 + len(SUMMED) + i for i, c in enumerate(counted)}
    for j, c in enumerate(SUMMED, start=1):
        total = totals[j]
        if not mean:
            out.append(pl.Series(c, total, dtype=pl.Float64))
            continue
        present = totals[where.get(c, 0)]
        means = np.divide(total, present, out=np.zeros(n), where=present > 0)
        out.append(pl.Series(c, means).scatter(np.flatnonzero(present == 0), None))
    return key_values.with_columns(out)
