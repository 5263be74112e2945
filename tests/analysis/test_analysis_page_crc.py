"""Page checksums verified from the raw bytes (esper_analysis.page_crc)."""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from esper_analysis import page_crc
from esper_analysis.integrity import DamagedPagesError, verify_pages
from esper_analysis.page_crc import PageChecksumError, _chunk_ranges, verify_page_checksums

FLIPS = 200


def _table(rows: int = 3_000) -> pa.Table:
    return pa.table(
        {
            "seq": pa.array(range(rows), pa.int64()),
            "loss": pa.array([i / 7 if i % 11 else float("nan") for i in range(rows)]),
            "op": pa.array([["WAIT", "GERMINATE", "PRUNE"][i % 3] for i in range(rows)]),
            "alphas": pa.array([[0.5, float(i)] for i in range(rows)], pa.list_(pa.float64())),
            "ok": pa.array([i % 2 == 0 for i in range(rows)]),
        }
    )


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_a_file_with_page_checksums_verifies(tmp_path: Path, version: str) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(
        _table(), path, write_page_checksum=True, data_page_version=version, row_group_size=1000
    )
    assert verify_page_checksums(path) is True


def test_an_empty_table_verifies(tmp_path: Path) -> None:
    """A 0-row row group has chunks with no data page (offset 0, the file's magic) and,
    for dictionary columns, only a dictionary page: nothing to misread as a header."""
    path = tmp_path / "empty.parquet"
    pq.write_table(_table(0), path, write_page_checksum=True, use_dictionary=True)
    meta = pq.read_metadata(path)
    assert meta.num_rows == 0 and meta.num_row_groups == 1
    chunks = [meta.row_group(0).column(i) for i in range(meta.num_columns)]
    assert any(c.data_page_offset == 0 and c.dictionary_page_offset for c in chunks)
    assert verify_page_checksums(path) is True
    verify_pages(path)  # the loader's check accepts it too (raises on damage)


def test_a_file_without_page_checksums_is_left_to_the_decoder(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(_table(), path)
    assert verify_page_checksums(path) is False
    verify_pages(path)  # decoded instead: a sound file passes


def _page_data_positions(path: Path) -> list[int]:
    """Byte offsets inside pages (after each page header), from a fresh parse."""
    from esper_analysis.page_crc import _page_header, _Reader

    data = path.read_bytes()
    positions: list[int] = []
    for start, length, _, _ in _chunk_ranges(pq.read_metadata(path)):
        reader = _Reader(data[start : start + length], 0)
        while reader.pos < length:
            page = _page_header(reader)
            positions.extend(range(start + reader.pos, start + reader.pos + page.compressed))
            reader.pos += page.compressed
    return positions


def test_every_flipped_bit_in_page_data_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(_table(), path, write_page_checksum=True, row_group_size=1000)
    good = path.read_bytes()
    meta = pq.read_metadata(path)
    rng = random.Random(0)
    positions = _page_data_positions(path)
    assert len(positions) > 1000
    bad = tmp_path / "bad.parquet"
    for pos in rng.sample(positions, FLIPS):
        data = bytearray(good)
        data[pos] ^= 1 << rng.randrange(8)
        bad.write_bytes(data)
        with pytest.raises(PageChecksumError):
            verify_page_checksums(bad, meta)
        with pytest.raises(DamagedPagesError):
            verify_pages(bad)


def test_a_header_that_disagrees_with_the_footer_is_caught(tmp_path: Path) -> None:
    """The CRC does not cover page headers; their value counts must add up to the footer."""
    path = tmp_path / "t.parquet"
    pq.write_table(_table(), path, write_page_checksum=True, row_group_size=1000)
    data = bytearray(path.read_bytes())
    start = pq.read_metadata(path).row_group(0).column(0).data_page_offset
    # PageHeader field 5 (a data page header struct: 0x1c) opens with its field 1, the
    # value count (i32: 0x15, then a zigzag varint); bit 1 of the varint's first byte
    # changes the count by one without changing its length.
    marker = data.index(b"\x1c\x15", start)
    data[marker + 2] ^= 0x02
    path.write_bytes(data)
    with pytest.raises(PageChecksumError, match="disagree with the footer"):
        verify_page_checksums(path)


def test_the_page_crc_is_zlibs_crc32() -> None:
    """The accelerated CRC32 (ISA-L where installed) is the checksum Parquet writes:
    zlib's, on empty, short, odd-length and multi-megabyte buffers and on slices."""
    rng = random.Random(7)
    blob = bytes(rng.getrandbits(8) for _ in range(1 << 16)) * 40
    for buf in (b"", b"a", blob[:1001], blob, memoryview(blob)[3:-5]):
        assert page_crc.crc32(buf) == zlib.crc32(buf)
