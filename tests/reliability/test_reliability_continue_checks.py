"""``--continue-run`` checks a run before it changes it (issue 48, cases 1-3, 7-9).

A continued run that reads as clean and finished must be one: a lost part, another
run's part, another run of the same id or an unreadable part is refused (exit 2, one
line naming the file or the gap, not one byte changed); a run killed before its first
checkpoint restarts; a continued run's EPS covers every session.

In-process through :func:`esper.cli.main` (no torch import per case).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from _reliability_support import (
    assert_user_error,
    checkpoint_position,
    in_process,
    manifest,
    rows,
    train_args,
    write_small_config,
)
from esper_analysis import load_run, throughput
from esper_analysis.catalogue import entry

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run
from esper.telemetry.paths import part_name, type_rank_dir

RUN_ID = "victim"
#: The failed run: rounds planned, and the round whose step 1 fails (its checkpoint
#: resumes there, and that round's first step lies past the checkpoint).
ROUNDS = 3
FAILED_ROUND = 2
#: How far a close-only continue's EPS may lie from the run's (the killed close's time,
#: a few percent of a round here, is in no checkpoint).
CLOSE_ONLY_EPS_TOLERANCE = 0.25


def _data(run_dir: Path) -> dict[Path, bytes]:
    """Every file of a run directory but its lock file."""
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.suffix != ".lock"}


def _as_killed(run_dir: Path) -> None:
    """What a kill -9 leaves in the manifest: ``running``, of a process that is gone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    data = manifest(run_dir)
    data.update(status="running", pid=gone.pid, heartbeat_ns=0)
    (run_dir / "manifest.json").write_text(json.dumps(data))


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config, telemetry dir) of a run that failed in round FAILED_ROUND, its
    checkpoint resuming there."""
    root = tmp_path_factory.mktemp("failed")
    config = write_small_config(root)
    from esper.cli import main as esper_main

    fault = f"data_error:round={FAILED_ROUND},step=1"
    args = train_args(config, root / "tel", RUN_ID, "--inject-fault", fault, rounds=ROUNDS)
    assert esper_main(args) == 1
    assert checkpoint_position(root / "tel" / RUN_ID / "checkpoint.pt")[1] == FAILED_ROUND
    return config, root / "tel"


def _copy(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    return dest


def _continue(
    config: Path, tel: Path, capsys: pytest.CaptureFixture[str], *, rounds: int = ROUNDS
) -> subprocess.CompletedProcess[str]:
    ckpt = tel / RUN_ID / "checkpoint.pt"
    args = train_args(config, tel, RUN_ID, "--resume", str(ckpt), "--continue-run", rounds=rounds)
    return in_process(args, capsys)


def _env_step_file(run_dir: Path) -> Path:
    (path,) = sorted(type_rank_dir(run_dir, "env_step", 0).glob("part-*.parquet"))
    return path


def _foreign_env_steps(root: Path) -> Path:
    """The env_step file of another run (run id ``other``)."""
    with open_run(root, "other", level=TelemetryLevel.NORMAL) as hub:
        for step in range(4):
            hub.emit(
                ev.EnvStep(
                    step=step, train_loss=1.0, train_acc=0.5, val_loss=1.0, val_acc=0.5,
                    active_seeds=0, host_params=10, seed_params=0, train_ms=1.0, val_ms=1.0,
                    features_ms=1.0, policy_ms=1.0,
                )
            )  # fmt: skip
    return _env_step_file(root / "other")


def test_a_lost_part_is_a_gap_that_refuses_to_continue(
    failed: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Case 1: a lost part used to become a clean finished run missing its events."""
    tel = _copy(failed[1], tmp_path / "tel")
    run_dir = tel / RUN_ID
    _as_killed(run_dir)
    _env_step_file(run_dir).unlink()
    before = _data(run_dir)
    proc = _continue(failed[0], tel, capsys)
    assert_user_error(proc, "missing", "seq", "nothing was changed", "--continue-run")
    assert _data(run_dir) == before


@pytest.mark.parametrize("covering", [False, True], ids=["beyond-the-run", "covering-the-run"])
def test_another_runs_part_is_refused_by_the_run_id_in_its_data(
    failed: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    covering: bool,
) -> None:
    """Case 2: another run's part under a part name was merged in (and, named to cover
    the run's own range, it superseded the run's own part, which was deleted)."""
    tel = _copy(failed[1], tmp_path / "tel")
    run_dir = tel / RUN_ID
    name = part_name(0, 10**9) if covering else part_name(90_000, 90_100)
    target = type_rank_dir(run_dir, "env_step", 0) / name
    shutil.copy(_foreign_env_steps(tmp_path / "elsewhere"), target)
    before = _data(run_dir)
    proc = _continue(failed[0], tel, capsys)
    assert_user_error(proc, name, "'other'", "nothing was changed")
    assert _data(run_dir) == before


