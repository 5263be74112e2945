"""The per-flush journal: one file per flush, converted into typed parts later, and a
crashed run's journal read (and resumed) without losing or duplicating an event."""

from __future__ import annotations

import errno
import gc
import warnings
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pytest
from _telemetry_support import (
    FAST_FLUSH_S,
    all_seqs,
    minimal_event,
    mixed_step,
    read_type,
    wait_for,
)
from esper_analysis.errors import CorruptFileError
from esper_analysis.live_reader import RunReader
from esper_analysis.loader import load_run

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import TelemetryHub, open_run
from esper.telemetry.journal import JOURNAL_DIR, journal_parts, read_journal
from esper.telemetry.manifest import read_manifest, write_manifest
from esper.telemetry.paths import list_parts, manifest_path, type_rank_dir
from esper.telemetry.sink import ParquetSink
from esper.telemetry.writer import CONVERT_PARTS, DIRECT_EVENTS, TelemetryWriteError


class JournalKeepingSink(ParquetSink):
    """Writes every typed part, then 'dies' before deleting the journal parts."""

    def remove(self, path: Path) -> None:
        if JOURNAL_DIR in path.parts:
            raise RuntimeError("simulated crash between a conversion and its journal delete")
        super().remove(path)


class TypedPartsFailSink(ParquetSink):
    """Journal parts are written; every typed part and merged file fails (a disk that
    fills up)."""

    def write_table(self, table: pa.Table, path: Path) -> int:
        if JOURNAL_DIR not in path.parts:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return super().write_table(table, path)

    def write_tables(self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))


def test_a_periodic_flush_writes_one_journal_part_and_an_explicit_flush_converts(
    tmp_path: Path,
) -> None:
    hub = open_run(tmp_path, "j", level=TelemetryLevel.NORMAL, flush_interval_s=FAST_FLUSH_S)
    assert isinstance(hub, TelemetryHub) and hub.run_dir is not None
    run_dir = hub.run_dir
    for i in range(3):
        for event in mixed_step(i):
            hub.emit(event)
        wait_for(lambda i=i: hub.manifest_counters.events_written == 3 * (i + 1), "a flush")
    # One file per flush, whatever the number of types in it; no typed part yet.
    assert len(journal_parts(run_dir, 0)) == hub.manifest_counters.flushes >= 3
    assert not list_parts(type_rank_dir(run_dir, "env_step", 0))
    journalled = [e.seq for p in journal_parts(run_dir, 0) for e in read_journal(p)]
    assert journalled == list(range(9))
    assert read_manifest(manifest_path(run_dir, 0)).counts == {
        "env_step": 3,
        "action_taken": 3,
        "reward_computed": 3,
    }
    hub.flush()
    assert journal_parts(run_dir, 0) == []
    for tag in ("env_step", "action_taken", "reward_computed"):
        assert len(list_parts(type_rank_dir(run_dir, tag, 0))) == 1
        assert [r["step"] for r in read_type(run_dir, tag)] == [0, 1, 2]
    hub.close()
    assert not (run_dir / JOURNAL_DIR).exists()  # a closed run has no journal at all
    assert sorted(all_seqs(run_dir)) == list(range(10))  # + writer_stats


def test_a_durable_only_flush_journals_and_a_typed_flush_converts(tmp_path: Path) -> None:
    """What the trainer's checkpoint flush asks for (``typed=False``): every event in a
    closed file when it returns, but no typed part written for it."""
    hub = open_run(tmp_path, "dur", level=TelemetryLevel.NORMAL, flush_interval_s=60.0)
    assert isinstance(hub, TelemetryHub) and hub.run_dir is not None
    run_dir = hub.run_dir
    for event in mixed_step(0):
        hub.emit(event)
    hub.flush(typed=False)
    (part,) = journal_parts(run_dir, 0)
    assert [e.seq for e in read_journal(part)] == [0, 1, 2]
    assert not (run_dir / "events").exists()
    hub.flush()
    assert journal_parts(run_dir, 0) == []
    assert [r["seq"] for r in read_type(run_dir, "action_taken")] == [1]
    hub.close()


def test_journal_parts_are_converted_after_convert_parts_flushes(tmp_path: Path) -> None:
    hub = open_run(tmp_path, "many", level=TelemetryLevel.NORMAL, flush_interval_s=FAST_FLUSH_S)
    assert isinstance(hub, TelemetryHub) and hub.run_dir is not None
    run_dir = hub.run_dir
    for i in range(CONVERT_PARTS):
        hub.emit(minimal_event(ev.EnvStep, step=i))
        flushes = hub.manifest_counters.flushes
        wait_for(lambda f=flushes: hub.manifest_counters.flushes > f, "a flush")
    wait_for(lambda: list_parts(type_rank_dir(run_dir, "env_step", 0)), "a conversion")
    assert len(journal_parts(run_dir, 0)) < CONVERT_PARTS
    hub.close()
    assert [r["step"] for r in read_type(run_dir, "env_step")] == list(range(CONVERT_PARTS))


def test_a_burst_skips_the_journal(tmp_path: Path) -> None:
    class Recording(ParquetSink):
        def __init__(self) -> None:
            self.journalled: list[int] = []  # events per journal part

        def write_table(self, table: pa.Table, path: Path) -> int:
            if JOURNAL_DIR in path.parts:
                self.journalled.append(table.column("count")[0].as_py())
            return super().write_table(table, path)

    sink = Recording()
    with open_run(
        tmp_path, "burst", level=TelemetryLevel.NORMAL, flush_interval_s=60.0, sink=sink
    ) as hub:
        for i in range(DIRECT_EVENTS):
            hub.emit(minimal_event(ev.EnvStep, step=i))
        hub.flush()  # one batch of DIRECT_EVENTS events
    assert sink.journalled == [1]  # only the close's own writer_stats event
    assert hub.run_dir is not None
    assert len(read_type(hub.run_dir, "env_step")) == DIRECT_EVENTS


