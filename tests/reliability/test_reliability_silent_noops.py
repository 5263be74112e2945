"""Options that used to do nothing, or fail late with the wrong exit class, are usage
errors (exit 2, one ``error:`` line, before training) or do what they say.

In-process through :func:`esper.cli.main` (no torch import per case); one subprocess
case shows the exit status as a user sees it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _reliability_support import (
    N_ENVS,
    assert_user_error,
    checkpoint_position,
    in_process,
    rows,
    run_esper,
    train_args,
    write_small_config,
)

from esper.cli import main as esper_main
from esper.config import MAX_ENVS

RUN_ID = "base"
BASE_ROUNDS = 2


USAGE_CASES: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "fault-env-missing": (
        ["--inject-fault", "nan:env=5,round=0,step=1"],
        ("nan:env=5", "env 5 does not exist", f"--envs {N_ENVS}"),
    ),
    "fault-round-not-run": (
        ["--inject-fault", "nan:env=0,round=9,step=1"],
        ("round 9 is not run", "rounds 0..1"),
    ),
    "fault-step-past-episode": (
        ["--inject-fault", "data_error:round=0,step=7"],
        ("step 7 is past the episode", "--episode-length 4"),
    ),
    "fault-field-unused": (
        ["--inject-fault", "policy_nan:round=0,env=1"],
        ("env does not apply to policy_nan",),
    ),
    "amp-on-cpu": (["--amp", "fp16"], ("--amp fp16", "needs a cuda device", "--amp off")),
    "continue-without-resume": (["--continue-run"], ("--continue-run needs --resume",)),
    "too-many-envs": (["--envs", "100000"], ("--envs", f"<= {MAX_ENVS}")),
}


@pytest.mark.parametrize("case", sorted(USAGE_CASES))
def test_silent_no_ops_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    extra, needles = USAGE_CASES[case]
    args = train_args(write_small_config(tmp_path), tmp_path / "tel", "x", *extra)
    assert_user_error(in_process(args, capsys), *needles)
    assert not (tmp_path / "tel").exists(), "refused before anything was written"


def test_too_many_envs_exits_2_before_training(tmp_path: Path) -> None:
    args = train_args(write_small_config(tmp_path), tmp_path / "tel", "x", "--envs", "100000")
    proc = run_esper(args)
    line = assert_user_error(proc, "--envs", str(MAX_ENVS))
    assert "checkpoint" not in proc.stderr, line
    assert not (tmp_path / "tel").exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-round run; its checkpoint resumes at round 2."""
    root = tmp_path_factory.mktemp("base")
    args = train_args(write_small_config(root), root / "tel", RUN_ID, rounds=BASE_ROUNDS)
    assert esper_main([*args, "--seed", "3"]) == 0
    return root / "tel" / RUN_ID


def test_resume_with_no_rounds_left_is_an_error(
    finished_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = finished_run / "checkpoint.pt"
    for rounds in ("1", str(BASE_ROUNDS)):
        proc = in_process(["train", "--resume", str(ckpt), "--rounds", rounds], capsys)
        assert_user_error(
            proc, "resumes at round 2", "total number of rounds", "nothing is left to run"
        )
    # Without --rounds the checkpoint's own total applies: nothing left either.
    assert_user_error(in_process(["train", "--resume", str(ckpt)], capsys), "nothing is left")


def test_resume_takes_the_checkpoints_config_and_picks_a_free_run_id(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only ``--resume`` and ``--rounds``: the task, envs, episode length, seed, policy size
    and telemetry directory come from the checkpoint; resuming twice gets a new id."""
    import shutil

    tel = tmp_path / "tel"
    shutil.copytree(finished_run.parent, tel)
    ckpt = tel / RUN_ID / "checkpoint.pt"
    rounds = BASE_ROUNDS + 1
    args = ["train", "--resume", str(ckpt), "--rounds", str(rounds), "--no-progress"]
    first = in_process(args, capsys)
    assert first.returncode == 0, first.stderr
    second = in_process(args, capsys)
    assert second.returncode == 0, second.stderr
    children = [f"{RUN_ID}-resume{BASE_ROUNDS}", f"{RUN_ID}-resume{BASE_ROUNDS}-2"]
    assert sorted(p.name for p in tel.iterdir()) == sorted([RUN_ID, *children])

    parent_cfg = json.loads(rows(tel / RUN_ID, "run_started")["config_json"][0])
    for child in children:
        started = rows(tel / child, "run_started")
        assert started["parent_run_id"].to_list() == [RUN_ID]
        cfg = json.loads(started["config_json"][0])
        assert cfg["run"].pop("rounds") == rounds and cfg["run"].pop("run_id") == child
        # The run directory holding the checkpoint says where telemetry goes (copied here).
        assert cfg["telemetry"].pop("dir") == str(tel)
        want = json.loads(json.dumps(parent_cfg))
        want["run"].pop("rounds"), want["run"].pop("run_id"), want["telemetry"].pop("dir")
        assert cfg == want
        assert sorted(rows(tel / child, "round_started")["round"].to_list()) == [BASE_ROUNDS]
        assert checkpoint_position(tel / child / "checkpoint.pt")[:2] == (child, rounds)


def test_resume_refuses_a_flag_that_changes_the_run(
    finished_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = finished_run / "checkpoint.pt"
    proc = in_process(["train", "--resume", str(ckpt), "--rounds", "5", "--seed", "4"], capsys)
    assert_user_error(proc, "another configuration", "$.run.seed", "checkpoint 3 vs now 4")
