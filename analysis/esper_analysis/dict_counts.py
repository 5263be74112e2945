"""Histograms of dictionary-encoded integer columns, counted from their pages' indices.

The event counts histogram ``round``, ``env`` and ``step`` of every event: read as
columns, that is 8 bytes per row and column decoded into fresh memory (a 10M-event run:
240 MB, whose page faults alone cost more than the counting). The writer stores those
columns dictionary-encoded (:data:`esper.telemetry.sink.DICTIONARY_INTEGERS`): each page
holds runs of dictionary indices, and a histogram needs only how often each index
occurs. Here each column chunk's pages are decompressed, their runs counted natively
(``_rle.c``: an RLE run adds its length at once) and the counts mapped through the
dictionary; no value is decoded per row.

:func:`dictionary_histograms` returns None wherever that cannot be done exactly, and
the caller reads the columns instead: without the native module, for in-memory
journal parts or parts that need deduplication, for a column that is not a flat
integer column, a codec pyarrow cannot decompress, or a page that is not
dictionary-encoded (a writer falls back to plain pages when a dictionary grows large).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from esper.core.native import load_native
from esper_analysis.loader import Run
from esper_analysis.page_crc import map_file, parse_struct

#: The native run counter, or None where not built or turned off.
_native = load_native("esper_analysis._rle")
#: Parquet codec names -> pyarrow's (Parquet's old framed "LZ4" is not pyarrow's "lz4").
_CODECS: Final = {
    "ZSTD": "zstd",
    "SNAPPY": "snappy",
    "GZIP": "gzip",
    "BROTLI": "brotli",
    "LZ4_RAW": "lz4_raw",
}
_DTYPES: Final[dict[str, np.dtype[np.signedinteger[Any]]]] = {
    "INT64": np.dtype("<i8"),
    "INT32": np.dtype("<i4"),
}
#: Page types and encodings (parquet.thrift).
_DATA_PAGE, _INDEX_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 1, 2, 3
_DICTIONARY_ENCODINGS: Final = frozenset({2, 8})  # PLAIN_DICTIONARY, RLE_DICTIONARY
_RLE: Final = 3
#: PageHeader fields: type, sizes, and the three kinds of page header.
_TYPE, _UNCOMPRESSED, _COMPRESSED = 1, 2, 3
_V1, _DICT, _V2 = 5, 7, 8
_LEVELS_LENGTH_BYTES: Final = 4
#: Values spanning at most this many more integers than there are values are counted
#: by one ``np.bincount`` over their offsets (else sorted).
_DENSE_SPAN: Final = 4096


class _Declined(Exception):
    """This column chunk cannot be counted from its indices (the caller reads it)."""


Histogram = tuple[np.ndarray, np.ndarray]


def dictionary_histograms(
    run: Run, event_type: str, columns: Sequence[str]
) -> tuple[dict[str, Histogram], int] | None:
    """(distinct values ascending, their counts) of each of ``columns`` over every row
    of ``event_type``, nulls left out, and the number of rows; None where the columns
    must be read instead (see the module doc). A column no file has counts nothing."""
    parts = run.files.get(event_type, [])
    if _native is None or run.needs_dedup(event_type) or any(p.table is not None for p in parts):
        return None
    found: dict[str, list[Histogram]] = {c: [] for c in columns}
    try:
        for part in parts:
            _count_file(part.path, columns, found)
    except _Declined:
        return None
    return {c: _merged(h) for c, h in found.items()}, sum(p.rows for p in parts)


def _count_file(path: Path, columns: Sequence[str], found: dict[str, list[Histogram]]) -> None:
    meta = pq.read_metadata(path)
    wanted = {}
    for i in range(meta.num_columns):
        column = meta.schema.column(i)
        if column.name in found:
            if (
                column.physical_type not in _DTYPES
                or column.max_repetition_level
                or column.max_definition_level > 1
            ):
                raise _Declined
            wanted[column.name] = (i, column)
    if not wanted:
        return
    data = map_file(path)
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        for name, (i, column) in wanted.items():
            chunk = row_group.column(i)
            if chunk.num_values:
                found[name].append(_count_chunk(data, chunk, column))


def _count_chunk(data: memoryview, chunk: Any, column: Any) -> Histogram:
    """(dictionary values, occurrences of each) of one column chunk."""
    codec = chunk.compression
    if codec != "UNCOMPRESSED" and (
        codec not in _CODECS or not pa.Codec.is_available(_CODECS[codec])
    ):
        raise _Declined
    starts = [o for o in (chunk.data_page_offset, chunk.dictionary_page_offset) if o]
    pos = min(starts, default=0)
    end = pos + chunk.total_compressed_size
    if not starts or end > len(data):
        raise _Declined
    values: np.ndarray | None = None
    counts = np.zeros(0, dtype=np.int64)
    while pos < end:
        header, pos = _struct(data, pos)
        size = header.get(_COMPRESSED, -1)
        if size < 0 or pos + size > end:
            raise _Declined
        payload, pos = data[pos : pos + size], pos + size
        kind = header.get(_TYPE)
        if kind == _DICTIONARY_PAGE:
            raw = _decompressed(payload, header[_UNCOMPRESSED], codec)
            entries = header.get(_DICT, {}).get(1, -1)
            dtype = _DTYPES[column.physical_type]
            if entries < 0 or entries * dtype.itemsize > len(raw):
                raise _Declined
            values = np.frombuffer(raw, dtype=dtype, count=entries).astype(np.int64)
            counts = np.zeros(entries, dtype=np.int64)
        elif kind in (_DATA_PAGE, _DATA_PAGE_V2):
            if values is None:
                raise _Declined
            _count_page(header, payload, codec, column.max_definition_level, counts)
        elif kind != _INDEX_PAGE:
            raise _Declined
    if values is None:
        raise _Declined
    return values, counts


def _count_page(
    header: dict[int, Any], payload: memoryview, codec: str, max_def: int, counts: np.ndarray
) -> None:
    """Adds one data page's dictionary indices to ``counts``."""
    assert _native is not None
    if header.get(_TYPE) == _DATA_PAGE:
        page = header.get(_V1, {})
        if page.get(2) not in _DICTIONARY_ENCODINGS:
            raise _Declined
        raw = memoryview(_decompressed(payload, header[_UNCOMPRESSED], codec))
        present, pos = page.get(1, 0), 0
        if max_def:
            if page.get(3) != _RLE or len(raw) < _LEVELS_LENGTH_BYTES:
                raise _Declined
            length = int.from_bytes(raw[:_LEVELS_LENGTH_BYTES], "little")
            pos = _LEVELS_LENGTH_BYTES + length
            present = _present(raw[_LEVELS_LENGTH_BYTES:pos], present)
    else:
        page = header.get(_V2, {})
        if page.get(4) not in _DICTIONARY_ENCODINGS:
            raise _Declined
        levels = page.get(5, 0) + page.get(6, 0)
        present = page.get(1, 0) - page.get(2, 0)
        body = payload[levels:]
        compressed = page.get(7, True)
        raw = memoryview(
            _decompressed(body, header[_UNCOMPRESSED] - levels, codec) if compressed else body
        )
        pos = 0
    if present <= 0:
        return
    if pos >= len(raw):
        raise _Declined
    try:
        _native.count_runs(raw[pos + 1 :], raw[pos], present, counts)
    except ValueError:
        raise _Declined from None