def test_a_crash_between_conversion_and_journal_delete_duplicates_nothing(
    tmp_path: Path,
) -> None:
    hub = open_run(
        tmp_path,
        "dup",
        level=TelemetryLevel.NORMAL,
        flush_interval_s=FAST_FLUSH_S,
        sink=JournalKeepingSink(),
    )
    assert isinstance(hub, TelemetryHub)
    for i in range(5):
        for event in mixed_step(i):
            hub.emit(event)
    wait_for(lambda: hub.manifest_counters.events_written == 15, "the journal")
    with pytest.raises(TelemetryWriteError, match="simulated crash"):
        hub.flush()
    with pytest.raises(TelemetryWriteError):
        hub.close()
    assert hub.run_dir is not None
    run_dir = hub.run_dir
    assert journal_parts(run_dir, 0) and list_parts(type_rank_dir(run_dir, "env_step", 0))
    assert sorted(all_seqs(run_dir)) == list(range(15))  # each event once

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no degraded read: nothing is duplicated
        run = load_run(run_dir)
    assert run.status is RunStatus.FAILED
    assert {t: run.count(t) for t in run.event_types} == {
        "env_step": 5,
        "action_taken": 5,
        "reward_computed": 5,
    }
    reader = RunReader(run_dir)
    reader.refresh()
    assert reader.frame("env_step")["seq"].to_list() == [0, 3, 6, 9, 12]

    # A resume converts what is left of the journal and cuts the tail at start_seq.
    with open_run(tmp_path, "dup", level=TelemetryLevel.NORMAL, resume=True, start_seq=9) as hub2:
        for i in range(3, 5):
            for event in mixed_step(i):
                hub2.emit(event)
    assert journal_parts(run_dir, 0) == []
    assert sorted(all_seqs(run_dir)) == list(range(16))
    (resume,) = read_manifest(manifest_path(run_dir, 0)).resumes
    assert resume.events_truncated == 6  # seq 9-14, each counted once


def _journal_only_run(tmp_path: Path, name: str, *, steps: int) -> Path:
    """A run whose periodic flushes journalled ``steps`` steps, and whose conversion
    (at close) failed: every event is in the journal only."""
    hub = open_run(
        tmp_path,
        name,
        level=TelemetryLevel.NORMAL,
        flush_interval_s=FAST_FLUSH_S,
        sink=TypedPartsFailSink(),
    )
    assert isinstance(hub, TelemetryHub) and hub.run_dir is not None
    run_dir = hub.run_dir
    for i in range(steps):
        for event in mixed_step(i):
            hub.emit(event)
    wait_for(lambda: hub.manifest_counters.events_written == 3 * steps, "the journal")
    with pytest.raises(TelemetryWriteError, match="No space left"):
        hub.close()
    return run_dir


def test_a_run_whose_typed_parts_never_landed_is_read_from_its_journal(
    tmp_path: Path,
) -> None:
    run_dir = _journal_only_run(tmp_path, "jonly", steps=4)
    assert journal_parts(run_dir, 0)
    assert not (run_dir / "events").exists() or not any((run_dir / "events").rglob("*.parquet"))
    run = load_run(run_dir)
    assert {t: run.count(t) for t in run.event_types} == {
        "env_step": 4,
        "action_taken": 4,
        "reward_computed": 4,
        "writer_stats": 1,  # journalled at close, before the merge that failed
    }
    assert run.scan("reward_computed").collect()["step"].to_list() == [0, 1, 2, 3]
    # The scan holds the journal's events itself: the run may be gone before collect.
    lazy = load_run(run_dir).scan("env_step")
    gc.collect()
    assert lazy.collect()["step"].to_list() == [0, 1, 2, 3]
    assert {f.name_in(run_dir) for fs in run.files.values() for f in fs} == {"journal/rank=0"}

    # A new run of the same id is refused: the journal is this rank's telemetry.
    manifest_path(run_dir, 0).unlink()
    with pytest.raises(Exception, match="already has telemetry"):
        open_run(tmp_path, "jonly", level=TelemetryLevel.NORMAL)


def test_a_damaged_journal_part_is_skipped_only_in_an_unclosed_run(tmp_path: Path) -> None:
    run_dir = _journal_only_run(tmp_path, "scrib", steps=1)
    # The step's flush, then the close's writer_stats event: damage the step's part.
    part, _stats_part = journal_parts(run_dir, 0)
    data = bytearray(part.read_bytes())
    data[4:36] = bytes(32)
    part.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=r"journal/rank=0/part-000000\.parquet"):
        load_run(run_dir)  # failed is a closed status: an unreadable file is an error

    path = manifest_path(run_dir, 0)
    manifest = read_manifest(path)
    manifest.status = RunStatus.RUNNING.value
    manifest.pid = 2**22 + 1  # no such process: a crashed run
    write_manifest(path, manifest)
    with pytest.warns(UserWarning) as caught:
        run = load_run(run_dir)
    messages = [str(w.message) for w in caught]
    assert any("damaged journal part" in m for m in messages)
    assert any("degraded read" in m and "files hold 0" in m for m in messages)
    assert [s.path for s in run.skipped] == ["journal/rank=0/part-000000.parquet"]
    assert run.recovery is not None and run.recovery.files_skipped
