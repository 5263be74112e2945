"""Verify Parquet page checksums from the raw bytes, without decoding any page.

Parquet stores an optional CRC32 of each page's on-disk bytes (header excluded) in the
page header. pyarrow verifies it only while decoding the page, which costs as much as
reading the whole file; checking it here costs one CRC32 per page plus the
parse of a few dozen bytes of Thrift header, so a loader can verify every file of a
large run before analysing it.

The page header is Thrift's compact protocol. Only ``compressed_page_size`` (field 3)
and ``crc`` (field 4) are read; every other field, nested statistics included, is
skipped generically.

The CRC32 is ISA-L's (the ``isal`` package) where it is installed: the same checksum
as ``zlib.crc32``, about 3x faster on this workload (12 against 3.7 GB/s on the
project's 2-core CPU), and it too releases the GIL. Without it, ``zlib`` is used.
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, NamedTuple

import pyarrow.parquet as pq


def _fastest_crc32() -> Callable[[bytes | memoryview], int]:
    """ISA-L's CRC32 where the optional ``isal`` package is installed, else zlib's."""
    try:
        from isal.isal_zlib import crc32 as isal_crc32
    except ImportError:  # pragma: no cover - a dependency wherever it has wheels
        return zlib.crc32
    return isal_crc32


#: CRC32 of a buffer (standard polynomial, as ``zlib.crc32``).
crc32: Final = _fastest_crc32()

#: PageHeader field ids (5 and 8: data page header v1 / v2, whose field 1 is the value
#: count).
_UNCOMPRESSED_SIZE: Final = 2
_COMPRESSED_SIZE: Final = 3
_CRC: Final = 4
_DATA_PAGE_HEADERS: Final = (5, 8)
_NUM_VALUES: Final = 1
#: Compact-protocol type ids.
_BOOL_TRUE: Final = 1
_BOOL_FALSE: Final = 2
_BYTE: Final = 3
_I16: Final = 4
_I32: Final = 5
_I64: Final = 6
_DOUBLE: Final = 7
_BINARY: Final = 8
_LIST: Final = 9
_SET: Final = 10
_MAP: Final = 11
_STRUCT: Final = 12
_DOUBLE_BYTES: Final = 8
_LONG_FORM: Final = 15
_U32: Final = 0xFFFFFFFF
#: Compact-protocol types stored as one varint.
_VARINTS: Final = frozenset({_I16, _I32, _I64})
#: Top-level PageHeader fields read (the rest are skipped).
_SIZE_FIELDS: Final = frozenset({_UNCOMPRESSED_SIZE, _COMPRESSED_SIZE, _CRC})


class PageChecksumError(ValueError):
    """A page's bytes do not match its CRC32, or its header does not parse."""


class _Reader:
    """A cursor over a page header buffer (kept for callers that walk pages by hand)."""

    def __init__(self, buf: bytes | memoryview, pos: int) -> None:
        self.buf = buf
        self.pos = pos


class _Page(NamedTuple):
    header_bytes: int
    uncompressed: int
    compressed: int
    crc: int | None
    values: int  # rows of a data page (0 for dictionary and index pages)


# The parser below is a handful of flat functions over ``(buf, pos)`` rather than a
# cursor object: a large run has tens of thousands of page headers, and per-byte method
# calls made header parsing cost more than the CRCs themselves.


def varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def zigzag(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    n, pos = varint(buf, pos)
    return (n >> 1) ^ -(n & 1), pos


def skip_value(buf: bytes | memoryview, pos: int, kind: int) -> int:
    """Position after one value of compact-protocol type ``kind`` at ``pos``."""
    if kind in (_I16, _I32, _I64):
        while buf[pos] & 0x80:
            pos += 1
        return pos + 1
    if kind in (_BOOL_TRUE, _BOOL_FALSE):
        return pos
    if kind == _BINARY:
        length, pos = varint(buf, pos)
        return pos + length
    if kind == _STRUCT:
        return _skip_struct(buf, pos)
    if kind == _BYTE:
        return pos + 1
    if kind == _DOUBLE:
        return pos + _DOUBLE_BYTES
    if kind in (_LIST, _SET):
        head = buf[pos]
        pos += 1
        size = head >> 4
        if size == _LONG_FORM:
            size, pos = varint(buf, pos)
        for _ in range(size):
            pos = _skip_element(buf, pos, head & 0x0F)
        return pos
    if kind == _MAP:
        size, pos = varint(buf, pos)
        if size:
            types = buf[pos]
            pos += 1
            for _ in range(size):
                pos = _skip_element(buf, pos, types >> 4)
                pos = _skip_element(buf, pos, types & 0x0F)
        return pos
    raise PageChecksumError(f"page header has an unknown Thrift type {kind}")


def _skip_element(buf: bytes | memoryview, pos: int, kind: int) -> int:
    # Inside lists, sets and maps a boolean takes a whole byte.
    return pos + 1 if kind in (_BOOL_TRUE, _BOOL_FALSE) else skip_value(buf, pos, kind)


def _field(buf: bytes | memoryview, pos: int, last: int) -> tuple[int, int, int]:
    """(field id, type, position after the field header); type 0 is STOP."""
    head = buf[pos]
    pos += 1
    if head == 0:
        return 0, 0, pos
    delta, kind = head >> 4, head & 0x0F
    if delta:
        return last + delta, kind, pos
    field_id, pos = zigzag(buf, pos)
    return field_id, kind, pos


def parse_struct(buf: bytes | memoryview, pos: int) -> tuple[dict[int, Any], int]:
    """A compact-protocol struct at ``pos`` as ``{field id: value}`` (integers, booleans
    and nested structs; other fields skipped), and the position after it. Raises
    IndexError past the buffer's end and :class:`PageChecksumError` on an unknown type.
    (The checksum pass parses headers by hand, for speed; this is for the few callers
    that need more of a header than its sizes.)"""
    out: dict[int, Any] = {}
    field_id = 0
    while True:
        field_id, kind, pos = _field(buf, pos, field_id)
        if kind == 0:
            return out, pos
        if kind in _VARINTS:
            out[field_id], pos = zigzag(buf, pos)
        elif kind == _STRUCT:
            out[field_id], pos = parse_struct(buf, pos)
        elif kind in (_BOOL_TRUE, _BOOL_FALSE):
            out[field_id] = kind == _BOOL_TRUE
        else:
            pos = skip_value(buf, pos, kind)


def _skip_struct(buf: bytes | memoryview, pos: int) -> int:
    field_id = 0
    while True:
        field_id, kind, pos = _field(buf, pos, field_id)
        if kind == 0:
            return pos
        pos = skip_value(buf, pos, kind)


def _parse_page_header(buf: bytes | memoryview, start: int) -> tuple[_Page, int]:
    """The page header at ``start`` and the position of its page data.

    One flat loop over the header's fields, nested structs (the data page header and
    its statistics) tracked by depth rather than by recursive calls: a large run has
    tens of thousands of headers, and a call per field cost more than the CRCs.
    Rare field types (lists, maps, doubles) go through the generic :func:`_skip`.
    """
    pos = start
    sizes: dict[int, int] = {}
    values = field_id = depth = 0
    in_data_header = False
    parents: list[int] = []  # field ids of the enclosing structs
    try:
        while True:
            head = buf[pos]
            pos += 1
            if head == 0:  # STOP: the end of the header, or of a nested struct
                if depth == 0:
                    break
                depth -= 1
                field_id = parents.pop()
                continue
            kind = head & 0x0F
            if head >> 4:
                field_id += head >> 4
            else:
                field_id, pos = zigzag(buf, pos)
            if kind in _VARINTS:
                n, pos = varint(buf, pos)
                if kind == _I32 and depth == 0 and field_id in _SIZE_FIELDS:
                    sizes[field_id] = (n >> 1) ^ -(n & 1)
                elif kind == _I32 and depth == 1 and in_data_header and field_id == _NUM_VALUES:
                    values = (n >> 1) ^ -(n & 1)
            elif kind == _BINARY:
                length, pos = varint(buf, pos)
                pos += length
            elif kind == _STRUCT:
                if depth == 0:
                    in_data_header = field_id in _DATA_PAGE_HEADERS
                parents.append(field_id)
                depth += 1
                field_id = 0
            elif kind not in (_BOOL_TRUE, _BOOL_FALSE):
                pos = skip_value(buf, pos, kind)
    except IndexError:
        raise PageChecksumError("page header runs past the column chunk") from None
    if pos > len(buf):
        raise PageChecksumError("page header runs past the column chunk")
    if _COMPRESSED_SIZE not in sizes or _UNCOMPRESSED_SIZE not in sizes:
        raise PageChecksumError("page header without its sizes")
    page = _Page(
        header_bytes=pos - start,
        uncompressed=sizes[_UNCOMPRESSED_SIZE],
        compressed=sizes[_COMPRESSED_SIZE],
        crc=sizes.get(_CRC),
        values=values,
    )
    return page, pos


def _page_header(reader: _Reader) -> _Page:
    """The fields of the page header at the cursor that a check needs."""
    page, reader.pos = _parse_page_header(reader.buf, reader.pos)
    return page


def _chunk_ranges(meta: pq.FileMetaData) -> list[tuple[int, int, int, int]]:
    """(offset, length, uncompressed length, values) of every column chunk's pages."""
    ranges = []
    for group in range(meta.num_row_groups):
        rg = meta.row_group(group)
        for column in range(rg.num_columns):
            chunk = rg.column(column)
            # Offset 0 is the file's magic, never a page: a chunk of an empty row group
            # has no data page (offset 0) and at most a dictionary page.
            offsets = [chunk.data_page_offset]
            if chunk.has_dictionary_page:
                offsets.append(chunk.dictionary_page_offset)
            pages = [o for o in offsets if o]
            if not pages and not chunk.total_compressed_size:
                continue  # nothing written for this chunk
            start = min(pages, default=0)
            ranges.append(
                (
                    start,
                    chunk.total_compressed_size,
                    chunk.total_uncompressed_size,
                    chunk.num_values,
                )
            )
    return ranges


def verify_page_checksums(path: Path, meta: pq.FileMetaData | None = None) -> bool:
    """Check every page's CRC32; True if all pages carry one and match.

    Returns False, having checked nothing conclusive, as soon as a page without a CRC
    is found (a file written without page checksums: the caller must decode it to
    check it). Raises :class:`PageChecksumError` on a mismatch or a broken header.
    """
    meta = meta if meta is not None else pq.read_metadata(path)
    data = map_file(path)
    for start, length, uncompressed, values in _chunk_ranges(meta):
        if start < 0 or start + length > len(data):
            raise PageChecksumError(f"column chunk at byte {start} is truncated")
        if not _verify_chunk(data[start : start + length], start, uncompressed, values):
            return False
    return True


def map_file(path: Path) -> memoryview:
    """The file's bytes, memory-mapped read-only: the CRCs read the page cache in
    place, instead of copying a large run into fresh buffers first (which cost more
    than the CRCs). The map is closed when the last view of it is released, so an
    error raised mid-check (whose traceback holds a view) cannot fail to close it."""
    with path.open("rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            return memoryview(b"")
        return memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))


def _verify_chunk(buf: bytes | memoryview, start: int, uncompressed: int, values: int) -> bool:
    """Check one column chunk's pages; False if a page has no CRC.

    Besides each page's CRC, the page headers must add up to the footer's sizes and
    value count, so a damaged header is caught too (the CRC does not cover it).
    """
    view = memoryview(buf)
    pos = seen_uncompressed = seen_values = 0
    while pos < len(buf):
        page, pos = _parse_page_header(buf, pos)
        if page.crc is None:
            return False
        end = pos + page.compressed
        if end > len(buf) or crc32(view[pos:end]) != page.crc & _U32:
            raise PageChecksumError(f"page at byte {start + pos} fails its CRC32 check")
        pos = end
        seen_uncompressed += page.header_bytes + page.uncompressed
        seen_values += page.values
    if (seen_uncompressed, seen_values) != (uncompressed, values):
        raise PageChecksumError(
            f"page headers of the column chunk at byte {start} disagree with the footer"
        )
    return True
