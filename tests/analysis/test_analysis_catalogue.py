"""``esper runs``: the catalogue of a telemetry directory, checked against scripted runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pytest
from _analysis_support import LENGTH, N_ENVS, ROUNDS, WALL_S, Script, run_started
from conftest import Crashed

from esper.cli import main
from esper.core.enums import RunStatus, TelemetryLevel
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
    broken = root / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    (root / "not-a-run").mkdir()
    return root


def _json_rows(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict[str, object]]:
    assert main(["runs", *args, "--json"]) == 0
    return {row["run_id"]: row for row in json.loads(capsys.readouterr().out)}


def test_catalogue_lists_every_run_with_known_values(
    telemetry_dir: Path, scripted: tuple[Path, Script], capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _json_rows(capsys, str(telemetry_dir))
    assert set(rows) == {"scripted", "crashed", "child", "broken"}
    script = scripted[1]
    done = rows["scripted"]
    assert (done["status"], done["task"], done["policy"]) == ("finished", "digits", "ppo")
    assert (done["rounds"], done["rounds_planned"]) == (ROUNDS, ROUNDS)
    assert done["env_steps"] == ROUNDS * N_ENVS * LENGTH
    assert done["eps"] == pytest.approx(N_ENVS * LENGTH / WALL_S)
    last = [script.episode_reward[(ROUNDS - 1, e)] for e in range(N_ENVS)]
    assert done["final_mean_reward"] == pytest.approx(sum(last) / N_ENVS)
    assert done["parent_run_id"] is None


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
