"""A SIGKILLed producer loses at most the last flush interval; exits are recorded, a
Ctrl-C during the close too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from _telemetry_producer import FLUSH_INTERVAL_S
from _telemetry_support import all_seqs, minimal_event, read_type

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run
from esper.telemetry.manifest import effective_status, read_manifest
from esper.telemetry.paths import manifest_path
from esper.telemetry.sink import ParquetSink

PRODUCER = Path(__file__).with_name("_telemetry_producer.py")
RUN_BEFORE_KILL_S = 4 * FLUSH_INTERVAL_S
NS = 1_000_000_000


def _producer(mode: str, root: Path, run_id: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(PRODUCER), mode, str(root), run_id, *extra],
        stderr=subprocess.PIPE,
    )


def _side_channel(path: Path) -> list[tuple[int, int]]:
    text = path.read_text()
    lines = text.splitlines()[: text.count("\n")]  # whole lines only
    return [(int(seq), int(t)) for seq, t in (line.split() for line in lines)]


def test_sigkill_loses_at_most_the_last_flush_interval(tmp_path: Path) -> None:
    side = tmp_path / "emitted.txt"
    proc = _producer("stream", tmp_path, "crashy", str(side))
    try:
        deadline = time.monotonic() + 60
        while not side.exists() or not side.read_text():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(RUN_BEFORE_KILL_S)
        killed_at = time.monotonic_ns()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    emitted = _side_channel(side)
    must_survive = {seq for seq, t in emitted if t < killed_at - FLUSH_INTERVAL_S * NS}
    run_dir = tmp_path / "crashy"
    on_disk = all_seqs(run_dir)
    assert len(must_survive) > 100
    assert must_survive <= set(on_disk), sorted(must_survive - set(on_disk))[:10]
    assert sorted(on_disk) == list(range(len(on_disk)))  # a gapless prefix, no duplicates
    # Any Parquet reader sees the same events (no Esper code: DuckDB over events/**).
    # (A kill in the instant between a merge's rename and its deletes would show DuckDB
    # the merged events twice; the distinct seqs are the same either way.)
    source = f"read_parquet('{run_dir}/events/**/*.parquet', hive_partitioning=true)"
    seen = duckdb.sql(f"SELECT DISTINCT seq FROM {source}")
    assert sorted(row[0] for row in seen.fetchall()) == sorted(on_disk)

    manifest = read_manifest(manifest_path(run_dir, 0))
    assert manifest.status == RunStatus.RUNNING.value
    assert effective_status(manifest) is RunStatus.CRASHED
    stale = manifest.heartbeat_ns + 60 * NS
    assert effective_status(_other_host(manifest), now_ns=stale) is RunStatus.CRASHED
    assert read_type(run_dir, "run_finished") == [] and read_type(run_dir, "writer_stats") == []

    # The crashed run can be resumed; seq continues right after what survived.
    start = max(on_disk) + 1
    with open_run(
        tmp_path, "crashy", level=TelemetryLevel.NORMAL, resume=True, start_seq=start
    ) as hub:
        assert hub.next_seq == start
    seqs = all_seqs(run_dir)
    assert sorted(seqs) == list(range(start + 1))
    assert not list(run_dir.rglob("*.tmp"))
    assert read_manifest(manifest_path(run_dir, 0)).status == RunStatus.FINISHED.value


def _other_host(manifest):  # type: ignore[no-untyped-def]
    """The same manifest as seen from another machine (no pid check possible)."""
    import msgspec

    return msgspec.structs.replace(manifest, hostname="elsewhere")


def test_normal_exit_without_close_still_flushes(tmp_path: Path) -> None:
    proc = _producer("exit", tmp_path, "forgot")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    manifest = read_manifest(manifest_path(tmp_path / "forgot", 0))
    assert manifest.status == RunStatus.FINISHED.value
    assert len(read_type(tmp_path / "forgot", "env_step")) == 10


def test_uncaught_exception_is_recorded_as_failed(tmp_path: Path) -> None:
    proc = _producer("raise", tmp_path, "boom")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and b"producer failed on purpose" in err
    manifest = read_manifest(manifest_path(tmp_path / "boom", 0))
    assert manifest.status == RunStatus.FAILED.value
    assert "producer failed on purpose" in manifest.error
    assert len(read_type(tmp_path / "boom", "env_step")) == 10


class _CtrlCDuringCloseSink(ParquetSink):
    """Presses Ctrl-C (SIGINT to this process) while the close merges."""

    def write_merged(self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        return super().write_merged(tables, schema, path)


def test_a_ctrl_c_during_the_close_is_held_until_the_run_is_closed(tmp_path: Path) -> None:
    """Issue 48: after a second Ctrl-C (during the close) the CLI said "telemetry
    flushed" while the manifest stayed ``running``."""
    hub = open_run(tmp_path, "twice", level=TelemetryLevel.NORMAL, sink=_CtrlCDuringCloseSink())
    hub.emit(minimal_event(ev.EnvStep, step=0))
    with pytest.raises(KeyboardInterrupt):
        hub.close(RunStatus.INTERRUPTED, "interrupted by user (Ctrl-C)")
    manifest = read_manifest(manifest_path(tmp_path / "twice", 0))
    assert manifest.status == RunStatus.INTERRUPTED.value
    assert [r["step"] for r in read_type(tmp_path / "twice", "env_step")] == [0]
