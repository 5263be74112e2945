"""Every event type survives emit -> writer -> Parquet -> polars unchanged."""

from __future__ import annotations

import itertools
import math
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from _telemetry_support import (
    as_row,
    edge_event,
    event_strategy,
    minimal_event,
    read_all,
    read_type,
    rows_equal,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.core.enums import TelemetryLevel
from esper.telemetry.arrow_schema import (
    META_EVENT_TYPE,
    META_SCHEMA_VERSION,
    event_schema,
)
from esper.telemetry.events import EVENT_TYPES, SCHEMA_VERSION, Event
from esper.telemetry.hub import open_run
from esper.telemetry.manifest import read_manifest
from esper.telemetry.paths import manifest_path
from esper.telemetry.sink import DELTA_COLUMNS

ONE_OF_EACH = st.tuples(*(event_strategy(EVENT_TYPES[tag]) for tag in sorted(EVENT_TYPES)))


@settings(max_examples=25)
@given(batches=st.lists(ONE_OF_EACH, min_size=1, max_size=3))
def test_every_event_type_round_trips(batches: list[tuple[Event, ...]]) -> None:
    emitted = list(itertools.chain.from_iterable(batches))
    with tempfile.TemporaryDirectory() as tmp:
        hub = open_run(tmp, "rt", level=TelemetryLevel.DEBUG, flush_interval_s=0.05)
        with hub:
            for event in emitted:
                hub.emit(event)
        assert hub.run_dir is not None
        rows = read_all(hub.run_dir)

    by_type: dict[str, list[Event]] = {}
    for event in emitted:
        by_type.setdefault(event.__struct_config__.tag, []).append(event)  # type: ignore[arg-type]
    # The hub's final writer_stats event is also on disk.
    assert set(rows) == set(EVENT_TYPES)
    for tag, events in by_type.items():
        got = rows[tag] if tag != "writer_stats" else rows[tag][: len(events)]
        assert len(got) == len(events), tag
        for event, row in zip(events, got, strict=True):
            assert event.run_id == "rt" and event.seq >= 0 and event.ts_ns > 0
            assert rows_equal(as_row(event), row) == [], (tag, as_row(event), row)


def test_columns_types_and_metadata_follow_the_struct(tmp_path: Path) -> None:
    with open_run(tmp_path, "meta", level=TelemetryLevel.DEBUG) as hub:
        for cls in EVENT_TYPES.values():
            hub.emit(minimal_event(cls))
    assert hub.run_dir is not None
    for tag, cls in EVENT_TYPES.items():
        files = sorted((hub.run_dir / "events" / f"type={tag}" / "rank=0").glob("part-*.parquet"))
        assert len(files) == 1, tag  # compacted on close
        schema = pq.read_schema(files[0])
        assert schema.metadata[META_SCHEMA_VERSION] == str(SCHEMA_VERSION).encode()
        assert schema.metadata[META_EVENT_TYPE] == tag.encode()
        assert schema.remove_metadata() == event_schema(cls).remove_metadata()
        assert schema.names[:7] == ["run_id", "seq", "ts_ns", "rank", "round", "env", "step"]
        assert "type" not in schema.names
        meta = pq.read_metadata(files[0])
        assert meta.row_group(0).column(0).compression == "ZSTD"
        encodings = {
            meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i).encodings
            for i in range(meta.num_columns)
        }
        for name in DELTA_COLUMNS:
            assert "DELTA_BINARY_PACKED" in encodings[name], (tag, name, encodings[name])


def test_delta_encoded_envelope_reads_back_exactly(tmp_path: Path) -> None:
    """Consecutive seqs (runs of equal deltas: bit-width-0 miniblocks) and growing
    timestamps survive the delta encoding of compacted files, read by polars."""
    cls = EVENT_TYPES["env_step"]
    with open_run(tmp_path, "delta", level=TelemetryLevel.NORMAL) as hub:
        for i in range(3000):
            hub.emit(minimal_event(cls, step=i))
    assert hub.run_dir is not None
    rows = read_type(hub.run_dir, "env_step")
    seqs = [r["seq"] for r in rows]
    stamps = [r["ts_ns"] for r in rows]
    assert seqs == list(range(3000)) and [r["step"] for r in rows] == list(range(3000))
    assert stamps == sorted(stamps) and stamps[0] > 0


def test_writer_stats_reports_what_was_written(tmp_path: Path) -> None:
    with open_run(tmp_path, "ws", level=TelemetryLevel.NORMAL) as hub:
        for i in range(10):
            hub.emit(minimal_event(EVENT_TYPES["env_step"], step=i))
    assert hub.run_dir is not None
    (stats,) = read_type(hub.run_dir, "writer_stats")
    assert stats["events_written"] == 10
    assert stats["seq"] == 10 and stats["flushes"] >= 1
    assert stats["dropped"] == 0 and stats["blocked_emits"] == 0
    # The event reports the counters as the close began; the files the close writes
    # (its merged files) are in the final manifest's.
    final = read_manifest(manifest_path(hub.run_dir, 0)).writer
    assert 0 <= stats["bytes_written"] < final.bytes_written
    assert final.bytes_written > sum(p.stat().st_size for p in hub.run_dir.rglob("*.parquet"))


def test_edge_values_round_trip_exactly(tmp_path: Path) -> None:
    """NaN, infinities, -0.0, subnormals, empty and non-ASCII strings, 2**62, empty lists."""
    emitted = [edge_event(cls, v) for v in range(6) for cls in EVENT_TYPES.values()]
    with open_run(tmp_path, "edge", level=TelemetryLevel.DEBUG) as hub:
        for event in emitted:
            hub.emit(event)
    assert hub.run_dir is not None
    rows = read_all(hub.run_dir)
    for tag, cls in EVENT_TYPES.items():
        events = [e for e in emitted if type(e) is cls]
        got = rows[tag][: len(events)]
        for event, row in zip(events, got, strict=True):
            assert rows_equal(as_row(event), row) == [], (tag, as_row(event), row)
            for name, value in as_row(event).items():
                if isinstance(value, float) and value == 0.0:
                    assert math.copysign(1.0, value) == math.copysign(1.0, row[name])


def test_manifest_counts_the_writers_cpu_time(tmp_path: Path) -> None:
    with open_run(tmp_path, "cpu", level=TelemetryLevel.NORMAL) as hub:
        for i in range(100):
            hub.emit(minimal_event(EVENT_TYPES["env_step"], step=i))
    assert hub.run_dir is not None
    assert read_manifest(manifest_path(hub.run_dir, 0)).writer.cpu_ns > 0
