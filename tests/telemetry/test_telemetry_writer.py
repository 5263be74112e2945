"""Writer guarantees: back-pressure without loss, drops counted, errors surfaced, one
storage form (typed parts any Parquet reader sees), merges that bound the file count and
never lose, duplicate or re-encode damaged data."""

from __future__ import annotations

import errno
import random
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _telemetry_support import (
    SyncRecordingSink,
    all_seqs,
    live_files,
    minimal_event,
    read_type,
    wait_for,
)

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.events import EVENT_TYPES
from esper.telemetry.hub import TelemetryHub, open_run
from esper.telemetry.manifest import read_manifest
from esper.telemetry.paths import list_parts, manifest_path, type_rank_dir
from esper.telemetry.sink import ParquetSink, read_verified
from esper.telemetry.writer import MERGE_FANIN, TelemetryWriteError, merge_start, wake_period

WRITE_DELAY_S = 0.03
#: A day of writes at the default one-second flush interval, and the file count it must
#: stay under.
DAY_FLUSHES = round(24 * 3600 / wake_period(1.0))
MAX_FILES_PER_DAY = 5_000
TRAILER = 8  # Parquet footer length + "PAR1"


class SlowSink(ParquetSink):
    """A disk that takes WRITE_DELAY_S per part file."""

    def write_part(self, table: pa.Table, path: Path) -> int:
        time.sleep(WRITE_DELAY_S)
        return super().write_part(table, path)


class DiskFullSink(ParquetSink):
    """Fails with ENOSPC after ``ok_writes`` successful file writes (parts or merged)."""

    def __init__(self, ok_writes: int) -> None:
        self.ok_writes = ok_writes
        self._lock = threading.Lock()  # the close's merged files are written in parallel

    def _use_one(self, path: Path) -> None:
        with self._lock:
            if self.ok_writes <= 0:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            self.ok_writes -= 1

    def write_part(self, table: pa.Table, path: Path) -> int:
        self._use_one(path)
        return super().write_part(table, path)

    def write_merged(self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path) -> int:
        self._use_one(path)
        return super().write_merged(tables, schema, path)


class CrashBeforeDeleteSink(ParquetSink):
    """Writes a merged file, then 'dies' before deleting its inputs."""

    def remove(self, path: Path) -> None:
        raise RuntimeError("simulated crash between writing the merge and deleting inputs")


def _step(i: int) -> ev.Event:
    return minimal_event(ev.EnvStep, step=i)


def _scribble(path: Path, rng: random.Random, n: int = 64) -> None:
    """Overwrite ``n`` random bytes somewhere in the data pages (the footer stays)."""
    data = bytearray(path.read_bytes())
    footer = pq.read_metadata(path).serialized_size + TRAILER
    start = rng.randrange(4, len(data) - footer - n)
    data[start : start + n] = rng.randbytes(n)
    path.write_bytes(bytes(data))


def test_full_queue_blocks_loses_nothing_and_reports_blocked_time(tmp_path: Path) -> None:
    n = 2000
    hub = open_run(
        tmp_path, "slow", level=TelemetryLevel.NORMAL, queue_capacity=100, sink=SlowSink()
    )
    with hub:
        for i in range(n):
            hub.emit(_step(i))
    assert hub.run_dir is not None
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == list(range(n))
    (stats,) = read_type(hub.run_dir, "writer_stats")
    assert stats["blocked_emits"] > 0 and stats["blocked_ns"] >= WRITE_DELAY_S * 1e9
    assert stats["max_queue_depth"] == 100 and stats["dropped"] == 0
    manifest = read_manifest(manifest_path(hub.run_dir, 0))
    assert manifest.writer.blocked_ns >= stats["blocked_ns"]
    assert manifest.writer.blocked_emits >= stats["blocked_emits"]
    assert manifest.counts["env_step"] == n and manifest.status == "finished"


