"""A burst is converted at once but held unwritten: written within the flush interval,
on a flush, or merged straight into the final files at close (encoded once).

The writer drains its buffer whenever it fills, so a buffer of :data:`DIRECT_EVENTS`
events makes every drain of these tests a burst.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _telemetry_support import (
    FAST_FLUSH_S,
    all_seqs,
    minimal_event,
    mixed_step,
    read_type,
    wait_for,
)

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import TelemetryHub, open_run
from esper.telemetry.journal import JOURNAL_DIR, journal_parts
from esper.telemetry.manifest import read_manifest
from esper.telemetry.paths import manifest_path
from esper.telemetry.sink import ParquetSink
from esper.telemetry.writer import (
    DIRECT_EVENTS,
    FINAL_ROWS,
    MAX_FINAL_FILES,
    TelemetryWriteError,
)

#: Long enough that a hold never comes due during a test (half of half of it).
SLOW_FLUSH_S = 600.0
BURST = 3 * DIRECT_EVENTS


class Recording(ParquetSink):
    """Counts typed part writes (journal parts aside) and merged-file writes."""

    def __init__(self) -> None:
        self.part_writes = 0
        self.merged_writes = 0

    def write_table(self, table: pa.Table, path: Path) -> int:
        self.part_writes += JOURNAL_DIR not in path.parts
        return super().write_table(table, path)

    def write_tables(self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path) -> int:
        self.merged_writes += 1
        return super().write_tables(tables, schema, path)


def _burst_hub(tmp_path: Path, name: str, sink: ParquetSink, flush_s: float) -> TelemetryHub:
    hub = open_run(
        tmp_path,
        name,
        level=TelemetryLevel.NORMAL,
        flush_interval_s=flush_s,
        queue_capacity=DIRECT_EVENTS,
        sink=sink,
    )
    assert isinstance(hub, TelemetryHub) and hub.run_dir is not None
    return hub


def _emit_burst(hub: TelemetryHub, steps: int) -> None:
    """``mixed_step(i)`` for every step below ``steps`` (built from one set of events:
    building each from scratch costs more than the writer)."""
    templates = mixed_step(0)
    replace = msgspec.structs.replace
    for i in range(steps):
        for template in templates:
            hub.emit(replace(template, step=i))


def _on_disk(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "events").rglob("*.parquet")) if (run_dir / "events").exists() else []


def test_a_burst_is_encoded_once_at_close(tmp_path: Path) -> None:
    sink = Recording()
    hub = _burst_hub(tmp_path, "once", sink, SLOW_FLUSH_S)
    run_dir = hub.run_dir
    assert run_dir is not None
    _emit_burst(hub, BURST // 3)
    # Drained (the buffer filled, again and again) but held: nothing on disk yet, and
    # the manifest on disk counts nothing it could not show.
    wait_for(lambda: hub.manifest_counters.events_written >= BURST - DIRECT_EVENTS, "drains")
    assert _on_disk(run_dir) == [] and journal_parts(run_dir, 0) == []
    on_disk = read_manifest(manifest_path(run_dir, 0))
    assert on_disk.counts == {} and on_disk.last_seq == -1
    hub.close()
    assert sink.part_writes == 0  # never an lz4 part: straight into the merged files
    assert sink.merged_writes == len(_on_disk(run_dir)) == 4  # 3 types + writer_stats
    assert [r["step"] for r in read_type(run_dir, "reward_computed")] == list(range(BURST // 3))
    manifest = read_manifest(manifest_path(run_dir, 0))
    assert manifest.counts["env_step"] == manifest.counts["action_taken"] == BURST // 3
    assert sorted(all_seqs(run_dir)) == list(range(manifest.last_seq + 1))
    assert manifest.last_seq == BURST  # + the writer_stats event emitted at close


def test_a_held_burst_becomes_durable_without_a_flush(tmp_path: Path) -> None:
    hub = _burst_hub(tmp_path, "due", Recording(), FAST_FLUSH_S)
    run_dir = hub.run_dir
    assert run_dir is not None
    _emit_burst(hub, BURST // 3)
    # Written by the writer's own wakes (the hold comes due), with no flush asked for.
    wait_for(
        lambda: sum(read_manifest(manifest_path(run_dir, 0)).counts.values()) == BURST,
        "the held burst's parts",
    )
    assert sorted(all_seqs(run_dir)) == list(range(BURST))
    hub.close()
    assert sorted(all_seqs(run_dir)) == list(range(BURST + 1))


@pytest.mark.parametrize("typed", [True, False])
def test_a_flush_writes_the_held_burst(tmp_path: Path, typed: bool) -> None:
    sink = Recording()
    hub = _burst_hub(tmp_path, "flushed", sink, SLOW_FLUSH_S)
    run_dir = hub.run_dir
    assert run_dir is not None
    _emit_burst(hub, BURST // 3)
    hub.flush(typed=typed)  # a checkpoint's durability flush writes it as well
    assert sink.part_writes == 3 and journal_parts(run_dir, 0) == []
    manifest = read_manifest(manifest_path(run_dir, 0))
    assert sum(manifest.counts.values()) == BURST and manifest.last_seq == BURST - 1
    assert sorted(all_seqs(run_dir)) == list(range(BURST))
    hub.close()


class MergeFailSink(ParquetSink):
    """Journal and typed parts are written; the close's merged files fail (disk full)."""

    def write_tables(self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))


