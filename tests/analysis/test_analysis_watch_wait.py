"""``esper watch`` started before its run exists waits for it (with a timeout); a stopped
run shows one EPS for its last round; counts read "1 env", not "1 envs"."""

from __future__ import annotations

import dataclasses
import io
import itertools
from pathlib import Path

import pytest
from _analysis_support import Script
from conftest import copy_run
from esper_analysis.errors import RunNotFoundError
from esper_analysis.watch import WAIT_POLL_S, render, snapshot, wait_for_run, watch
from rich.console import Console

from esper.cli import main


def _text(renderable: object) -> str:
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_watch_waits_for_a_run_that_starts_later(
    scripted: tuple[Path, Script], tmp_path: Path
) -> None:
    late = tmp_path / "late"
    pauses: list[float] = []

    def sleep(seconds: float) -> None:  # the trainer starts during the third pause
        pauses.append(seconds)
        if len(pauses) == 3:
            copy_run(scripted[0], late)

    out = io.StringIO()
    state = watch(late, Console(file=out, width=100), once=True, wait_s=30, sleep=sleep)
    assert pauses == [WAIT_POLL_S] * 3
    assert state.status == "finished" and state.run_id == "scripted"
    text = out.getvalue()
    assert text.startswith(f"waiting up to 30 s for run {late} to start")
    assert "run scripted" in text


def test_waiting_ends_with_an_error_naming_the_path_and_the_flag(tmp_path: Path) -> None:
    clock = itertools.count(0.0, 0.5)
    with pytest.raises(RunNotFoundError, match=r"no run appeared at .*/never within 2 s .*--wait"):
        wait_for_run(tmp_path / "never", 2.0, sleep=lambda _: None, clock=lambda: next(clock))


def test_a_directory_of_runs_is_refused_at_once(
    scripted: tuple[Path, Script], tmp_path: Path
) -> None:
    copy_run(scripted[0], tmp_path / "runs" / "a")
    with pytest.raises(RunNotFoundError, match="holds runs \\(a\\), it is not one"):
        wait_for_run(tmp_path / "runs", 60.0, sleep=pytest.fail)  # type: ignore[arg-type]


def test_cli_wait_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", str(tmp_path / "missing"), "--wait", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no run appeared at") and "--wait" in err
    assert main(["watch", str(tmp_path), "--wait", "-1"]) == 2


def test_a_stopped_run_shows_one_eps_and_singular_counts(scripted: tuple[Path, Script]) -> None:
    state = snapshot(scripted[0])
    assert state.status == "finished" and state.eps_live is not None
    text = _text(render(state))
    assert "EPS last round" in text and "this round" not in text
    running = dataclasses.replace(state, status="running", n_envs=1, episode_length=1)
    text = _text(render(running))
    assert "this round" in text  # the round in progress has its own, live EPS
    assert "1 env × 1 step" in text and "1 envs" not in text