def test_drop_policy_counts_every_drop_and_keeps_seq_gapless(tmp_path: Path) -> None:
    n = 2000
    hub = open_run(
        tmp_path,
        "drop",
        level=TelemetryLevel.NORMAL,
        queue_capacity=50,
        drop_when_full=True,
        sink=SlowSink(),
    )
    with hub:
        for i in range(n):
            hub.emit(_step(i))
    assert hub.run_dir is not None
    written = read_type(hub.run_dir, "env_step")
    (stats,) = read_type(hub.run_dir, "writer_stats")
    assert stats["dropped"] > 0
    assert len(written) + stats["dropped"] == n
    assert read_manifest(manifest_path(hub.run_dir, 0)).writer.dropped == stats["dropped"]
    seqs = all_seqs(hub.run_dir)
    assert sorted(seqs) == list(range(len(seqs)))


def test_output_directory_turning_into_a_file_is_a_clear_error(tmp_path: Path) -> None:
    hub = open_run(tmp_path, "gone", level=TelemetryLevel.NORMAL, flush_interval_s=0.05)
    hub.emit(_step(0))
    hub.flush()
    assert hub.run_dir is not None
    events_dir = hub.run_dir / "events"
    shutil.rmtree(events_dir)
    events_dir.write_text("not a directory any more")
    with pytest.raises(TelemetryWriteError) as info:
        deadline = time.monotonic() + 10
        i = 1
        while time.monotonic() < deadline:  # the error reaches the next emit
            hub.emit(_step(i))
            i += 1
            time.sleep(0.01)
    message = str(info.value)
    assert str(events_dir) in message and ("Not a directory" in message or "exists" in message)
    with pytest.raises(TelemetryWriteError):
        hub.flush()
    with pytest.raises(TelemetryWriteError):
        hub.close()
    manifest = read_manifest(manifest_path(hub.run_dir, 0))
    assert manifest.status == RunStatus.FAILED.value and "telemetry writer failed" in manifest.error


def test_disk_full_reaches_flush_and_close(tmp_path: Path) -> None:
    hub = open_run(tmp_path, "full", level=TelemetryLevel.NORMAL, sink=DiskFullSink(1))
    hub.emit(_step(0))
    hub.flush()
    hub.emit(_step(1))
    with pytest.raises(TelemetryWriteError, match="No space left on device") as info:
        hub.flush()
    assert "type=env_step/rank=0/part-000000000001-000000000001.parquet" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(TelemetryWriteError, match="No space left"):
        hub.close()


def test_writer_error_is_raised_from_the_with_block(tmp_path: Path) -> None:
    with (
        pytest.raises(TelemetryWriteError, match="No space left"),
        open_run(tmp_path, "ctx", level=TelemetryLevel.NORMAL, sink=DiskFullSink(0)) as hub,
    ):
        hub.emit(_step(0))
    assert hub.closed


def test_every_flush_is_typed_parquet_any_reader_sees(tmp_path: Path) -> None:
    """No journal, nothing held: after each flush DuckDB reads every event so far from
    ``events/**`` (seq contiguous); after the close each type is one zstd file."""
    hub = open_run(tmp_path, "open", level=TelemetryLevel.NORMAL, flush_interval_s=60.0)
    assert hub.run_dir is not None
    glob = f"{hub.run_dir}/events/**/*.parquet"
    for i in range(3):
        for event in (_step(i), minimal_event(ev.ActionTaken, step=i)):
            hub.emit(event)
        hub.flush()
        query = f"SELECT type, seq FROM read_parquet('{glob}', hive_partitioning=true) ORDER BY seq"
        rows = duckdb.sql(query).fetchall()
        assert [seq for _, seq in rows] == list(range(2 * (i + 1)))
        assert {t for t, _ in rows} == {"env_step", "action_taken"}
    hub.close()
    for tag in ("env_step", "action_taken", "writer_stats"):
        (part,) = list_parts(type_rank_dir(hub.run_dir, tag, 0)).live
        assert pq.read_metadata(part.path).row_group(0).column(0).compression == "ZSTD"
    assert sorted(all_seqs(hub.run_dir)) == list(range(7))


