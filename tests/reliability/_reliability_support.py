"""Helpers for the reliability tests: the real ``esper`` CLI in subprocesses, tiny configs.

Every training run here is digits with 2 envs, 4-step episodes, small sample caps and
a 32-wide policy, with one torch thread, so one round takes well under a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from esper_analysis import Run, load_run
from esper_analysis.schema import known_event_types

from esper.telemetry.emit_log import EMIT_LOG_ENV

N_ENVS = 2
EPISODE_LENGTH = 4
#: Generous bound for one CLI process (startup imports torch; the machine may be busy).
PROCESS_TIMEOUT_S = 240.0
NS_PER_S = 1_000_000_000

#: The tiny config every test run uses; flags on the command line override it.
SMALL_TOML = """\
[run]
torch_threads = 1
[task]
train_samples_per_env = 128
val_samples = 128
[policy]
feature_dim = 32
lstm_hidden = 32
[telemetry]
flush_interval_s = {flush}
"""


def write_small_config(directory: Path, *, flush_interval_s: float = 0.25) -> Path:
    path = directory / "small.toml"
    path.write_text(SMALL_TOML.format(flush=flush_interval_s))
    return path


def cli_env(**extra: str) -> dict[str, str]:
    """Subprocess environment: one BLAS/OpenMP thread (2-core CI), no colour, extras."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", NO_COLOR="1", TERM="dumb")
    env.pop("ESPER_TRACEBACK", None)
    env.pop(EMIT_LOG_ENV, None)
    env.update(extra)
    return env


def esper_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "esper", *args]


def train_args(config: Path, tel: Path, run_id: str, *extra: str, rounds: int = 2) -> list[str]:
    return [
        "train",
        "--config",
        str(config),
        "--task",
        "digits",
        "--envs",
        str(N_ENVS),
        "--episode-length",
        str(EPISODE_LENGTH),
        "--rounds",
        str(rounds),
        "--seed",
        "0",
        "--telemetry-dir",
        str(tel),
        "--run-id",
        run_id,
        "--device",
        "cpu",
        "--no-progress",
        *extra,
    ]


def run_esper(
    args: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        esper_cmd(*args),
        cwd=cwd,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT_S,
        check=False,
    )


def start_esper(args: Sequence[str], *, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        esper_cmd(*args),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_user_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, exactly one ``error:`` line on stderr naming the problem, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "\x1b[" not in proc.stderr, "terminal escape codes in the error"
    line = errors[0]
    for needle in needles:
        assert needle.lower() in line.lower(), f"{needle!r} not in {line!r}"
    return line


def wait_for(predicate: Any, proc: subprocess.Popen[str], what: str, timeout: float) -> None:
    """Poll ``predicate`` while ``proc`` lives; fail with its stderr if it dies first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"esper exited ({proc.returncode}) before {what}: {err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def kill_hard(proc: subprocess.Popen[str]) -> int:
    """SIGKILL now; returns the wall-clock ns taken right before the signal."""
    killed_ns = time.time_ns()
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=PROCESS_TIMEOUT_S)
    assert proc.returncode == -signal.SIGKILL
    return killed_ns


def read_emit_log(path: Path) -> list[tuple[int, int]]:
    """``(seq, ts_ns)`` per event the killed process recorded (whole lines only)."""
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines()[: text.count("\n")]
    return [(int(seq), int(ts)) for seq, ts in (line.split() for line in lines)]


def run_seqs(run: Run) -> list[int]:
    """Every ``seq`` the analysis layer reads back from the run, all types, rank 0."""
    frames = [
        run.scan(t).select("seq").collect() for t in known_event_types() if run.rows_on_disk(t) > 0
    ]
    if not frames:
        return []
    return sorted(pl.concat(frames)["seq"].to_list())


def rows(run_dir: Path, event_type: str) -> pl.DataFrame:
    return load_run(run_dir).scan(event_type).collect()


def manifest(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "manifest.json").read_text())
    return data


def checkpoint_position(path: Path) -> tuple[str, int, int]:
    """(run id, next round, seq position) of a checkpoint, loaded the safe way."""
    from esper.training.loop.checkpoint import read_checkpoint

    state = read_checkpoint(path)
    return str(state["run_id"]), int(state["next_round"]), int(state["seq_position"])


def in_process(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> subprocess.CompletedProcess[str]:
    """``esper ARGS`` through :func:`esper.cli.main`, shaped like a finished subprocess."""
    from esper.cli import main as esper_main

    capsys.readouterr()
    code = esper_main(args)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["esper", *args], code, out, err)
