"""Parquet page checksums: written on every part and compacted file, verified when merged.

Without them a damaged part is decoded into different numbers and a compaction (or the
tail cut of a resume) would bake those into a fresh file with a valid footer.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _telemetry_support import bare_manifest

from esper.telemetry.compaction import compact_parts
from esper.telemetry.sink import ParquetSink

ROWS = 4000
SCRIBBLE_BYTES = 64
TRIALS = 10
TRAILER = 8  # footer length + "PAR1"


def _table(offset: int) -> pa.Table:
    rng = random.Random(offset)
    return pa.table(
        {
            "seq": pa.array(range(offset, offset + ROWS), pa.int64()),
            "value": pa.array([rng.random() for _ in range(ROWS)], pa.float64()),
        }
    )


def _scribble(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    footer = pq.read_metadata(path).serialized_size + TRAILER
    start = rng.randrange(4, len(data) - footer - SCRIBBLE_BYTES)
    data[start : start + SCRIBBLE_BYTES] = rng.randbytes(SCRIBBLE_BYTES)
    path.write_bytes(bytes(data))


def test_a_damaged_part_is_never_merged(tmp_path: Path) -> None:
    sink = ParquetSink()
    good = tmp_path / "good.parquet"
    clean = tmp_path / "clean.parquet"
    sink.write_table(_table(0), good)
    sink.write_table(_table(ROWS), clean)
    for trial in range(TRIALS):
        damaged = tmp_path / f"damaged-{trial}.parquet"
        shutil.copy(clean, damaged)
        _scribble(damaged, random.Random(trial))
        output = tmp_path / f"merged-{trial}.parquet"
        with pytest.raises(OSError):
            compact_parts(
                sink=sink,
                manifest=bare_manifest("r"),
                save=lambda _m: None,
                event_type="env_step",
                inputs=[good, damaged],
                output=output,
                schema=_table(0).schema,
            )
        assert not output.exists(), f"trial {trial}: damaged data merged into {output.name}"
        assert damaged.exists() and good.exists()  # inputs kept for inspection


def test_compacted_files_carry_checksums_too(tmp_path: Path) -> None:
    sink = ParquetSink()
    merged = tmp_path / "merged.parquet"
    sink.write_tables([_table(0), _table(ROWS)], _table(0).schema, merged)
    for trial in range(TRIALS):
        copy = tmp_path / f"copy-{trial}.parquet"
        shutil.copy(merged, copy)
        _scribble(copy, random.Random(100 + trial))
        with pytest.raises(OSError):
            pq.read_table(copy, page_checksum_verification=True)


def test_merge_from_held_tables_writes_what_a_merge_from_files_writes(tmp_path: Path) -> None:
    sink = ParquetSink()
    tables = [_table(0), _table(ROWS), _table(2 * ROWS)]
    outputs = {}
    for held in (False, True):
        inputs = [tmp_path / f"{held}-{i}.parquet" for i in range(len(tables))]
        for table, path in zip(tables, inputs, strict=True):
            sink.write_table(table, path)
        outputs[held] = tmp_path / f"merged-{held}.parquet"
        compact_parts(
            sink=sink,
            manifest=bare_manifest("r"),
            save=lambda _m: None,
            event_type="env_step",
            inputs=inputs,
            output=outputs[held],
            schema=tables[0].schema,
            contents=tables if held else None,
        )
        assert not any(p.exists() for p in inputs)
    assert pq.read_table(outputs[True]).equals(pq.read_table(outputs[False]))
    assert pq.read_table(outputs[True]).num_rows == len(tables) * ROWS
    with pytest.raises(ValueError, match="2 tables given for 1 parts"):
        compact_parts(
            sink=sink,
            manifest=bare_manifest("r"),
            save=lambda _m: None,
            event_type="env_step",
            inputs=[outputs[True]],
            output=tmp_path / "never.parquet",
            schema=tables[0].schema,
            contents=tables[:2],
        )