def test_merges_bound_the_file_count_of_a_day_long_run() -> None:
    """The merge rule (a counter with MERGE_FANIN digits), run for the writes
    of 24 hours: every type keeps few files, all types together well under 5,000."""
    levels: list[int] = []
    most = 0
    for _ in range(DAY_FLUSHES):
        levels.append(0)
        while (start := merge_start(levels)) is not None:
            levels[start:] = [levels[-1] + 1]
        most = max(most, len(levels))
    assert most * len(EVENT_TYPES) < MAX_FILES_PER_DAY
    assert most <= (MERGE_FANIN - 1) * 4


def test_merges_during_the_run_keep_every_event_once(tmp_path: Path) -> None:
    hub = open_run(tmp_path, "roll", level=TelemetryLevel.NORMAL)
    assert isinstance(hub, TelemetryHub) and hub.run_dir is not None
    directory = type_rank_dir(hub.run_dir, "env_step", 0)
    flushes = MERGE_FANIN * 2 + 3
    for i in range(flushes):
        hub.emit(_step(i))
        hub.flush()
    assert len(list_parts(directory).live) == 2 + 3  # two merged files, three parts
    assert hub.manifest_counters.compactions >= 2
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == list(range(flushes))
    hub.close()
    assert len(list_parts(directory).live) == 1
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == list(range(flushes))


def test_a_crash_between_a_merge_and_its_deletes_duplicates_nothing(tmp_path: Path) -> None:
    hub = open_run(tmp_path, "cmp", level=TelemetryLevel.NORMAL, sink=CrashBeforeDeleteSink())
    for i in range(3):
        hub.emit(_step(i))
        hub.flush()
    with pytest.raises(TelemetryWriteError, match="simulated crash"):
        hub.close()
    assert hub.run_dir is not None
    directory = type_rank_dir(hub.run_dir, "env_step", 0)
    live, superseded, strays = list_parts(directory)
    assert len(live + superseded) == 4  # three inputs + the merged output, all complete
    assert [(p.first, p.last) for p in live] == [(0, 2)] and not strays
    assert sorted((p.first, p.last) for p in superseded) == [(0, 0), (1, 1), (2, 2)]
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == [0, 1, 2]


def _ranges(directory: Path) -> list[tuple[int, int]]:
    """Every part's range, superseded ones included."""
    live, superseded, _ = list_parts(directory)
    return sorted((p.first, p.last) for p in live + superseded)


def test_a_checkpoint_flush_takes_in_the_parts_written_since_the_last_fsync(
    tmp_path: Path,
) -> None:
    """An fsynced flush writes one part per type covering the unsynced parts too (one
    file to fsync, not one per write), deletes them, and leaves fsynced parts alone.
    With a capacity of 2 the third emit makes the writer drain the first two (a write
    without fsync, written after that emit returns); no timed flush happens within the
    60 s interval."""
    hub = open_run(
        tmp_path, "ckpt", level=TelemetryLevel.NORMAL, flush_interval_s=60.0, queue_capacity=2
    )
    assert hub.run_dir is not None
    directory = type_rank_dir(hub.run_dir, "env_step", 0)
    for i in range(3):
        hub.emit(_step(i))
    wait_for(lambda: _ranges(directory) == [(0, 1)], "the drain's part (not fsynced)")
    hub.flush()
    assert _ranges(directory) == [(0, 2)]
    for i in range(3, 6):
        hub.emit(_step(i))
    hub.flush()
    assert _ranges(directory) == [(0, 2), (3, 5)]
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == list(range(6))
    assert read_manifest(manifest_path(hub.run_dir, 0)).counts["env_step"] == 6
    hub.close()
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == list(range(6))


def test_a_crash_before_a_checkpoint_flush_deletes_what_it_took_in_loses_nothing(
    tmp_path: Path,
) -> None:
    hub = open_run(
        tmp_path,
        "ckpt-crash",
        level=TelemetryLevel.NORMAL,
        flush_interval_s=60.0,
        queue_capacity=2,
        sink=CrashBeforeDeleteSink(),
    )
    assert hub.run_dir is not None
    for i in range(3):
        hub.emit(_step(i))
    with pytest.raises(TelemetryWriteError, match="simulated crash"):
        hub.flush()
    directory = type_rank_dir(hub.run_dir, "env_step", 0)
    assert _ranges(directory) == [(0, 1), (0, 2)]
    assert [(p.first, p.last) for p in list_parts(directory).live] == [(0, 2)]
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == [0, 1, 2]
    with pytest.raises(TelemetryWriteError):
        hub.close()


