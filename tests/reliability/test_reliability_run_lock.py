"""One writer per run: a second process on a live run exits 2 before touching it.

Issue 13, item 2: ``--resume RUN/checkpoint.pt --continue-run`` while RUN still trained
truncated and rewrote the live run. The writer now holds an OS file lock on the run
for its lifetime; the kernel drops it when the process dies, so kill -9 recovery and
resume keep working.
"""

from __future__ import annotations

import errno
import fcntl
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _reliability_support import (
    PROCESS_TIMEOUT_S,
    assert_user_error,
    checkpoint_position,
    cli_env,
    kill_hard,
    manifest,
    run_esper,
    run_seqs,
    start_esper,
    train_args,
    wait_for,
    write_small_config,
)
from esper_analysis import load_run

from esper.core.enums import TelemetryLevel
from esper.telemetry.demo import run_demo
from esper.telemetry.hub import open_run
from esper.telemetry.lock import RunLockedError, run_lock_owner

#: Rounds of the live run: long enough to outlive the second process's start-up.
LIVE_ROUNDS = 400
#: A holder process that opens a run, says so, and keeps it open until stdin closes.
HOLDER = """
import sys
from esper.core.enums import TelemetryLevel
from esper.telemetry.demo import run_demo
from esper.telemetry.hub import open_run
hub = open_run(
    sys.argv[1], sys.argv[2], level=TelemetryLevel.NORMAL, resume=True, start_seq=1
)
print("ready", flush=True)
sys.stdin.read()
hub.close()
"""


def _files(run_dir: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file in the run, the lock file included."""
    return {
        str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def test_continue_run_on_a_live_run_is_refused_naming_the_writer(tmp_path: Path) -> None:
    config = write_small_config(tmp_path)
    tel = tmp_path / "tel"
    run_dir = tel / "live"
    live = start_esper(train_args(config, tel, "live", rounds=LIVE_ROUNDS), env=cli_env())
    try:
        ckpt = run_dir / "checkpoint.pt"
        wait_for(ckpt.exists, live, "the first checkpoint", PROCESS_TIMEOUT_S)
        time.sleep(0.5)  # let the checkpoint's rename settle before it is read
        second = run_esper(
            train_args(
                config, tel, "live", "--resume", str(ckpt), "--continue-run", rounds=LIVE_ROUNDS
            )
        )
        line = assert_user_error(second, "live", f"pid {live.pid}", socket.gethostname())
        assert "being written" in line
        assert live.poll() is None, "the live run died while a second process was refused"
        same_id = run_esper(train_args(config, tel, "live", rounds=1))
        assert_user_error(same_id, "live", f"pid {live.pid}")
        assert manifest(run_dir)["pid"] == live.pid  # nobody rewrote the live manifest
    finally:
        if live.poll() is None:
            kill_hard(live)
    seqs = run_seqs(load_run(run_dir))
    assert len(seqs) == len(set(seqs)), "duplicate seq: a second writer touched the run"
    assert run_lock_owner(run_dir) is None  # kill -9 released the lock
    run_id, _, _ = checkpoint_position(run_dir / "checkpoint.pt")
    assert run_id == "live"


def _holder(tel: Path, run_id: str) -> subprocess.Popen[str]:
    """A process that continues ``run_id`` (what ``--continue-run`` opens) and holds it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tel), run_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
    return proc


def test_second_writer_exits_before_touching_the_run(tmp_path: Path) -> None:
    """A resume against a held run changes no byte and no mtime in it."""
    tel = tmp_path / "tel"
    first = open_run(tel, "held", level=TelemetryLevel.NORMAL, flush_interval_s=0.1)
    first.close()
    holder = _holder(tel, "held")
    try:
        before = _files(tel / "held")
        with pytest.raises(RunLockedError, match=rf"pid {holder.pid} on host"):
            open_run(tel, "held", level=TelemetryLevel.NORMAL, resume=True, start_seq=0)
        with pytest.raises(RunLockedError, match=rf"pid {holder.pid}"):
            open_run(tel, "held", level=TelemetryLevel.NORMAL)
        assert _files(tel / "held") == before
        assert run_lock_owner(tel / "held") == f"pid {holder.pid} on host {socket.gethostname()}"
    finally:
        holder.kill()
        holder.wait(PROCESS_TIMEOUT_S)
    # The OS released the dead holder's lock: the run can be resumed at once.
    hub = open_run(tel, "held", level=TelemetryLevel.NORMAL, resume=True, start_seq=1)
    assert run_lock_owner(tel / "held") is not None
    hub.close()
    assert run_lock_owner(tel / "held") is None


def test_a_closed_hub_releases_the_lock_in_process(tmp_path: Path) -> None:
    hub = open_run(tmp_path, "r", level=TelemetryLevel.NORMAL)
    with pytest.raises(RunLockedError, match="being written by pid"):
        open_run(tmp_path, "r", level=TelemetryLevel.NORMAL, resume=True, start_seq=0)
    hub.close()
    again = open_run(tmp_path, "r", level=TelemetryLevel.NORMAL, resume=True, start_seq=1)
    again.close()


def test_demo_force_never_replaces_a_live_run(tmp_path: Path) -> None:
    hub = open_run(tmp_path, "busy", level=TelemetryLevel.NORMAL)
    try:
        with pytest.raises(RunLockedError, match="being written by pid"):
            run_demo(tmp_path, "busy", force=True)
        assert (tmp_path / "busy" / "manifest.json").is_file()
    finally:
        hub.close()
    run_demo(tmp_path, "busy", force=True)  # a closed run may be replaced


def test_a_filesystem_without_locks_warns_and_still_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.warns(UserWarning, match="does not support file locks"):
        hub = open_run(tmp_path, "nfs", level=TelemetryLevel.NORMAL)
    assert run_lock_owner(tmp_path / "nfs") is None
    hub.close()
    assert (tmp_path / "nfs" / "manifest.json").is_file()
