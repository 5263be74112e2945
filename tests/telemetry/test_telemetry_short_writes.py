"""Every write is checked: a short write is continued, a full disk is an error, and a
part is never renamed into place shorter than it was encoded (issue 48, case 5: with
4,096 bytes free, ``write_part`` returned 80,285 from one ``os.write`` and the file on
disk was 4,096 bytes)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _telemetry_support import minimal_event, read_type

from esper.core.enums import TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run
from esper.telemetry.sink import ParquetSink

#: Bytes a write writes at most in the short-write test (far less than a part).
SHORT_WRITE_BYTES = 1000
#: tmpfs size, and the free space left in it when the part is written.
DISK_BYTES = 64 * 1024
FREE_BYTES = 4096


def _short_write(fd: int, data: bytes | memoryview) -> int:
    """``os.write`` that writes at most ``SHORT_WRITE_BYTES`` (as pipes, signals and
    nearly full disks may)."""
    return os.write(fd, memoryview(data)[:SHORT_WRITE_BYTES])


def test_short_writes_are_continued_to_the_end(tmp_path: Path) -> None:
    sink = ParquetSink(write=_short_write)
    with open_run(tmp_path, "short", level=TelemetryLevel.NORMAL, sink=sink) as hub:
        for i in range(300):
            hub.emit(minimal_event(ev.EnvStep, step=i))
        hub.flush()
        assert hub.run_dir is not None
        assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == list(range(300))
    assert [r["step"] for r in read_type(tmp_path / "short", "env_step")] == list(range(300))


_FILL_AND_WRITE = """
import json, os, sys
from pathlib import Path
from esper.telemetry.arrow_schema import events_to_table
from esper.telemetry import events as ev
from esper.telemetry.sink import ParquetSink
disk, free = Path(sys.argv[1]), int(sys.argv[2])
left = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
(disk / "filler").write_bytes(b"x" * (left - free))
steps = [ev.EnvStep(run_id="r", seq=i, step=i, train_loss=0.5, train_acc=0.5, val_loss=0.5,
         val_acc=0.5, active_seeds=0, host_params=1, seed_params=0, train_ms=1.0, val_ms=1.0,
         features_ms=1.0, policy_ms=1.0) for i in range(2000)]
part = disk / "part-000000000000-000000001999.parquet"
try:
    size = ParquetSink().write_part(events_to_table(ev.EnvStep, steps), part)
    print(json.dumps({"returned": size, "on_disk": part.stat().st_size}))
except OSError as exc:
    left = sorted(p.name for p in disk.iterdir() if p.name != "filler")
    print(json.dumps({"error": str(exc), "left": left}))
"""


@pytest.mark.namespaces
def test_a_full_disk_is_an_error_not_a_short_part(tmp_path: Path) -> None:
    """A real ENOSPC: a tmpfs with 4 KiB free, in a private user + mount namespace."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "write.py"
    script.write_text(_FILL_AND_WRITE)
    python = shlex.join([sys.executable, str(script), str(disk), str(FREE_BYTES)])
    shell = f"mount -t tmpfs -o size={DISK_BYTES} tmpfs {shlex.quote(str(disk))} || exit 90\n"
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", shell + python],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "No space left on device" in result.get("error", ""), result
    assert result["left"] == [], "neither the part nor its temporary file may stay"
