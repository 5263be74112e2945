"""What the loader knows of one part file (facts from its name and footer), and scans of
parts whose reads verify every page they touch.

A scan reads the columns a query asks for (polars pushes its projection down) with
pyarrow, ``page_checksum_verification=True``: every page an analysis reads is checked,
so damaged data is an error instead of a different number, at the cost of no more than
the read itself. Columns a file lacks (an older schema) come back as null; integers and
floats are upcast to the catalogue's types.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from polars.io.plugins import register_io_source

#: A column every part has; read to count rows when a query asks for no column.
_ALWAYS: str = "seq"


@dataclass(frozen=True)
class PartFile:
    """One Parquet part file, described from its name and footer (no data read)."""

    path: Path
    event_type: str
    rank: int
    rows: int
    schema_version: int | None
    #: Its ``seq`` range: from the name (schema 3), else the footer statistics.
    seq_min: int | None
    seq_max: int | None
    #: The one ``run_id`` the footer statistics prove, or None (then read when checked).
    run_id: str | None = None
    #: The file's column names.
    columns: tuple[str, ...] = field(default=(), compare=False)

    def name_in(self, run_dir: Path) -> str:
        """How messages name this part: relative to the run directory."""
        try:
            return self.path.relative_to(run_dir).as_posix()
        except ValueError:
            return str(self.path)

    def read_seq(self) -> pa.ChunkedArray:
        return pq.read_table(self.path, columns=["seq"]).column("seq")


def _read(
    part: PartFile, columns: list[str], schema: pl.Schema, verify: bool
) -> Iterator[pl.DataFrame]:
    """``columns`` of one part, a row group at a time (bounded memory), typed by
    ``schema`` (absent ones null, ``rank`` filled in from the directory where the file
    has none)."""
    wanted = [c for c in columns if c in part.columns] or [_ALWAYS]

    def column(name: str, present: list[str]) -> pl.Expr:
        if name not in present:
            return pl.lit(part.rank if name == "rank" else None).cast(schema[name]).alias(name)
        expr = pl.col(name).cast(schema[name])
        return expr.fill_null(part.rank) if name == "rank" else expr

    with pq.ParquetFile(part.path, page_checksum_verification=verify) as parquet:
        for group in range(parquet.num_row_groups):
            frame = pl.from_arrow(parquet.read_row_group(group, columns=wanted))
            assert isinstance(frame, pl.DataFrame)
            yield frame.select(column(c, frame.columns) for c in columns)
    pa.default_memory_pool().release_unused()  # the decoded pages: polars holds the data


def scan_parts(
    parts: Sequence[PartFile], schema: pl.Schema, *, verify: bool = True
) -> pl.LazyFrame:
    """One lazy frame over ``parts``, in order, typed by ``schema``; ``verify``: every
    page read is checked against its checksum."""

    def source(
        with_columns: list[str] | None,
        predicate: pl.Expr | None,
        n_rows: int | None,
        _batch_size: int | None,
    ) -> Iterator[pl.DataFrame]:
        columns = list(schema) if with_columns is None else list(with_columns)
        left = n_rows
        for part in parts:
            for frame in _read(part, columns, schema, verify):
                kept = frame if predicate is None else frame.filter(predicate)
                if left is not None:
                    kept = kept.head(left)
                    left -= kept.height
                yield kept
                if left is not None and left <= 0:
                    return

    return register_io_source(source, schema=schema, is_pure=True)
