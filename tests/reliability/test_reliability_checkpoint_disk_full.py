"""A full disk while saving the checkpoint: a real ENOSPC from the kernel; a full disk
under the telemetry writer fails the checkpoint.

The checkpoint goes to a tmpfs sized for one checkpoint and a half, mounted in a private
user + mount namespace (no privileges needed, nothing visible outside the test): the
first end-of-round save fits, the second needs room for its temporary file next to the
first and fails. The run must fail with one clear error naming the path and "no space
left", keep the previous checkpoint intact and loadable, and claim no checkpoint it did
not write.
"""

from __future__ import annotations

import errno
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from _reliability_support import (
    PROCESS_TIMEOUT_S,
    checkpoint_position,
    cli_env,
    rows,
    run_esper,
    train_args,
    write_small_config,
)
from esper_analysis import load_run

from esper.config import Config, with_overrides
from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry.hub import open_run
from esper.telemetry.sink import ParquetSink
from esper.telemetry.writer import TelemetryWriteError

PAGE = 4096
#: tmpfs size in checkpoints: one fits, a second beside it (the atomic save) does not.
ROOM_IN_CHECKPOINTS = 1.5


@pytest.mark.namespaces
def test_disk_full_while_saving_the_checkpoint(tmp_path: Path) -> None:
    config = write_small_config(tmp_path)
    # The size of one checkpoint of this configuration, measured.
    probe = run_esper(train_args(config, tmp_path / "probe", "p", rounds=1))
    assert probe.returncode == 0, probe.stderr[-3000:]
    size = (tmp_path / "probe" / "p" / "checkpoint.pt").stat().st_size
    room = -(-int(size * ROOM_IN_CHECKPOINTS) // PAGE) * PAGE

    mount = tmp_path / "small-disk"
    mount.mkdir()
    kept = tmp_path / "kept"
    kept.mkdir()
    ckpt = mount / "checkpoint.pt"
    esper = [sys.executable, "-m", "esper"]
    esper += train_args(config, tmp_path / "tel", "full", "--save", str(ckpt), rounds=3)
    script = (
        f"mount -t tmpfs -o size={room} tmpfs {shlex.quote(str(mount))} || exit 90\n"
        f"{shlex.join(esper)}\n"
        "rc=$?\n"
        f"cp -a {shlex.quote(str(mount))}/. {shlex.quote(str(kept))}/\n"
        "exit $rc\n"
    )
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    err = proc.stderr
    assert "Traceback" not in err and "enforce fail" not in err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, err
    assert str(ckpt) in errors[0] and "no space left" in errors[0].lower()
    assert "checkpoint saved" not in err and "round saved" not in err
    # The previous checkpoint (round 0's) is intact, loads, and is what the message names.
    assert sorted(p.name for p in kept.iterdir()) == ["checkpoint.pt"], "no temporary file left"
    run_id, next_round, _ = checkpoint_position(kept / "checkpoint.pt")
    assert (run_id, next_round) == ("full", 1)
    assert f"the last good checkpoint is {ckpt} (resumes at round 1" in err
    # The run says what happened, and records only the checkpoint that was written.
    run_dir = tmp_path / "tel" / "full"
    assert load_run(run_dir).status is RunStatus.FAILED
    finished = rows(run_dir, "run_finished")
    assert "no space left on device" in finished["error"][0]
    assert rows(run_dir, "checkpoint_saved")["next_round"].to_list() == [1]


class _FullDiskSink(ParquetSink):
    """The Parquet sink on a disk that fills up when the first round_finished part is
    written (the part the checkpoint's flush writes: timed writes are a minute apart)."""

    def write_part(self, table: pa.Table, path: Path) -> int:
        if path.parent.parent.name == "type=round_finished":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return super().write_part(table, path)


def test_a_failed_flush_fails_the_checkpoint(tmp_path: Path) -> None:
    """Case 4 of issue 48: the checkpoint was still saved after its flush failed, with a
    seq position past the events on disk, and a continue then finished a run with an
    event missing."""
    from esper.training.run import train

    cfg = with_overrides(
        Config(),
        {
            "run.n_envs": 2, "run.rounds": 2, "run.episode_length": 4, "run.run_id": "full",
            "run.torch_threads": 1, "task.train_samples_per_env": 128, "task.val_samples": 128,
            "policy.feature_dim": 32, "policy.lstm_hidden": 32, "telemetry.dir": str(tmp_path),
        },
    )  # fmt: skip
    hub = open_run(
        tmp_path, "full", level=TelemetryLevel.NORMAL, flush_interval_s=60.0,
        config_hash=cfg.fingerprint(), sink=_FullDiskSink(),
    )  # fmt: skip
    ckpt = tmp_path / "full" / "checkpoint.pt"
    with pytest.raises(TelemetryWriteError, match="No space left on device"):
        train(cfg, telemetry=hub, save=ckpt)
    assert not ckpt.exists()
