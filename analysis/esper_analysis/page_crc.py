"""Verify Parquet page checksums from the raw bytes, without decoding any page.

Parquet stores an optional CRC32 of each page's on-disk bytes (header excluded) in the
page header. pyarrow verifies it only while decoding the page, which costs as much as
reading the whole file; checking it here costs one ``zlib.crc32`` per page plus the
parse of a few dozen bytes of Thrift header, so a loader can verify every file of a
large run before analysing it.

The page header is Thrift's compact protocol. Only ``compressed_page_size`` (field 3)
and ``crc`` (field 4) are read; every other field, nested statistics included, is
skipped generically.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Final, NamedTuple

import pyarrow.parquet as pq

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


class PageChecksumError(ValueError):
    """A page's bytes do not match its CRC32, or its header does not parse."""


class _Reader:
    """A cursor over a bytes buffer with the compact protocol's primitives."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise PageChecksumError("page header runs past the column chunk")
        value = self.buf[self.pos]
        self.pos += 1
        return value

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, kind: int) -> None:
        if kind in (_BOOL_TRUE, _BOOL_FALSE):
            return
        if kind == _BYTE:
            self.pos += 1
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.pos += _DOUBLE_BYTES
        elif kind == _BINARY:
            length = self.varint()  # read first: ``self.pos += self.varint()`` loses it
            self.pos += length
        elif kind in (_LIST, _SET):
            head = self.byte()
            size = head >> 4 if head >> 4 != _LONG_FORM else self.varint()
            for _ in range(size):
                self._skip_element(head & 0x0F)
        elif kind == _MAP:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self._skip_element(types >> 4)
                    self._skip_element(types & 0x0F)
        elif kind == _STRUCT:
            self.struct_fields(lambda _fid, k: self.skip(k))
        else:
            raise PageChecksumError(f"page header has an unknown Thrift type {kind}")

    def _skip_element(self, kind: int) -> None:
        # Inside lists, sets and maps a boolean takes a whole byte.
        if kind in (_BOOL_TRUE, _BOOL_FALSE):
            self.pos += 1
        else:
            self.skip(kind)

    def struct_fields(self, visit: Callable[[int, int], None]) -> None:
        """Call ``visit(field_id, type)`` for each field up to STOP; it must consume it."""
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.zigzag()
            visit(last, kind)


class _Page(NamedTuple):
    header_bytes: int
    uncompressed: int
    compressed: int
    crc: int | None
    values: int  # rows of a data page (0 for dictionary and index pages)


def _page_header(reader: _Reader) -> _Page:
    """The fields of the page header at the cursor that a check needs."""
    start = reader.pos
    found: dict[int, int] = {}
    values = 0

    def visit_data_header(field_id: int, kind: int) -> None:
        nonlocal values
        if field_id == _NUM_VALUES and kind == _I32:
            values = reader.zigzag()
        else:
            reader.skip(kind)

    def visit(field_id: int, kind: int) -> None:
        if field_id in (_UNCOMPRESSED_SIZE, _COMPRESSED_SIZE, _CRC) and kind == _I32:
            found[field_id] = reader.zigzag()
        elif field_id in _DATA_PAGE_HEADERS and kind == _STRUCT:
            reader.struct_fields(visit_data_header)
        else:
            reader.skip(kind)

    reader.struct_fields(visit)
    if _COMPRESSED_SIZE not in found or _UNCOMPRESSED_SIZE not in found:
        raise PageChecksumError("page header without its sizes")
    return _Page(
        header_bytes=reader.pos - start,
        uncompressed=found[_UNCOMPRESSED_SIZE],
        compressed=found[_COMPRESSED_SIZE],
        crc=found.get(_CRC),
        values=values,
    )


def _chunk_ranges(meta: pq.FileMetaData) -> list[tuple[int, int, int, int]]:
    """(offset, length, uncompressed length, values) of every column chunk's pages."""
    ranges = []
    for group in range(meta.num_row_groups):
        rg = meta.row_group(group)
        for column in range(rg.num_columns):
            chunk = rg.column(column)
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset:
                start = min(start, chunk.dictionary_page_offset)
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
    with path.open("rb") as fh:
        for start, length, uncompressed, values in _chunk_ranges(meta):
            fh.seek(start)
            buf = fh.read(length)
            if len(buf) != length:
                raise PageChecksumError(f"column chunk at byte {start} is truncated")
            if not _verify_chunk(buf, start, uncompressed, values):
                return False
    return True


def _verify_chunk(buf: bytes, start: int, uncompressed: int, values: int) -> bool:
    """Check one column chunk's pages; False if a page has no CRC.

    Besides each page's CRC, the page headers must add up to the footer's sizes and
    value count, so a damaged header is caught too (the CRC does not cover it).
    """
    reader, view = _Reader(buf, 0), memoryview(buf)
    seen_uncompressed = seen_values = 0
    while reader.pos < len(buf):
        page = _page_header(reader)
        if page.crc is None:
            return False
        end = reader.pos + page.compressed
        if end > len(buf) or zlib.crc32(view[reader.pos : end]) != page.crc & _U32:
            raise PageChecksumError(f"page at byte {start + reader.pos} fails its CRC32 check")
        reader.pos = end
        seen_uncompressed += page.header_bytes + page.uncompressed
        seen_values += page.values
    if (seen_uncompressed, seen_values) != (uncompressed, values):
        raise PageChecksumError(
            f"page headers of the column chunk at byte {start} disagree with the footer"
        )
    return True
