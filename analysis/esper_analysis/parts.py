"""What the loader knows of one part: a Parquet file (footer facts), or the in-memory
table of a crashed run's journalled events (:mod:`esper_analysis.journal_files`).

Journal events are kept in memory rather than in scratch files: a lazy scan must not
outlive the files it reads (``load_run(p).scan(t).collect()`` drops the run before the
collect), and a table referenced by the scan's plan lives exactly as long as the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq


@dataclass(frozen=True)
class PartFile:
    """One Parquet part file, described from its footer alone (or an in-memory part)."""

    path: Path
    event_type: str
    rank: int
    rows: int
    schema_version: int | None
    seq_min: int | None
    seq_max: int | None
    #: The one ``run_id`` the footer statistics prove, or None (then read when checked).
    run_id: str | None = None
    #: The ``rank`` every row has, as the footer proves it (statistics, or no such
    #: column: then the directory's rank, as a scan fills it), or None if not provable.
    rank_value: int | None = None
    #: A journal part's events (``path`` is then the journal directory, for messages).
    table: pa.Table | None = field(default=None, repr=False, compare=False)

    def name_in(self, run_dir: Path) -> str:
        """How messages name this part: relative to the run directory."""
        try:
            return self.path.relative_to(run_dir).as_posix()
        except ValueError:
            return str(self.path)

    def column_names(self) -> list[str]:
        if self.table is not None:
            return list(self.table.schema.names)
        return list(pq.read_schema(self.path).names)

    def read_seq(self) -> pa.ChunkedArray:
        if self.table is not None:
            return self.table.column("seq")
        return pq.read_table(self.path, columns=["seq"]).column("seq")


def scan_parts(parts: Sequence[PartFile], **scan_options: Any) -> pl.LazyFrame:
    """One lazy frame over ``parts`` in order: files by one ``scan_parquet``, in-memory
    parts appended (they hold the newest events of their rank). With a ``schema``
    option, in-memory parts are cast to it, as the scan casts the files."""
    paths = [str(p.path) for p in parts if p.table is None]
    frames = [pl.scan_parquet(paths, **scan_options)] if paths else []
    schema = scan_options.get("schema")
    for part in parts:
        if part.table is None:
            continue
        frame = pl.from_arrow(part.table)
        assert isinstance(frame, pl.DataFrame)
        lazy = frame.lazy()
        if schema is not None:
            lazy = lazy.select(
                pl.col(n).cast(t) if n in frame.columns else pl.lit(None, t).alias(n)
                for n, t in schema.items()
            )
        frames.append(lazy)
    if not frames:
        raise ValueError("no parts to scan")
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")
