"""Where the writer puts bytes: closed Parquet files, written atomically.

The writer talks to a :class:`PartSink` so tests (and exotic deployments) can inject a
slow or failing sink as a constructor argument instead of patching globals. The
default :class:`ParquetSink` writes ``.part-....parquet.tmp`` and renames it into
place, so no reader ever sees a partially written file. Every data page carries a CRC32
checksum, which readers verify (pyarrow's ``page_checksum_verification``), so a flipped
byte is an error instead of a silently different number.

Two kinds of file. A *part* holds one flush's events of one type: written uncompressed,
without dictionaries or statistics, because what a part costs is its fixed price (the
Parquet writer's setup, the file's creation and rename), and the settings that pay off
on many rows only add to it on a few. A *merged* file holds many parts' events and is
kept: zstd, dictionaries on the repeating columns, delta-encoded ``seq``/``ts_ns``,
statistics on the envelope, row groups of :data:`ROW_GROUP_ROWS`.

fsync. Renaming a closed file into place makes it survive a ``kill -9`` of the process
(the kernel has its bytes); surviving a power loss needs an fsync, which the writer
does at each explicit flush (the trainer's checkpoints), at the close and after a
resume's cut (:meth:`PartSink.sync`, :func:`fsync_files`), so a checkpoint
never points past events that are durable on the disk, and a closed run is durable as
a whole.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from esper.telemetry.events import ENVELOPE_FIELDS
from esper.telemetry.paths import tmp_path_for

#: Options of a part (one flush, one type): see the module docstring. A part's Parquet
#: schema says all a reader needs (the Arrow schema and the file metadata are on the
#: merged files, which the manifest's schema version describes as well).
PART_OPTIONS: Final[dict[str, Any]] = {
    "compression": "none",
    "use_dictionary": False,
    "write_statistics": False,
    "write_page_checksum": True,
    "store_schema": False,
}
#: zstd level of merged files: zstd's own default, smaller than Arrow's level 1 at no
#: measurable extra cost.
COMPRESSION_LEVEL: Final = 3
#: Rows per row group (and per data page, within pyarrow's 1 MiB page size) of a
#: merged file: bounded memory for readers, efficient scans.
ROW_GROUP_ROWS: Final = 131_072
#: Envelope integers with few distinct values per row group: dictionary-encoded they
#: are smaller and no slower to read (other numbers rarely repeat).
DICTIONARY_INTEGERS: Final = ("rank", "round", "env", "step")
#: Envelope integers that only grow within a file: stored as deltas, a few bits each.
#: Readers: polars 1.6+, pyarrow, DuckDB and Spark read this standard encoding.
DELTA_COLUMNS: Final = ("seq", "ts_ns")
DELTA_ENCODING: Final = "DELTA_BINARY_PACKED"
#: Whether this pyarrow's writer takes a page row limit (pyarrow 15 does not).
_TAKES_PAGE_ROWS: Final = "max_rows_per_page" in inspect.signature(pq.ParquetWriter).parameters


def _is_string(kind: pa.DataType) -> bool:
    if pa.types.is_list(kind):
        return _is_string(kind.value_type)
    return bool(pa.types.is_string(kind))


def merged_options(schema: pa.Schema) -> dict[str, Any]:
    """Parquet options of a merged (kept) file of ``schema``."""
    names = schema.names
    options: dict[str, Any] = {
        "compression": "zstd",
        "compression_level": COMPRESSION_LEVEL,
        "use_dictionary": [
            f.name for f in schema if _is_string(f.type) or f.name in DICTIONARY_INTEGERS
        ],
        "column_encoding": {n: DELTA_ENCODING for n in DELTA_COLUMNS if n in names},
        "write_statistics": [n for n in ENVELOPE_FIELDS if n in names],
        "write_page_checksum": True,
    }
    if _TAKES_PAGE_ROWS:
        options["max_rows_per_page"] = ROW_GROUP_ROWS
    return options


class PartSink(Protocol):
    """Where the writer's files go. ``concurrent = True`` (an attribute) says that
    ``write_merged`` may run on several threads at once (different files)."""

    def write_part(self, table: pa.Table, path: Path) -> int:
        """Write ``table`` as a complete part file at ``path``; return its size."""
        ...

    def write_merged(self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path) -> int:
        """Stream ``tables`` (same schema) into one merged file at ``path``."""
        ...

    def remove(self, path: Path) -> None:
        """Delete a file a merge has superseded."""
        ...

    def sync(self, files: Iterable[Path], new_dirs: Iterable[Path]) -> None:
        """Make ``files`` (and the entries of ``new_dirs``) durable: see :func:`fsync_files`."""
        ...


class ParquetSink:
    """Atomic Parquet files (tmp + ``os.replace``). ``write`` is the OS write a part's
    bytes go through (``os.write``; tests inject short writes): a short write is
    continued, an error is raised, so a part is never renamed into place short."""

    concurrent: bool = True
    _write: Callable[[int, memoryview], int] = staticmethod(os.write)

    def __init__(self, write: Callable[[int, memoryview], int] | None = None) -> None:
        if write is not None:
            self._write = write

    def write_part(self, table: pa.Table, path: Path) -> int:
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer, **PART_OPTIONS)
        data = buffer.getvalue()
        tmp = tmp_path_for(path)
        try:
            fd = _create(tmp)
            try:
                left = memoryview(data)
                while left:
                    written = self._write(fd, left)
                    if written <= 0:  # write(2) returns 0 only for an empty buffer
                        raise OSError(errno.EIO, f"write returned {written}", str(tmp))
                    left = left[written:]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return int(data.size)

    def write_merged(self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path) -> int:
        tmp = tmp_path_for(path)
        try:
            with (
                pa.OSFile(str(tmp), "wb") as out,
                pq.ParquetWriter(out, schema, **merged_options(schema)) as writer,
            ):
                for table in regrouped(tables):
                    writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
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

    def sync(self, files: Iterable[Path], new_dirs: Iterable[Path]) -> None:
        fsync_files(files, new_dirs)


def _create(path: Path) -> int:
    """``path`` created for writing; its directory is made on first use only."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags, 0o644)


def regrouped(tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
    """Small tables regrouped into row-group-sized ones (consumed lazily)."""
    pending: list[pa.Table] = []
    rows = 0
    for table in tables:
        pending.append(table)
        rows += table.num_rows
        if rows >= ROW_GROUP_ROWS:
            yield pa.concat_tables(pending)
            pending, rows = [], 0
    if pending:
        yield pa.concat_tables(pending)


def read_verified(path: Path, schema: pa.Schema | None = None) -> Iterator[pa.Table]:
    """A file's row groups in order, every page's checksum verified (a damaged part is
    never merged), cast to ``schema`` where given."""
    with pq.ParquetFile(path, page_checksum_verification=True) as parquet:
        for group in range(parquet.num_row_groups):
            table = parquet.read_row_group(group)
            yield table if schema is None else table.cast(schema)


#: Directory levels above a new directory that are fsynced with it (``rank=<r>``:
#: ``type=<t>`` and ``events``).
SYNCED_LEVELS: Final = 2


def fsync_files(files: Iterable[Path], new_dirs: Iterable[Path] = ()) -> None:
    """fsync each file that still exists, then the directories holding them and each
    new directory with the :data:`SYNCED_LEVELS` above it (their entries)."""
    directories: dict[Path, None] = {}
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # merged away since it was written
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        directories[path.parent] = None
    for new in new_dirs:
        directories.update(dict.fromkeys((new, *new.parents[:SYNCED_LEVELS])))
    for directory in directories:
        fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
