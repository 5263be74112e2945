"""Damaged data is an error naming the file, never silently different numbers.

Footers, columns and the files' agreement with the manifest are checked when a run is
loaded (:mod:`esper_analysis.loader`, :mod:`esper_analysis.manifest_check`). Data pages
carry CRC32 checksums; polars' reader does not check them, so they are verified where
the writer merges (every input page, at the close) and by :func:`verify_run`
(``esper analyze verify RUN``), which reads every page of every file. A scan that fails
on damaged pages is turned into :class:`CorruptFileError` naming the file by
:func:`corrupt_data_errors`, which every public analysis runs under
(:func:`guard_corrupt_data`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Concatenate, ParamSpec, TypeVar

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from esper_analysis.errors import CorruptFileError
from esper_analysis.result import AnalysisResult

if TYPE_CHECKING:
    from esper_analysis.loader import Run

P = ParamSpec("P")
R = TypeVar("R")
#: What a scan of damaged or vanished files can raise (polars panics are BaseException).
SCAN_ERRORS = (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError, pa.ArrowException)


class IntegrityError(CorruptFileError):
    """The files disagree with the manifest, or hold another run's events (exit 2)."""


def page_damage(path: Path) -> str | None:
    """Why some page of ``path`` fails its checksum or does not decode (None if none
    does): every page read with pyarrow's checksum verification, strings kept
    dictionary-encoded (decoding them is not needed to check them)."""
    try:
        schema = pq.read_schema(path)
        strings = [f.name for f in schema if pa.types.is_string(f.type)]
        with pq.ParquetFile(path, page_checksum_verification=True, read_dictionary=strings) as f:
            for group in range(f.num_row_groups):
                f.read_row_group(group, use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return None


@dataclasses.dataclass(frozen=True)
class Verification(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {"files": "Page checksums, file by file"}

    #: One row per file: path, event type, rank, rows, bytes, and the damage found.
    files: pl.DataFrame
    damaged: int


def verify_run(run: Run) -> Verification:
    """Read every page of every file of the run, checksums verified."""
    rows = []
    for files in run.files.values():
        for part in files:
            damage = page_damage(part.path)
            rows.append(
                {
                    "file": part.name_in(run.path),
                    "type": part.event_type,
                    "rank": part.rank,
                    "rows": part.rows,
                    "bytes": part.path.stat().st_size if part.path.exists() else None,
                    "damage": damage or "",
                }
            )
    schema = {"file": pl.String, "type": pl.String, "rank": pl.Int64, "rows": pl.Int64}
    frame = pl.DataFrame(rows, schema={**schema, "bytes": pl.Int64, "damage": pl.String})
    return Verification(files=frame, damaged=int((frame["damage"] != "").sum()))


@contextmanager
def corrupt_data_errors(run: Run) -> Iterator[None]:
    """Turn a scan that failed on damaged data pages into :class:`CorruptFileError`
    naming the files, and one that found a file gone (a live run's merge) into one that
    says to read again. An error no file explains is a bug and propagates unchanged."""
    try:
        yield
    except SCAN_ERRORS as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        files = [f for fs in run.files.values() for f in fs]
        if any(not f.path.exists() for f in files):
            raise CorruptFileError(
                f"run {run.run_id} ({run.path}) changed while it was read (a live run's "
                f"writer merges its parts as it goes): read it again ({first})"
            ) from None
        bad = [f.name_in(run.path) for f in files if page_damage(f.path) is not None]
        if not bad:
            raise
        where = ", ".join(str(run.path / b) for b in bad)
        raise CorruptFileError(f"corrupt Parquet data in {where}: {first}") from None


def guard_corrupt_data(fn: Callable[Concatenate[Run, P], R]) -> Callable[Concatenate[Run, P], R]:
    """``fn(run, ...)`` under :func:`corrupt_data_errors` (the public analyses)."""

    @functools.wraps(fn)
    def guarded(run: Run, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with corrupt_data_errors(run):
            return fn(run, *args, **kwargs)

    return guarded
