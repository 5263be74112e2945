"""What the loader knows of one part file: facts from its name and footer alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq


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

    def name_in(self, run_dir: Path) -> str:
        """How messages name this part: relative to the run directory."""
        try:
            return self.path.relative_to(run_dir).as_posix()
        except ValueError:
            return str(self.path)

    def column_names(self) -> list[str]:
        return list(pq.read_schema(self.path).names)

    def read_seq(self) -> pa.ChunkedArray:
        return pq.read_table(self.path, columns=["seq"]).column("seq")


def scan_parts(parts: Sequence[PartFile], **scan_options: Any) -> pl.LazyFrame:
    """One lazy frame over ``parts``, in order."""
    if not parts:
        raise ValueError("no parts to scan")
    return pl.scan_parquet([str(p.path) for p in parts], **scan_options)
