"""Where the writer puts bytes: one closed Parquet file per call, atomically.

The writer talks to a :class:`PartSink` so tests (and exotic deployments) can inject a
slow or failing sink as a constructor argument instead of patching globals. The
default :class:`ParquetSink` writes ``.part-<n>.parquet.tmp`` and renames it into place,
so a reader never observes a partially written Parquet file. Every data page carries a
CRC32 checksum, which readers verify, so a flipped byte is an error instead of a
silently different number.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from esper.telemetry.paths import tmp_path_for

#: Compacted files are kept, so they get zstd (small); the short-lived per-flush parts
#: get lz4, which costs ~1/3 of zstd per tiny file and keeps the writer thread's share
#: of the CPU (and the GIL) small while training runs.
COMPRESSION: Final = "zstd"
PART_COMPRESSION: Final = "lz4"
#: Rows per row group when compacting (bounded memory, efficient scans).
COMPACT_ROW_GROUP_ROWS: Final = 131_072


class PartSink(Protocol):
    def write_table(self, table: pa.Table, path: Path) -> int:
        """Write ``table`` as a complete file at ``path``; return its size in bytes."""
        ...

    def write_tables(self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path) -> int:
        """Stream ``tables`` (same schema) into one complete file at ``path``."""
        ...

    def remove(self, path: Path) -> None:
        """Delete a file that a compaction has superseded."""
        ...


class ParquetSink:
    """Atomic Parquet files (tmp + ``os.replace``): lz4 parts, zstd compacted files."""

    def write_table(self, table: pa.Table, path: Path) -> int:
        return self._write([table], table.schema, path, PART_COMPRESSION)

    def write_tables(self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path) -> int:
        return self._write(tables, schema, path, COMPRESSION)

    def _write(
        self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path, compression: str
    ) -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_path_for(path)
        try:
            with pq.ParquetWriter(
                tmp, schema, compression=compression, write_page_checksum=True
            ) as writer:
                for table in tables:
                    writer.write_table(table, row_group_size=COMPACT_ROW_GROUP_ROWS)
            size = tmp.stat().st_size
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return size

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)
