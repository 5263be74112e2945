"""Writer guarantees: back-pressure without loss, drops counted, errors surfaced,
crash-safe compaction."""

from __future__ import annotations

import errno
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _telemetry_support import all_seqs, minimal_event, read_type

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.compaction import live_parts, recover_pending
from esper.telemetry.events import EVENT_TYPES
from esper.telemetry.hub import TelemetryHub, open_run
from esper.telemetry.journal import JOURNAL_DIR
from esper.telemetry.manifest import read_manifest, read_manifests, write_manifest
from esper.telemetry.paths import list_parts, manifest_path, type_rank_dir
from esper.telemetry.sink import ParquetSink
from esper.telemetry.writer import ROLLING_COMPACT_PARTS, TelemetryWriteError

WRITE_DELAY_S = 0.03


class SlowSink(ParquetSink):
    """A disk that takes WRITE_DELAY_S per part file."""

    def write_table(self, table: pa.Table, path: Path) -> int:
        time.sleep(WRITE_DELAY_S)
        return super().write_table(table, path)


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

    def write_table(self, table: pa.Table, path: Path) -> int:
        self._use_one(path)
        return super().write_table(table, path)

    def write_tables(self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path) -> int:
        self._use_one(path)
        return super().write_tables(tables, schema, path)


class CrashBeforeDeleteSink(ParquetSink):
    """Writes the merged file, then 'dies' before deleting the inputs (journal parts,
    which conversions delete, go as usual)."""

    def remove(self, path: Path) -> None:
        if JOURNAL_DIR in path.parts:
            return super().remove(path)
        raise RuntimeError("simulated crash between writing the merge and deleting inputs")


def _step(i: int) -> ev.Event:
    return minimal_event(ev.EnvStep, step=i)


#: Both emit paths: the native fast path (where built) and the hub's Python path.
BOTH_PATHS = pytest.mark.parametrize("native", [True, False], ids=["native", "python"])


@BOTH_PATHS
def test_full_queue_blocks_loses_nothing_and_reports_blocked_time(
    tmp_path: Path, native: bool
) -> None:
    n = 2000
    hub = open_run(
        tmp_path,
        "slow",
        level=TelemetryLevel.NORMAL,
        queue_capacity=100,
        sink=SlowSink(),
        native=native,
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


@BOTH_PATHS
def test_drop_policy_counts_every_drop_and_keeps_seq_gapless(tmp_path: Path, native: bool) -> None:
    n = 2000
    hub = open_run(
        tmp_path,
        "drop",
        level=TelemetryLevel.NORMAL,
        queue_capacity=50,
        drop_when_full=True,
        sink=SlowSink(),
        native=native,
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


@BOTH_PATHS
def test_output_directory_turning_into_a_file_is_a_clear_error(
    tmp_path: Path, native: bool
) -> None:
    hub = open_run(
        tmp_path, "gone", level=TelemetryLevel.NORMAL, flush_interval_s=0.05, native=native
    )
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
    assert "type=env_step/rank=0/part-000001.parquet" in str(info.value)
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


def test_rolling_compaction_bounds_the_number_of_files(tmp_path: Path) -> None:
    hub = open_run(tmp_path, "roll", level=TelemetryLevel.NORMAL)
    assert isinstance(hub, TelemetryHub) and hub.run_dir is not None
    directory = type_rank_dir(hub.run_dir, "env_step", 0)
    for i in range(ROLLING_COMPACT_PARTS + 2):
        hub.emit(_step(i))
        hub.flush()
    assert len(list_parts(directory)) <= 3
    assert hub.manifest_counters.compactions == 1
    (_, rolled), *_ = list_parts(directory)
    rolled_mtime = rolled.stat().st_mtime_ns
    hub.close()
    # Close merges only the stretch since the last rolling compaction: the earlier
    # compacted file is not rewritten, and the closed run is all zstd.
    parts = list_parts(directory)
    assert len(parts) == 2
    assert parts[0][1] == rolled and rolled.stat().st_mtime_ns == rolled_mtime
    for _, path in parts:
        meta = pq.read_metadata(path)
        assert meta.row_group(0).column(0).compression == "ZSTD"
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == list(
        range(ROLLING_COMPACT_PARTS + 2)
    )


def test_interrupted_compaction_neither_loses_nor_duplicates(tmp_path: Path) -> None:
    hub = open_run(tmp_path, "cmp", level=TelemetryLevel.NORMAL, sink=CrashBeforeDeleteSink())
    for i in range(3):
        hub.emit(_step(i))
        hub.flush()
    with pytest.raises(TelemetryWriteError, match="simulated crash"):
        hub.close()
    assert hub.run_dir is not None
    directory = type_rank_dir(hub.run_dir, "env_step", 0)
    on_disk = [p.name for _, p in list_parts(directory)]
    assert len(on_disk) == 4  # three inputs + the merged output, all complete
    manifests = read_manifests(hub.run_dir)
    # The close merges every type under one intent save: env_step's and writer_stats'.
    records = manifests[0].pending_compactions
    assert sorted(r.event_type for r in records) == ["env_step", "writer_stats"]
    (pending,) = [r for r in records if r.event_type == "env_step"]
    assert pending.output == f"type=env_step/rank=0/{on_disk[-1]}"
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == [0, 1, 2]
    live = [p.name for p in live_parts(hub.run_dir, manifests) if p.parent == directory]
    assert live == [on_disk[-1]]

    manifest = manifests[0]
    path = manifest_path(hub.run_dir, 0)
    recover_pending(hub.run_dir, manifest, ParquetSink(), lambda m: write_manifest(path, m))
    assert [p.name for _, p in list_parts(directory)] == [on_disk[-1]]
    assert read_manifest(path).pending_compactions == []


class ScribblingSink(ParquetSink):
    """Damages every per-flush part right after writing it (merged files stay intact)."""

    def write_table(self, table: pa.Table, path: Path) -> int:
        size = super().write_table(table, path)
        data = bytearray(path.read_bytes())
        data[4:36] = bytes(32)  # inside the first column chunk's data
        path.write_bytes(bytes(data))
        return size


def test_the_close_merge_rewrites_fresh_parts_from_memory(tmp_path: Path) -> None:
    """The writer merges the tables it wrote, not the files read back: a part damaged on
    disk after it was written still ends as the right rows in the merged file."""
    with open_run(tmp_path, "held", level=TelemetryLevel.NORMAL, sink=ScribblingSink()) as hub:
        for i in range(30):
            hub.emit(minimal_event(EVENT_TYPES["env_step"], step=i))
            if i % 10 == 9:
                hub.flush()  # three fresh parts
    assert hub.run_dir is not None
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == list(range(30))


def test_compacted_files_use_dictionaries_only_on_strings_and_envelope_integers(
    tmp_path: Path,
) -> None:
    """Strings and the envelope's few-valued integers are dictionary-encoded; other
    numbers get no dictionary, where one costs (seq and timestamps are delta-encoded,
    payload values plain)."""
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
    ParquetSink().write_tables([table], table.schema, path)
    chunks = pq.read_metadata(path).row_group(0)
    encodings = {
        chunks.column(i).path_in_schema: chunks.column(i).encodings
        for i in range(chunks.num_columns)
    }
    dictionary = {name for name, enc in encodings.items() if "RLE_DICTIONARY" in enc}
    assert dictionary == {"round", "step", "op"}
    assert pq.read_table(path).equals(table)