def test_a_failed_close_keeps_every_journalled_event(tmp_path: Path) -> None:
    """Journalled events stay in the journal until the merged files that hold them land:
    a close that fails loses only the burst held since the last flush."""
    hub = open_run(
        tmp_path,
        "kept",
        level=TelemetryLevel.NORMAL,
        flush_interval_s=SLOW_FLUSH_S,
        queue_capacity=DIRECT_EVENTS,
        sink=MergeFailSink(),
    )
    assert isinstance(hub, TelemetryHub) and hub.run_dir is not None
    run_dir = hub.run_dir
    for i in range(4):
        for event in mixed_step(i):
            hub.emit(event)
    hub.flush(typed=False)  # 12 events, durable in the journal
    assert len(journal_parts(run_dir, 0)) == 1
    for i in range(4, 4 + BURST // 3):  # then a burst, held
        for event in mixed_step(i):
            hub.emit(event)
    with pytest.raises(TelemetryWriteError, match="No space left"):
        hub.close()
    assert journal_parts(run_dir, 0)
    manifest = read_manifest(manifest_path(run_dir, 0))
    assert manifest.status == RunStatus.FAILED.value
    assert sum(manifest.counts.values()) == 12 and manifest.last_seq == 11
    assert [r["step"] for r in read_type(run_dir, "env_step")] == [0, 1, 2, 3]


def test_a_burst_after_journalled_events_keeps_seq_order(tmp_path: Path) -> None:
    hub = open_run(
        tmp_path,
        "order",
        level=TelemetryLevel.NORMAL,
        flush_interval_s=FAST_FLUSH_S,
        queue_capacity=DIRECT_EVENTS,
    )
    assert isinstance(hub, TelemetryHub) and hub.run_dir is not None
    run_dir = hub.run_dir
    for i in range(3):  # journalled, one flush each
        for event in mixed_step(i):
            hub.emit(event)
        wait_for(lambda i=i: hub.manifest_counters.events_written == 3 * (i + 1), "a flush")
    assert journal_parts(run_dir, 0)
    for i in range(3, 3 + BURST // 3):
        for event in mixed_step(i):
            hub.emit(event)
    hub.emit(minimal_event(ev.EnvStep, step=10**6))  # a small batch after the burst
    hub.close()
    assert journal_parts(run_dir, 0) == []
    steps = [r["step"] for r in read_type(run_dir, "env_step")]
    assert steps == [*range(3 + BURST // 3), 10**6]
    assert sorted(all_seqs(run_dir)) == list(range(BURST + 9 + 2))


def test_a_large_held_burst_goes_straight_into_compacted_files(tmp_path: Path) -> None:
    """A type with FINAL_ROWS events to write is merged at once into a zstd file (never
    an lz4 part merged again); the close adds one more file per type and rewrites none."""
    sink = Recording()
    hub = _burst_hub(tmp_path, "large", sink, SLOW_FLUSH_S)
    run_dir = hub.run_dir
    assert run_dir is not None
    _emit_burst(hub, FINAL_ROWS)
    hub.flush()
    assert sink.part_writes == 0 and sink.merged_writes == 3
    first = _on_disk(run_dir)
    assert len(first) == 3
    for path in first:
        assert pq.read_metadata(path).row_group(0).column(0).compression == "ZSTD"
    manifest = read_manifest(manifest_path(run_dir, 0))
    assert sum(manifest.counts.values()) == 3 * FINAL_ROWS
    assert manifest.last_seq == 3 * FINAL_ROWS - 1 and manifest.pending_compactions == []
    mtimes = {p: p.stat().st_mtime_ns for p in first}
    _emit_burst(hub, 10)
    hub.close()
    assert {p: p.stat().st_mtime_ns for p in first} == mtimes  # kept as written
    assert len(_on_disk(run_dir)) == 3 + 4  # + one per type, and writer_stats
    steps = [r["step"] for r in read_type(run_dir, "env_step")]
    assert steps == [*range(FINAL_ROWS), *range(10)]
    assert sorted(all_seqs(run_dir)) == list(range(3 * FINAL_ROWS + 30 + 1))


def test_files_written_straight_from_holds_are_capped_per_type(tmp_path: Path) -> None:
    """Past MAX_FINAL_FILES such files of a type, its holds become lz4 parts again (merged
    later), so a sustained burst cannot add a file per hold for ever."""
    sink = Recording()
    hub = _burst_hub(tmp_path, "capped", sink, SLOW_FLUSH_S)
    run_dir = hub.run_dir
    assert run_dir is not None
    template = minimal_event(ev.EnvStep)
    step = 0
    for _ in range(MAX_FINAL_FILES + 1):
        for _ in range(FINAL_ROWS):
            hub.emit(msgspec.structs.replace(template, step=step))
            step += 1
        hub.flush()
    assert sink.merged_writes == MAX_FINAL_FILES and sink.part_writes == 1
    hub.close()
    assert [r["step"] for r in read_type(run_dir, "env_step")] == list(range(step))