def test_an_explicit_flush_leaves_every_file_fsynced_with_the_manifest(tmp_path: Path) -> None:
    """The fsync policy: when ``flush`` (the trainer's, before a checkpoint) returns,
    every live file of the run, the new directories and the manifest were fsynced,
    whichever writes (timed, drains of a full buffer, merges) made them; so after the
    close."""
    sink = SyncRecordingSink()
    hub = open_run(tmp_path, "durable", level=TelemetryLevel.NORMAL, queue_capacity=3, sink=sink)
    assert hub.run_dir is not None
    for i in range(MERGE_FANIN * 2):  # level-0 parts and a merge of each type
        hub.emit(_step(i))
        hub.emit(minimal_event(ev.ActionTaken, step=i))
        if i % 5 == 4:
            hub.flush()
            assert live_files(hub.run_dir) <= sink.synced
            assert manifest_path(hub.run_dir, 0) in sink.synced
            assert type_rank_dir(hub.run_dir, "action_taken", 0) in sink.synced
    assert hub.manifest_counters.compactions > 0
    hub.close()
    assert live_files(hub.run_dir) <= sink.synced


class ScribblingSink(ParquetSink):
    """Damages every per-flush part right after writing it (merged files stay intact)."""

    def write_part(self, table: pa.Table, path: Path) -> int:
        size = super().write_part(table, path)
        _scribble(path, random.Random(path.name))
        return size


def test_parts_are_merged_from_the_tables_the_writer_holds(tmp_path: Path) -> None:
    """A part damaged on disk after it was written still ends as the right rows in the
    merged file: the writer merges the tables it wrote, not the files read back."""
    with open_run(tmp_path, "held", level=TelemetryLevel.NORMAL, sink=ScribblingSink()) as hub:
        for i in range(30):
            hub.emit(minimal_event(EVENT_TYPES["env_step"], step=i))
            if i % 10 == 9:
                hub.flush()  # three fresh parts
    assert hub.run_dir is not None
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == list(range(30))


def test_damaged_files_are_never_read_back_into_a_merge(tmp_path: Path) -> None:
    """Merged files carry page checksums, and every file a merge reads back (merged
    files, a resume's parts) is read with them verified."""
    table = pa.table({"seq": pa.array(range(4000), pa.int64()), "x": [i / 7 for i in range(4000)]})
    merged = tmp_path / "merged.parquet"
    ParquetSink().write_merged([table], table.schema, merged)
    assert pa.concat_tables(read_verified(merged)).equals(table)
    for trial in range(10):
        copy = tmp_path / f"copy-{trial}.parquet"
        shutil.copy(merged, copy)
        _scribble(copy, random.Random(trial))
        with pytest.raises(OSError):
            list(read_verified(copy))


def test_merged_files_use_dictionaries_only_on_strings_and_envelope_integers(
    tmp_path: Path,
) -> None:
    rows = 3_000
    table = pa.table(
        {
            "seq": pa.array(range(rows), pa.int64()),
            "round": pa.array([i // 500 for i in range(rows)], pa.int64()),
            "step": pa.array([i % 20 for i in range(rows)], pa.int64()),
            "op": pa.array(["WAIT", "PRUNE"] * (rows // 2)),
            "loss": pa.array([i / 7 for i in range(rows)]),
        }
    )
    path = tmp_path / "part.parquet"
    ParquetSink().write_merged([table], table.schema, path)
    chunks = pq.read_metadata(path).row_group(0)
    encodings = {
        chunks.column(i).path_in_schema: chunks.column(i).encodings
        for i in range(chunks.num_columns)
    }
    dictionary = {name for name, enc in encodings.items() if "RLE_DICTIONARY" in enc}
    assert dictionary == {"round", "step", "op"}
    assert "DELTA_BINARY_PACKED" in encodings["seq"]
    assert pq.read_table(path).equals(table)
