"""``esper runs``: the catalogue of a telemetry directory, checked against scripted runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pytest
from _analysis_support import LENGTH, N_ENVS, ROUNDS, SEED, WALL_S, Script, run_started
from conftest import Crashed

from esper.cli import main
from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run


@pytest.fixture(scope="module")
def telemetry_dir(
    scripted: tuple[Path, Script], crashed: Crashed, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    root = tmp_path_factory.mktemp("catalogue")
    shutil.copytree(scripted[0], root / "scripted")
    shutil.copytree(crashed.path, root / "crashed")
    hub = open_run(root, "child", level=TelemetryLevel.NORMAL, config_hash="c")
    hub.emit(msgspec.structs.replace(run_started(), parent_run_id="scripted"))
    hub.close(RunStatus.INTERRUPTED)
    _resumed(root)
    off = root / "off-s0"  # --telemetry-level off: the checkpoint and nothing else
    off.mkdir()
    (off / "checkpoint.pt").write_bytes(b"not read")
    broken = root / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    (root / "not-a-run").mkdir()
    return root


def _round(r: int) -> ev.RoundFinished:
    return ev.RoundFinished(
        round=r, wall_s=1.0, eps=2.0, mean_episode_reward=0.5, mean_final_accuracy=80.0 + r,
        rollbacks=0, train_ms=0.0, val_ms=0.0, policy_ms=0.0, action_ms=0.0, ppo_ms=0.0,
    )  # fmt: skip


def _resumed(root: Path) -> None:
    """``long`` ran round 0 of 3, ``long-resume1`` resumed it for rounds 1-2; ``cont``
    ran round 0 and was continued (--continue-run) for round 1."""
    started = msgspec.structs.replace(run_started(), rounds=3)
    for run_id, first, parent, rounds in (
        ("long", -1, "", [0]),
        ("long-resume1", 1, "long", [1, 2]),
    ):
        hub = open_run(root, run_id, level=TelemetryLevel.NORMAL, config_hash="c")
        hub.emit(msgspec.structs.replace(started, parent_run_id=parent, resumed_from_round=first))
        for r in rounds:
            hub.emit(_round(r))
        hub.close(RunStatus.FINISHED)
    hub = open_run(root, "cont", level=TelemetryLevel.NORMAL, config_hash="c")
    hub.emit(msgspec.structs.replace(started))
    hub.emit(_round(0))
    hub.emit(msgspec.structs.replace(started, resumed_from_round=1))
    hub.emit(_round(1))
    hub.close(RunStatus.FINISHED)


def _json_rows(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict[str, object]]:
    assert main(["runs", *args, "--json"]) == 0
    return {row["run_id"]: row for row in json.loads(capsys.readouterr().out)}


def test_catalogue_lists_every_run_with_known_values(
    telemetry_dir: Path, scripted: tuple[Path, Script], capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _json_rows(capsys, str(telemetry_dir))
    assert set(rows) == {"scripted", "crashed", "child", "broken", "off-s0", "long",
                         "long-resume1", "cont"}  # fmt: skip
    script = scripted[1]
    done = rows["scripted"]
    assert (done["status"], done["task"], done["policy"]) == ("finished", "digits", "ppo")
    assert (done["rounds"], done["rounds_planned"]) == (ROUNDS, ROUNDS)
    assert done["env_steps"] == ROUNDS * N_ENVS * LENGTH
    assert done["eps"] == pytest.approx(N_ENVS * LENGTH / WALL_S)
    last = [script.episode_reward[(ROUNDS - 1, e)] for e in range(N_ENVS)]
    assert done["final_mean_reward"] == pytest.approx(sum(last) / N_ENVS)
    assert done["parent_run_id"] is None
    assert (done["seed"], done["envs"], done["family"]) == (SEED, N_ENVS, None)
    assert done["final_accuracy"] == pytest.approx(60.5 + 10 * (ROUNDS - 1))


def test_catalogue_joins_resumed_runs_to_their_parent_and_lists_runs_without_events(
    telemetry_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finished run resumed without --continue-run read "2/3" and named no parent;
    a --telemetry-level off run was not listed at all (issue 49)."""
    rows = _json_rows(capsys, str(telemetry_dir))
    child = rows["long-resume1"]
    assert (child["rounds"], child["rounds_total"], child["rounds_planned"]) == (2, 3, 3)
    assert child["lineage"] == "resumed from long at round 1"
    assert rows["cont"]["lineage"] == "continued at round 1" and rows["cont"]["rounds"] == 2
    off = rows["off-s0"]
    assert off["status"] == "no telemetry" and "checkpoint.pt" in off["error"]
    assert main(["runs", str(telemetry_dir)]) == 0
    out = capsys.readouterr().out
    assert "3/3" in out and "resumed from long at round 1" in out
    assert "off-s0: no events, only checkpoint.pt (telemetry level off)" in " ".join(out.split())


def test_catalogue_of_crashed_child_and_unreadable_runs(
    telemetry_dir: Path, scripted: tuple[Path, Script], capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _json_rows(capsys, str(telemetry_dir))
    crashed = rows["crashed"]  # round 0 durable, round 1 lost in the kill
    assert crashed["status"] == "crashed"
    assert (crashed["rounds"], crashed["env_steps"]) == (1, N_ENVS * LENGTH)
    first = [scripted[1].episode_reward[(0, e)] for e in range(N_ENVS)]
    assert crashed["final_mean_reward"] == pytest.approx(sum(first) / N_ENVS)
    assert rows["child"]["parent_run_id"] == "scripted"
    assert rows["child"]["status"] == "interrupted"
    assert rows["child"]["rounds"] is None
    assert rows["broken"]["status"] == "unreadable"
    assert "manifest" in str(rows["broken"]["error"])


def test_catalogue_table_and_several_dirs(
    telemetry_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", str(telemetry_dir / "scripted"), str(telemetry_dir / "child")]) == 0
    out = capsys.readouterr().out
    for text in ("id", "env-steps", "EPS", "final mean reward", "final acc %", "seed", "envs"):
        assert text in out
    assert "2/2" in out and "resumed from scripted" in out  # the child names its parent
    assert "crashed" not in out


def test_catalogue_of_a_missing_dir_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err
