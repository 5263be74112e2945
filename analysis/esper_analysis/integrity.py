"""Integrity checks that keep damaged or foreign files from crashing an analysis.

Four layers: :func:`check_columns` rejects, from a Parquet footer alone, a file whose
columns do not have the catalogue's types for its event type (the loader then treats
it like an unreadable file); scans read every page with pyarrow's own checksum
verification (:mod:`esper_analysis.parts`; :func:`verify_pages` reads a whole file so,
to name the damaged one), so random bytes in a part are an error rather than silently
different numbers;
:func:`esper_analysis.manifest_check.check_run_integrity` compares the files with
the manifest (``run_id``, per-type counts); :func:`corrupt_data_errors` turns a scan
that fails on damaged data pages into :class:`CorruptFileError` naming the file.
Every public analysis runs under :func:`guard_corrupt_data`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Concatenate, Final, ParamSpec, TypeVar

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from polars.datatypes import DataTypeClass

from esper_analysis.errors import CorruptFileError
from esper_analysis.schema import event_schema

if TYPE_CHECKING:
    from esper_analysis.loader import Run

P = ParamSpec("P")
R = TypeVar("R")
#: Unsigned file columns up to this width fit the catalogue's Int64.
_MAX_UNSIGNED_BITS: Final = 32


class ForeignTableError(ValueError):
    """A Parquet file whose columns lack the catalogue's types for its event type."""


class IntegrityError(CorruptFileError):
    """The files disagree with the manifest, or hold another run's events (exit 2)."""


class DamagedPagesError(ValueError):
    """A data page fails its checksum or does not decode (the footer was fine)."""


def verify_pages(path: Path, meta: pq.FileMetaData | None = None) -> None:
    """Read every page of ``path`` with pyarrow's page checksum verification (string
    columns kept dictionary-encoded: decoding them is not needed to check them).

    Raises :class:`DamagedPagesError` with the first line of the reason.
    """
    try:
        meta = meta or pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
        strings = [f.name for f in schema if pa.types.is_string(f.type)]
        with pq.ParquetFile(
            path, metadata=meta, page_checksum_verification=True, read_dictionary=strings
        ) as parquet:
            for group in range(parquet.num_row_groups):
                parquet.read_row_group(group, use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DamagedPagesError(first) from None


def footer_values(meta: pq.FileMetaData, name: str) -> tuple[set[object], int | None] | None:
    """Every row group's min and max of column ``name``, and its nulls summed (None if a
    row group does not count them), from the footer statistics alone; None when the
    file has no such column, no row group, or a row group without min and max."""
    names = meta.schema.names
    if name not in names or meta.num_row_groups == 0:
        return None
    col = names.index(name)
    values: set[object] = set()
    nulls: int | None = 0
    for group in range(meta.num_row_groups):
        stats = meta.row_group(group).column(col).statistics
        if stats is None or not stats.has_min_max:
            return None
        values.update((stats.min, stats.max))
        nulls = nulls + stats.null_count if nulls is not None and stats.has_null_count else None
    return values, nulls


def footer_run_id(meta: pq.FileMetaData) -> str | None:
    """The file's single ``run_id`` from the footer statistics, or None if not provable
    (a null among the rows, or nulls not counted, is not that run's)."""
    found = footer_values(meta, "run_id")
    if found is None or found[1] != 0 or len(found[0]) != 1:
        return None
    only = found[0].pop()
    return only if isinstance(only, str) else None


def file_run_ids(path: Path) -> set[str]:
    """Every distinct ``run_id`` in a file (reads that one column)."""
    column = pq.read_table(path, columns=["run_id"]).column("run_id")
    return {str(v) for v in pc.unique(column).to_pylist()}


def _same_kind(t: pa.DataType, d: pl.DataType | DataTypeClass) -> bool:
    """Whether a file column of type ``t`` scans into catalogue dtype ``d`` (upcasts only)."""
    if pa.types.is_null(t):
        return True
    if pa.types.is_dictionary(t):
        t = t.value_type
    if isinstance(d, pl.List):
        return (pa.types.is_list(t) or pa.types.is_large_list(t)) and _same_kind(
            t.value_type, d.inner
        )
    if d == pl.Int64:
        return bool(pa.types.is_signed_integer(t)) or bool(
            pa.types.is_unsigned_integer(t) and t.bit_width <= _MAX_UNSIGNED_BITS
        )
    if d == pl.Float64:
        return bool(pa.types.is_floating(t))
    if d == pl.Boolean:
        return bool(pa.types.is_boolean(t))
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def check_columns(meta: pq.FileMetaData, event_type: str) -> None:
    """Reject, from the footer alone, a file that is not a table of ``event_type``."""
    expected = event_schema(event_type)
    actual = meta.schema.to_arrow_schema()
    if "seq" not in actual.names:
        raise ForeignTableError(f"no seq column: not an {event_type} table")
    bad = [
        f"{f.name} is {f.type}"
        for f in actual
        if f.name in expected and not _same_kind(f.type, expected[f.name])
    ]
    if bad:
        raise ForeignTableError(f"not an {event_type} table ({'; '.join(bad)})")


@contextmanager
def corrupt_data_errors(run: Run) -> Iterator[None]:
    """Turn a scan that failed on damaged data pages into :class:`CorruptFileError`.

    Footers are checked when a run is loaded; data pages only when a scan reads them, so
    every public analysis runs under this guard (see :func:`guard_corrupt_data`). An
    error no file explains is a bug and propagates unchanged.
    """
    try:
        yield
    except (pl.exceptions.PolarsError, OSError, pa.ArrowException) as exc:
        bad = run.find_corrupt_files()
        if not bad:
            raise
        where = ", ".join(b.path for b in bad)
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise CorruptFileError(f"corrupt Parquet data in {where}: {first}") from None


def guard_corrupt_data(fn: Callable[Concatenate[Run, P], R]) -> Callable[Concatenate[Run, P], R]:
    """``fn(run, ...)`` under :func:`corrupt_data_errors` (the public analyses)."""

    @functools.wraps(fn)
    def guarded(run: Run, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with corrupt_data_errors(run):
            return fn(run, *args, **kwargs)

    return guarded
