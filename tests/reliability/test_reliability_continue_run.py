"""``--continue-run`` as an adversary tries it: a run killed during its close, a run that
stopped before its first checkpoint, a manifest of another run, a checkpoint copied into
another run's directory. Each either does the right thing or refuses (exit 2) before it
writes anything.

In-process through :func:`esper.cli.main` (no torch import per case).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from _reliability_support import (
    EPISODE_LENGTH,
    N_ENVS,
    assert_user_error,
    in_process,
    manifest,
    rows,
    train_args,
    write_small_config,
)
from esper_analysis import load_run
from esper_analysis.catalogue import entry

from esper.core.enums import RunStatus

ROUNDS = 2
RUN_ID = "victim"


def _data(run_dir: Path) -> dict[Path, bytes]:
    """Every file of a run directory but its lock file (whose owner record a refused
    attempt may rewrite)."""
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.suffix != ".lock"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config, telemetry dir) of a finished ROUNDS-round run."""
    root = tmp_path_factory.mktemp("finished")
    config = write_small_config(root)
    from esper.cli import main as esper_main

    assert esper_main(train_args(config, root / "tel", RUN_ID, rounds=ROUNDS)) == 0
    return config, root / "tel"


def _copy(finished: tuple[Path, Path], dest: Path) -> Path:
    shutil.copytree(finished[1], dest / "tel")
    return dest / "tel"


def _killed_during_close(run_dir: Path) -> None:
    """What a kill -9 during the final close leaves: every event on disk, the manifest
    still ``running`` (of a process that is gone)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    data = manifest(run_dir)
    data.update(status="running", pid=gone.pid, heartbeat_ns=0)
    (run_dir / "manifest.json").write_text(json.dumps(data))


def _continue(
    config: Path, tel: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> subprocess.CompletedProcess[str]:
    ckpt = tel / RUN_ID / "checkpoint.pt"
    args = train_args(config, tel, RUN_ID, "--resume", str(ckpt), "--continue-run", *extra)
    return in_process([*args, "--rounds", str(ROUNDS)], capsys)


def test_a_run_killed_during_its_close_is_closed_by_continue_run(
    finished: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tel = _copy(finished, tmp_path)
    run_dir = tel / RUN_ID
    _killed_during_close(run_dir)
    assert load_run(run_dir).status is RunStatus.CRASHED  # not finished: it never closed
    proc = _continue(finished[0], tel, capsys)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = load_run(run_dir)
    assert run.status is RunStatus.FINISHED and manifest(run_dir)["status"] == "finished"
    (done,) = rows(run_dir, "run_finished").iter_rows(named=True)
    assert done["rounds_completed"] == ROUNDS
    assert done["env_steps"] == ROUNDS * N_ENVS * EPISODE_LENGTH
    saved = rows(run_dir, "checkpoint_saved")["next_round"].to_list()
    assert saved == list(range(1, ROUNDS + 1))
    listed = entry(run)  # `esper runs` describes the whole run
    assert (listed.rounds, listed.rounds_planned, listed.env_steps) == (
        ROUNDS,
        ROUNDS,
        ROUNDS * N_ENVS * EPISODE_LENGTH,
    )
    # A cleanly finished run has nothing left to close: still refused.
    proc = _continue(finished[0], tel, capsys)
    assert_user_error(proc, "nothing is left to run")


def test_a_run_stopped_before_its_first_checkpoint_restarts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, tel = write_small_config(tmp_path), tmp_path / "tel"
    args = train_args(config, tel, RUN_ID, rounds=ROUNDS)
    failed = in_process([*args, "--inject-fault", "data_error:round=0,step=1"], capsys)
    assert failed.returncode == 1 and not (tel / RUN_ID / "checkpoint.pt").exists()
    refused = _continue(config, tel, capsys)
    assert_user_error(refused, "checkpoint not found", "without --resume and --continue-run")
    proc = in_process(args, capsys)  # the same command again
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = load_run(tel / RUN_ID)
    assert run.status is RunStatus.FINISHED and run.degraded == []
    assert rows(tel / RUN_ID, "run_started").height == 1
    assert sorted(rows(tel / RUN_ID, "round_finished")["round"].to_list()) == [0, 1]


def test_a_run_with_a_completed_round_is_never_restarted(
    finished: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tel = _copy(finished, tmp_path)
    before = _data(tel / RUN_ID)
    proc = in_process(train_args(finished[0], tel, RUN_ID, rounds=ROUNDS), capsys)
    assert_user_error(proc, "already has telemetry", "--resume", "--continue-run")
    assert _data(tel / RUN_ID) == before


def test_a_manifest_of_another_run_is_refused_before_writing(
    finished: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tel = _copy(finished, tmp_path)
    path = tel / RUN_ID / "manifest.json"
    data = json.loads(path.read_text())
    data.update(run_id="someone-else", status="interrupted")
    path.write_text(json.dumps(data))
    before = _data(tel / RUN_ID)
    proc = _continue(finished[0], tel, capsys)
    assert_user_error(proc, "belongs to run 'someone-else'", RUN_ID)
    assert _data(tel / RUN_ID) == before


def test_a_checkpoint_copied_into_another_runs_directory_is_refused(
    finished: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tel = _copy(finished, tmp_path)
    other = tel / "other"
    other.mkdir()
    shutil.copy(tel / RUN_ID / "checkpoint.pt", other / "checkpoint.pt")
    before = {d: _data(d) for d in (tel / RUN_ID, other)}
    args = train_args(finished[0], tel, "other", "--resume", str(other / "checkpoint.pt"))
    proc = in_process([*args, "--continue-run", "--rounds", str(ROUNDS + 1)], capsys)
    assert_user_error(proc, "--continue-run writes into the run directory", RUN_ID)
    assert {d: _data(d) for d in (tel / RUN_ID, other)} == before
