"""Reward partials read one row group at a time: the fast way for a run on disk.

Read whole, the reward table of a 10M-event run is 2.1M rows of 13 float columns,
270 MB of fresh memory whose first touch (page faults) costs more than the sums. Here
each row group is read (by pyarrow, into memory reused from one row group to the next,
the next one read on a thread while this one is summed), added to the partials and
dropped; the per-row checks (:data:`BatchChecks`) run on it while it is in memory.

The partials are the in-memory way's, bit for bit: rows are read in the scan's order
(ranks ascending, each rank's files in order), each group's sums are added in that
order, and the groups get the same mixed-radix codes. The integer keys' ranges come
from the footers' statistics; op names are numbered as they are met, op as the leading
digit (so a new name only extends the code space), and renumbered in sorted order at
the end, where the codes are rebuilt with op as the last digit.

:func:`stream_partials` returns None (the caller then reads the table whole) where this
cannot be done the same way: in-memory journal parts, parts that need deduplication, a
file that lacks a column or stores it with another type, footers without statistics, a
null key, or more codes than the in-memory way would number directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Final

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from esper_analysis.loader import Run
from esper_analysis.reward_partials import (
    FINE,
    SUMMED,
    Partials,
    add_grouped,
    columns_of,
    direct_code_limit,
    radix_of,
)

EVENT_TYPE: Final = "reward_computed"
#: The integer keys, most significant first (as in :data:`FINE`, which ends with op).
INT_KEYS: Final = FINE[:-1]
OP: Final = FINE[-1]
#: Every column a row group is read with, and the Arrow types it may have on disk.
COLUMN_TYPES: Final = {
    **dict.fromkeys([*INT_KEYS, "step"], (pa.int64(),)),
    OP: (pa.string(), pa.large_string()),
    **dict.fromkeys(SUMMED, (pa.float64(),)),
}

#: The per-row checks, called with each row group in order.
BatchChecks = Callable[[pa.Table], None]


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The files in scan order (with their footers), and each integer key's range over
    all of them."""

    files: list[tuple[Path, pq.FileMetaData]]
    ranges: list[tuple[int, int]]
    rows: int

    @classmethod
    def of(cls, run: Run) -> _Plan | None:
        parts = run.files.get(EVENT_TYPE, [])
        if not parts or run.needs_dedup(EVENT_TYPE) or any(p.table is not None for p in parts):
            return None
        ordered = sorted(parts, key=lambda p: p.rank)  # stable: files keep their order
        low = dict.fromkeys(INT_KEYS, np.iinfo(np.int64).max)
        high = dict.fromkeys(INT_KEYS, np.iinfo(np.int64).min)
        footers = [pq.read_metadata(part.path) for part in ordered]
        for meta in footers:
            if not _footer_ranges(meta, low, high):
                return None
        rows = sum(p.rows for p in ordered)
        if not rows:
            return None
        ranges = [(int(low[k]), int(high[k])) for k in INT_KEYS]
        return cls([(p.path, m) for p, m in zip(ordered, footers, strict=True)], ranges, rows)

    @property
    def inner(self) -> int:
        """Codes of the integer keys together."""
        return int(np.prod([hi - lo + 1 for lo, hi in self.ranges], dtype=np.int64))


def _footer_ranges(meta: pq.FileMetaData, low: dict[str, int], high: dict[str, int]) -> bool:
    """Widen ``low``/``high`` to ``part``'s integer keys; False where its footer lacks a
    column, a type or the statistics (min, max, no nulls) of every row group."""
    schema = meta.schema.to_arrow_schema()
    for name, kinds in COLUMN_TYPES.items():
        if schema.get_field_index(name) < 0 or schema.field(name).type not in kinds:
            return False
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    for key in INT_KEYS:
        j = names.index(key)
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(j).statistics
            if stats is None or not stats.has_min_max or stats.null_count != 0:
                return False
            low[key] = min(low[key], stats.min)
            high[key] = max(high[key], stats.max)
    return True