def test_another_run_of_the_same_id_is_refused_by_its_config_hash(
    failed: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Case 3: a run of another config under the same id, this run's checkpoint copied
    in, used to be continued (two run_started with different seeds, a round missing)."""
    config, tel = failed
    other = tmp_path / "tel"
    done = in_process(train_args(config, other, RUN_ID, "--seed", "4", rounds=1), capsys)
    assert done.returncode == 0, done.stderr[-3000:]
    shutil.copy(tel / RUN_ID / "checkpoint.pt", other / RUN_ID / "checkpoint.pt")
    before = _data(other / RUN_ID)
    proc = _continue(config, other, capsys)
    assert_user_error(proc, "config", "nothing was changed")
    assert _data(other / RUN_ID) == before


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_an_unreadable_part_is_refused_before_anything_is_rewritten(
    failed: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: str,
) -> None:
    """Case 9: continue used to rewrite 10-13 files, then exit 1 with ArrowInvalid."""
    tel = _copy(failed[1], tmp_path / "tel")
    run_dir = tel / RUN_ID
    _as_killed(run_dir)
    victim = _env_step_file(run_dir)
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"PAR1 garbage")
    before = _data(run_dir)
    proc = _continue(failed[0], tel, capsys)
    assert_user_error(proc, victim.name, "nothing was changed")
    assert _data(run_dir) == before


def test_a_clean_continue_still_works(
    failed: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tel = _copy(failed[1], tmp_path / "tel")
    proc = _continue(failed[0], tel, capsys)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = load_run(tel / RUN_ID)
    assert run.status is RunStatus.FINISHED and run.degraded == []
    assert sorted(rows(tel / RUN_ID, "round_finished")["round"].to_list()) == list(range(ROUNDS))


def test_a_continued_runs_eps_covers_every_session(
    failed: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Case 7: run_finished divided the whole run's env-steps by the last session's
    wall time (1.8e7 EPS after a continue that only closed the run)."""
    tel = _copy(failed[1], tmp_path / "tel")
    run_dir = tel / RUN_ID
    # Round FAILED_ROUND left to run: a session that runs one round of three.
    proc = _continue(failed[0], tel, capsys)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (done,) = rows(run_dir, "run_finished").iter_rows(named=True)
    rounds_wall = float(rows(run_dir, "round_finished")["wall_s"].sum())
    assert done["rounds_completed"] == ROUNDS
    assert done["wall_s"] >= rounds_wall  # every session's rounds, not the last one's
    assert done["eps"] == pytest.approx(done["env_steps"] / done["wall_s"])
    run = load_run(run_dir)
    assert entry(run).eps == pytest.approx(done["eps"])  # `esper runs`
    assert throughput(run).eps == pytest.approx(done["eps"])  # analyze throughput, report
    # A continue that only closes the run (killed during its close) keeps the figures
    # (up to the killed close's own time, which no checkpoint recorded).
    _as_killed(run_dir)
    proc = _continue(failed[0], tel, capsys)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (closed,) = rows(run_dir, "run_finished").iter_rows(named=True)
    assert closed["env_steps"] == done["env_steps"]
    assert closed["wall_s"] >= rounds_wall
    assert closed["eps"] == pytest.approx(done["eps"], rel=CLOSE_ONLY_EPS_TOLERANCE)


def _killed_before_its_first_checkpoint(
    config: Path, tel: Path, capsys: pytest.CaptureFixture[str]
) -> Path:
    """Round 0's events on disk, no checkpoint.pt (a kill -9 in round 1 before a save)."""
    fault = "data_error:round=1,step=1"
    args = train_args(config, tel, RUN_ID, "--inject-fault", fault, rounds=2)
    assert in_process(args, capsys).returncode == 1
    run_dir = tel / RUN_ID
    (run_dir / "checkpoint.pt").unlink()
    _as_killed(run_dir)
    assert rows(run_dir, "episode_finished").height > 0
    return run_dir


def test_a_run_killed_before_its_first_checkpoint_restarts_with_the_same_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Case 8: the same command said "already has telemetry ... choose another run id",
    and there was no checkpoint to continue."""
    config, tel = write_small_config(tmp_path), tmp_path / "tel"
    run_dir = _killed_before_its_first_checkpoint(config, tel, capsys)
    proc = in_process(train_args(config, tel, RUN_ID, rounds=2), capsys)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = load_run(run_dir)
    assert run.status is RunStatus.FINISHED and run.degraded == []
    assert rows(run_dir, "run_started").height == 1
    assert sorted(rows(run_dir, "round_finished")["round"].to_list()) == [0, 1]


def test_a_run_killed_before_its_first_checkpoint_names_the_flag_for_another_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, tel = write_small_config(tmp_path), tmp_path / "tel"
    run_dir = _killed_before_its_first_checkpoint(config, tel, capsys)
    before = _data(run_dir)
    proc = in_process(train_args(config, tel, RUN_ID, "--seed", "5", rounds=2), capsys)
    assert_user_error(proc, "no checkpoint", "--run-id")
    assert _data(run_dir) == before
