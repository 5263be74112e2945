"""``esper watch``: the view's values on scripted runs, retries, compaction mid-read, a pty."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _analysis_support import LENGTH, N_ENVS, ROUNDS, WALL_S, Script
from conftest import Crashed
from esper_analysis.watch import RETRY_PAUSE_S, read_state, render, snapshot, sparkline
from rich.console import Console

from esper.cli import main
from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run


def _text(state: object) -> str:
    console = Console(width=120, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(render(state))  # type: ignore[arg-type]
    return console.export_text()


def test_snapshot_of_a_finished_run_has_the_scripted_values(
    scripted: tuple[Path, Script],
) -> None:
    path, script = scripted
    state = snapshot(path)
    assert (state.status, state.task, state.policy) == ("finished", "digits", "ppo")
    assert (state.round, state.rounds_done, state.rounds_planned) == (1, ROUNDS, ROUNDS)
    assert (state.step, state.env_steps) == (LENGTH - 1, ROUNDS * N_ENVS * LENGTH)
    assert state.eps_last == pytest.approx(N_ENVS * LENGTH / WALL_S)
    means = [sum(script.episode_reward[(r, e)] for e in range(N_ENVS)) / N_ENVS for r in (0, 1)]
    assert state.rewards == pytest.approx(means)
    # round 1: seed C (env 0) training, seed D (env 1) germinated
    assert state.seeds.select("env", "GERMINATED", "TRAINING").rows() == [(0, 0, 1), (1, 1, 0)]
    assert state.seeds.drop("env", "GERMINATED", "TRAINING").sum_horizontal().to_list() == [0, 0]
    assert [line.split(":")[0] for line in state.recent] == [
        "rollback  round 0 env 0 step 3",
        "rollback  round 1 env 1 step 2",
    ]
    assert state.writer["events_written"] == sum(script.expected_counts().values())


def test_once_prints_the_final_state(
    scripted: tuple[Path, Script], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["watch", str(scripted[0]), "--once"]) == 0
    out = capsys.readouterr().out
    for text in ("run scripted", "finished", "round 2/2", "env-steps 24", "divergence"):
        assert text in out, text


def test_once_on_a_crashed_run(crashed: Crashed) -> None:
    state = snapshot(crashed.path)
    assert state.status == RunStatus.CRASHED.value
    assert (state.round, state.rounds_done) == (0, 1)  # round 1 was lost in the kill
    assert "crashed" in _text(state)


def test_bad_interval_is_a_usage_error(scripted: tuple[Path, Script]) -> None:
    assert main(["watch", str(scripted[0]), "--interval", "5"]) == 2


def test_read_retries_then_keeps_the_previous_view(scripted: tuple[Path, Script]) -> None:
    good = snapshot(scripted[0])
    failures = iter([FileNotFoundError("part-000003.parquet"), FileNotFoundError("x")])

    def flaky(path: str | Path) -> object:
        exc = next(failures, None)
        if exc is not None:
            raise exc
        return good

    pauses: list[float] = []
    assert read_state(scripted[0], read=flaky, sleep=pauses.append) is good  # type: ignore[arg-type]
    assert pauses == [RETRY_PAUSE_S, RETRY_PAUSE_S]

    def broken(path: str | Path) -> object:
        raise FileNotFoundError("gone mid-read")

    kept = read_state(scripted[0], good, read=broken, sleep=lambda _: None)  # type: ignore[arg-type]
    assert kept.rewards == good.rewards and "gone mid-read" in kept.note
    with pytest.raises(FileNotFoundError):
        read_state(scripted[0], read=broken, sleep=lambda _: None)  # type: ignore[arg-type]


def test_sparkline_scales_min_to_max() -> None:
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([2.0, 2.0]) == "▁▁"
    assert sparkline([]) == ""


def test_snapshots_survive_rolling_compaction(tmp_path: Path) -> None:
    """A real writer flushing and compacting (every 128 parts) while the view reads."""
    hub = open_run(tmp_path, "busy", level=TelemetryLevel.NORMAL, flush_interval_s=0.01)
    hub.emit(ev.RunStarted(**_started()))
    done = threading.Event()

    def produce() -> None:
        for i in range(300):
            hub.emit(ev.RoundStarted(round=i, n_envs=1, episode_length=1, entropy_coef=0, lr=0))
            hub.flush()
        done.set()

    thread = threading.Thread(target=produce)
    thread.start()
    reads = 0
    while not done.is_set():
        state = read_state(tmp_path / "busy")
        assert state.note == ""
        reads += 1
    thread.join()
    hub.close(RunStatus.FINISHED)
    assert reads > 5
    assert snapshot(tmp_path / "busy").round == 299
    manifest = (tmp_path / "busy" / "manifest.json").read_text()
    assert '"compactions": 0' not in manifest


def _started() -> dict[str, object]:
    import msgspec
    from _analysis_support import run_started

    return {k: v for k, v in msgspec.structs.asdict(run_started()).items() if k != "type"}


def _read_pty(fd: int, deadline: float) -> bytes:
    chunks = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


@pytest.mark.slow
def test_watch_follows_a_live_training_run_on_a_pty(tmp_path: Path) -> None:
    rounds = 3
    train = subprocess.Popen(
        [sys.executable, "-m", "esper", "train", "--envs", "2", "--rounds", str(rounds),
         "--episode-length", "6", "--telemetry-dir", str(tmp_path), "--run-id", "live",
         "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    run_dir = tmp_path / "live"
    deadline = time.monotonic() + 180
    while not (run_dir / "manifest.json").exists():
        assert train.poll() is None, train.stderr.read() if train.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.1)
    pid, fd = pty.fork()
    if pid == 0:  # the child: esper watch on a terminal
        env = dict(os.environ, TERM="xterm-256color", COLUMNS="100", LINES="40")
        os.execvpe(
            sys.executable,
            [sys.executable, "-m", "esper", "watch", str(run_dir), "--interval", "0.5"],
            env,
        )
    output = _read_pty(fd, deadline).decode("utf-8", "replace")
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert train.wait(timeout=60) == 0
    assert os.waitstatus_to_exitcode(status) == 0, output[-2000:]
    assert "running" in output  # seen live ...
    assert "finished" in output  # ... and followed to the end
    assert f"round {rounds}/{rounds} (done {rounds})" in output
    assert output.count("run live") >= 2  # redrawn, not printed once
    assert "\x1b[" in output  # a terminal view (cursor control), not plain lines


def test_a_refresh_reads_only_the_footers_of_new_files(
    scripted: tuple[Path, Script], tmp_path: Path
) -> None:
    """The loader keeps each file's footer while the file is unchanged: a view that
    reloads a live run every second reads only its new files' footers."""
    from conftest import copy_run
    from esper_analysis.loader import _footer

    run_dir = copy_run(scripted[0], tmp_path / "again")
    first = snapshot(run_dir)
    before = _footer.cache_info()
    again = snapshot(run_dir)
    after = _footer.cache_info()
    assert after.misses == before.misses and after.hits > before.hits
    assert again.rewards == first.rewards and again.seeds.equals(first.seeds)