class _Sums:
    """Rows and sums per code, op-major: ``op_id * inner + integer keys' code``."""

    def __init__(self, inner: int) -> None:
        self.inner = inner
        self.ops: dict[str, int] = {}
        self.rows = np.zeros(0, dtype=np.int64)
        self.sums = np.zeros((len(SUMMED), 0))
        self.present: dict[str, np.ndarray] = {}
        self._scratch = np.zeros((2, 0), dtype=np.int64)

    def scratch(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Two int64 buffers of ``rows`` entries, the same memory from call to call."""
        if self._scratch.shape[1] < rows:
            self._scratch = np.zeros((2, rows), dtype=np.int64)
        return self._scratch[0, :rows], self._scratch[1, :rows]

    def op_ids(self, names: list[str]) -> np.ndarray:
        """Each name's op id; new names get the next ids and their codes."""
        for name in names:
            self.ops.setdefault(name, len(self.ops))
        grow = len(self.ops) * self.inner - len(self.rows)
        if grow:
            self.rows = np.concatenate([self.rows, np.zeros(grow, dtype=np.int64)])
            self.sums = np.concatenate([self.sums, np.zeros((len(SUMMED), grow))], axis=1)
            for c, counts in self.present.items():
                self.present[c] = np.concatenate([counts, np.zeros(grow)])
        return np.array([self.ops[name] for name in names], dtype=np.int64)

    def add(self, table: pa.Table, code: np.ndarray) -> None:
        columns = []
        for c in SUMMED:
            values = table.column(c).chunk(0)
            if values.null_count:
                if c not in self.present:  # rows before this one had no nulls
                    self.present[c] = self.rows.astype(np.float64)
                valid = values.is_valid().to_numpy(zero_copy_only=False)
                self.present[c] += np.bincount(code, weights=valid, minlength=len(self.rows))
                values = pc.fill_null(values, 0.0)
            elif c in self.present:
                self.present[c] += np.bincount(code, minlength=len(self.rows))
            columns.append(values.to_numpy())
        add_grouped(self.sums, self.rows, code, columns)

    def partials(self, plan: _Plan) -> Partials | None:
        """The partials with the in-memory way's codes (op last, names sorted)."""
        size = self.inner * len(self.ops)
        if size > direct_code_limit(plan.rows):
            return None  # the in-memory way numbers these groups otherwise
        names = pl.Series(OP, list(self.ops), dtype=pl.String)
        order = names.arg_sort().to_numpy()  # op ids in sorted-name order
        ops = len(order)
        # The counts by (integer code, op rank): their flat index is the final code.
        final = self.rows.reshape(ops, self.inner)[order].T.ravel()
        codes = np.flatnonzero(final)
        slots = order[codes % ops] * self.inner + codes // ops  # their op-major slots
        rows = final[codes]
        digits = [
            pl.Series(key, np.arange(lo, hi + 1), dtype=pl.Int64)
            for key, (lo, hi) in zip(INT_KEYS, plan.ranges, strict=True)
        ]
        return Partials(
            radix_of([*digits, names.gather(order)]),
            codes,
            rows,
            columns_of(self.sums, slots),
            {c: self.present[c][slots] if c in self.present else rows for c in SUMMED},
        )


def stream_partials(run: Run, checks: BatchChecks) -> Partials | None:
    """The reward partials, each row group passed to ``checks`` once summed; None where
    the run cannot be read this way (see the module doc)."""
    plan = _Plan.of(run)
    if plan is None or plan.inner > direct_code_limit(plan.rows):
        return None
    sums = _Sums(plan.inner)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="esper-rewards") as pool:
        for table in _read_ahead(pool, plan.files):
            code = _codes(table, plan, sums)
            if code is None:
                return None
            sums.add(table, code)
            checks(table)
    return sums.partials(plan)


def _codes(table: pa.Table, plan: _Plan, sums: _Sums) -> np.ndarray | None:
    """Each row's op-major code (in a buffer reused by the next row group: no fresh
    memory per row group), or None where a key is null."""
    code, scratch = sums.scratch(table.num_rows)
    for i, (key, (lo, hi)) in enumerate(zip(INT_KEYS, plan.ranges, strict=True)):
        values = table.column(key).chunk(0)
        if values.null_count:
            return None
        if i:
            np.multiply(code, hi - lo + 1, out=code)
            np.add(code, values.to_numpy(), out=code)
        else:
            code[:] = values.to_numpy()
        if lo:
            np.subtract(code, lo, out=code)
    ops = table.column(OP).chunk(0)
    if ops.null_count:
        return None
    indices = ops.indices.to_numpy()
    seen = np.bincount(indices, minlength=len(ops.dictionary)) > 0
    names = ops.dictionary.to_pylist()
    offsets = np.zeros(len(names), dtype=np.int64)
    offsets[seen] = sums.op_ids([n for n, s in zip(names, seen, strict=True) if s]) * plan.inner
    np.take(offsets, indices, out=scratch)
    np.add(code, scratch, out=code)
    return code


def _read_ahead(
    pool: ThreadPoolExecutor, files: list[tuple[Path, pq.FileMetaData]]
) -> Iterator[pa.Table]:
    """Every row group of ``files`` in order (one chunk per column, op dictionary
    encoded), the next one read on ``pool`` while the caller works on this one."""
    pending: Future[pa.Table] | None = None
    for path, meta in files:
        reader = pq.ParquetFile(path, metadata=meta, read_dictionary=[OP])
        for group in range(reader.num_row_groups):
            ahead = pool.submit(_read_group, reader, group)
            if pending is not None:
                yield pending.result()
            pending = ahead
    if pending is not None:
        yield pending.result()


def _read_group(reader: pq.ParquetFile, group: int) -> pa.Table:
    table = reader.read_row_group(group, columns=list(COLUMN_TYPES))
    if any(column.num_chunks != 1 for column in table.columns):
        table = table.unify_dictionaries().combine_chunks()
    return table
