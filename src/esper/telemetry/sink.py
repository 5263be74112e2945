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
import inspect
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from esper.telemetry.events import ENVELOPE_FIELDS
from esper.telemetry.paths import tmp_path_for

#: Compacted files are kept, so they get zstd (small); the short-lived parts (journal
#: parts, one per flush, and the typed parts made from them before their merge) get
#: lz4, which costs ~1/3 of zstd per tiny file and keeps the writer thread's share of
#: the CPU (and the GIL) small while training runs.
COMPRESSION: Final = "zstd"
PART_COMPRESSION: Final = "lz4"
#: zstd level of compacted files: 3 (zstd's own default) instead of Arrow's 1 made the
#: writer benchmark's files 15 % smaller at no extra cost (benchmarks/README.md,
#: "Native emit").
COMPRESSION_LEVEL: Final = 3
#: Short-lived parts are read back only by their merge (or after a crash): no column
#: statistics and no dictionaries, which cost per column and so make most of a tiny
#: file's price (0.63 ms instead of 0.79-0.87 per 8-event part; benchmarks/README.md,
#: "Writer").
PART_OPTIONS: Final[dict[str, Any]] = {
    "compression": PART_COMPRESSION,
    "use_dictionary": False,
    "write_statistics": False,
}
#: Rows per row group when compacting (bounded memory, efficient scans).
COMPACT_ROW_GROUP_ROWS: Final = 131_072
#: Rows per data page of a compacted file: a whole row group (pages still end at
#: pyarrow's 1 MiB size limit). pyarrow's default of 20,000 rows made seven pages per
#: column chunk, and readers verify every page's checksum, parsing its header in
#: Python: one page per chunk cut that check from 0.22 to 0.13 s on a 10M-event run,
#: and made the files cheaper to write (benchmarks/README.md, "Analysis").
COMPACT_PAGE_ROWS: Final = COMPACT_ROW_GROUP_ROWS
#: Envelope integers with few distinct values per row group: dictionary-encoded they
#: are smaller and no slower to read (other numbers rarely repeat: see below).
DICTIONARY_INTEGERS: Final = ("rank", "round", "env", "step")


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The string columns (and lists of strings), and :data:`DICTIONARY_INTEGERS`.

    Their values repeat (names of ops, stages, slots, blueprints; rounds, envs and
    steps), so a dictionary makes them small. Other numbers rarely repeat: trying a
    dictionary on them before falling back to plain encoding made compacted files
    larger (8.0 instead of 6.1 bytes per event) and slower to write (0.62 instead of
    0.49 us per event).
    """
    return [f.name for f in schema if _is_string(f.type) or f.name in DICTIONARY_INTEGERS]


#: Envelope integers that only grow within a file (``seq``; ``ts_ns`` nearly so):
#: stored as deltas, a few bits each, instead of 8 bytes that zstd cannot shrink much.
#: On the writer benchmark's mix: compacted files 3.5 instead of 5.4 bytes per event,
#: 20 % less CPU to write, and polars reads them faster (benchmarks/README.md,
#: "Native column converter"). Readers: polars 1.6+ (1.5 panics on runs of equal
#: deltas), pyarrow, DuckDB and Spark read this standard encoding.
DELTA_COLUMNS: Final = ("seq", "ts_ns")
DELTA_ENCODING: Final = "DELTA_BINARY_PACKED"


def delta_columns(schema: pa.Schema) -> dict[str, str]:
    """Column encodings of a compacted file: :data:`DELTA_COLUMNS` that ``schema`` has."""
    return {name: DELTA_ENCODING for name in DELTA_COLUMNS if name in schema.names}


#: Columns whose statistics (min, max, nulls) compacted files keep: the envelope, which
#: readers prune on (``seq`` ranges, rounds, ranks). Payload values are not ordered in a
#: file, so their min/max would prune nothing, and computing them cost about a fifth
#: of the encoding (benchmarks/README.md, "Native emit").
STATISTICS_COLUMNS: Final = ENVELOPE_FIELDS


def statistics_columns(schema: pa.Schema) -> list[str]:
    """The :data:`STATISTICS_COLUMNS` that ``schema`` has."""
    return [name for name in STATISTICS_COLUMNS if name in schema.names]


#: Whether this pyarrow's writer takes a page row limit (see :func:`compact_options`).
_TAKES_PAGE_ROWS: Final = "max_rows_per_page" in inspect.signature(pq.ParquetWriter).parameters


def compact_options(schema: pa.Schema) -> dict[str, Any]:
    """Parquet options of a compacted (kept) file of ``schema``; page checksums and the
    row group size are set where the file is written. The page row limit is passed
    only where pyarrow takes it (recent versions; this package accepts pyarrow 15 and
    up): without it the files are the same, with pyarrow's default page size."""
    options: dict[str, Any] = {
        "compression": COMPRESSION,
        "compression_level": COMPRESSION_LEVEL,
        "use_dictionary": dictionary_columns(schema),
        "column_encoding": delta_columns(schema),
        "write_statistics": statistics_columns(schema),
    }
    if _TAKES_PAGE_ROWS:
        options["max_rows_per_page"] = COMPACT_PAGE_ROWS
    return options


def _is_string(kind: pa.DataType) -> bool:
    if pa.types.is_list(kind):
        return _is_string(kind.value_type)
    return bool(pa.types.is_string(kind))


class PartSink(Protocol):
    """Where the writer's files go. A sink whose ``write_tables`` may run on several
    threads at once (different files) says so with a ``concurrent = True`` attribute;
    the close's merge then encodes its files in parallel."""

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
    """Atomic Parquet files (tmp + ``os.replace``): lz4 parts, zstd compacted files.

    ``concurrent``: ``write_tables`` may run on several threads at once (different
    files); a sink without the attribute gets one call at a time."""

    concurrent: bool = True

    def write_table(self, table: pa.Table, path: Path) -> int:
        return self._write([table], table.schema, path, PART_OPTIONS)

    def write_tables(self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path) -> int:
        return self._write(tables, schema, path, compact_options(schema))

    def _write(
        self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path, options: dict[str, Any]
    ) -> int:
        tmp = tmp_path_for(path)
        try:
            out = _open(tmp)
            # An OSFile spares pyarrow resolving a filesystem from the path on each file.
            with out, pq.ParquetWriter(out, schema, write_page_checksum=True, **options) as writer:
                for table in tables:
                    writer.write_table(table, row_group_size=COMPACT_ROW_GROUP_ROWS)
                writer.close()
                size = int(out.tell())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return size

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)


def _open(path: Path) -> pa.OSFile:
    """``path`` opened for writing; its directory is made on first use only (a
    ``mkdir`` per part was a measurable share of a small flush)."""
    try:
        return pa.OSFile(str(path), "wb")
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return pa.OSFile(str(path), "wb")