def _present(levels: memoryview, values: int) -> int:
    """Rows with a value among ``values`` definition levels (bit width 1)."""
    assert _native is not None
    defined = np.zeros(2, dtype=np.int64)
    try:
        _native.count_runs(levels, 1, values, defined)
    except ValueError:
        raise _Declined from None
    return int(defined[1])


@functools.cache
def _codec(codec: str) -> pa.Codec | None:
    """pyarrow's codec for a Parquet codec name, made once (None: not available)."""
    name = _CODECS.get(codec)
    return pa.Codec(name) if name and pa.Codec.is_available(name) else None


def _available(codec: str) -> bool:
    return codec == "UNCOMPRESSED" or _codec(codec) is not None


def _decompressed(payload: memoryview, size: int, codec: str) -> Any:
    if codec == "UNCOMPRESSED":
        return payload
    decompressor = _codec(codec)
    assert decompressor is not None
    try:
        return decompressor.decompress(payload, decompressed_size=size)
    except (pa.ArrowException, ValueError):
        raise _Declined from None


def _merged(parts: list[Histogram]) -> Histogram:
    """One histogram of many: distinct values ascending, present ones only."""
    if not parts:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    values = np.concatenate([v for v, _ in parts])
    counts = np.concatenate([c for _, c in parts])
    low, high = int(values.min()), int(values.max())
    if high - low <= len(values) + _DENSE_SPAN:  # small integers: one bincount
        totals = np.bincount(values - low, weights=counts).astype(np.int64)
        present = np.flatnonzero(totals)
        return present + low, totals[present]
    distinct, where = np.unique(values, return_inverse=True)
    totals = np.bincount(where, weights=counts, minlength=len(distinct)).astype(np.int64)
    kept = totals > 0
    return distinct[kept], totals[kept]


def _struct(buf: memoryview, pos: int) -> tuple[dict[int, Any], int]:
    """:func:`~esper_analysis.page_crc.parse_struct`; a header it cannot parse declines."""
    try:
        return parse_struct(buf, pos)
    except (IndexError, ValueError):
        raise _Declined from None
