"""Every baseline is a policy of the CLI and the Python API: selected by ``--policy`` (or
``policy.kind``), run through the same loop, and recorded in ``run_started``."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from esper_analysis import load_run

from esper.cli import main as esper_main
from esper.config import Config, with_overrides
from esper.core.enums import PolicyKind, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.memory_hub import MemoryHub
from esper.training.run import train

TINY = ("--envs", "2", "--rounds", "1", "--episode-length", "4", "--seed", "0", "--no-progress")


def _started(run_dir: Path) -> dict[str, object]:
    row: dict[str, object] = load_run(run_dir).scan("run_started").collect().row(0, named=True)
    return row


@pytest.mark.parametrize("kind", [k.value for k in PolicyKind if not k.learned])
def test_train_policy_selects_a_baseline_and_records_it(tmp_path: Path, kind: str) -> None:
    code = esper_main(
        ["train", "--policy", kind, *TINY, "--telemetry-dir", str(tmp_path), "--run-id", kind]
    )
    assert code == 0
    started = _started(tmp_path / kind)
    assert started["policy_kind"] == kind
    assert json.loads(str(started["config_json"]))["policy"]["kind"] == kind
    run = load_run(tmp_path / kind)
    assert run.rows_on_disk("ppo_update") == 0  # baselines do not learn
    assert run.rows_on_disk("action_taken") == 2 * 4  # the same per-step telemetry
    ops = run.scan("action_taken").select("op").collect()["op"].to_list()
    if kind == "static":
        assert set(ops) == {"WAIT"} and run.rows_on_disk("seed_germinated") == 0
    if kind == "eager":  # grows at the first decision of every env
        germinated = run.scan("seed_germinated").select("step", "env").collect()
        assert germinated.filter(pl.col("step") == 0)["env"].sort().to_list() == [0, 1]


def test_the_heuristic_command_is_an_alias_and_refuses_another_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert esper_main(["heuristic", *TINY, "--telemetry-dir", str(tmp_path), "--run-id", "h"]) == 0
    assert _started(tmp_path / "h")["policy_kind"] == "heuristic"
    capsys.readouterr()
    assert esper_main(["heuristic", "--policy", "eager", *TINY]) == 2
    assert "use esper train --policy eager" in capsys.readouterr().err


def test_a_config_file_policy_kind_is_kept_unless_a_flag_overrides_it(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(
        '[policy]\nkind = "static"\n[run]\nn_envs = 1\nrounds = 1\nepisode_length = 3\n'
    )
    base = ("--config", str(config), "--telemetry-dir", str(tmp_path), "--no-progress")
    assert esper_main(["train", *base, "--run-id", "file"]) == 0
    assert _started(tmp_path / "file")["policy_kind"] == "static"
    assert esper_main(["train", *base, "--run-id", "flag", "--policy", "random"]) == 0
    assert _started(tmp_path / "flag")["policy_kind"] == "random"


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        (
            "--policy",
            "eagr",
            "choose from ppo, heuristic, eager, random, static; did you mean 'eager'",
        ),
        ("--task", "digit", "choose from digits, cifar10, synthetic, text; did you mean 'digits'"),
    ],
)
def test_a_bad_choice_lists_the_valid_values_and_the_nearest(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, expected: str
) -> None:
    assert esper_main(["train", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag}: ") and expected in err


def test_a_dataset_task_without_a_path_says_what_to_download_and_where(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert esper_main(["train", "--task", "cifar10"]) == 2
    err = capsys.readouterr().err
    assert "--data-path" in err and "cifar-10-binary.tar.gz" in err and "data_batch_1.bin" in err
    assert "https://www.cs.toronto.edu/~kriz/cifar.html" in err
    assert esper_main(["train", "--task", "text"]) == 2
    assert "a local text file" in capsys.readouterr().err


def test_the_python_api_runs_every_policy_kind(tmp_path: Path) -> None:
    """``train(config)`` builds the policy ``policy.kind`` names; no injection needed."""
    cfg = with_overrides(
        Config(),
        {"run.n_envs": 1, "run.rounds": 1, "run.episode_length": 3, "telemetry.dir": str(tmp_path)},
    )
    for kind in ("eager", "random"):
        hub = MemoryHub(run_id=kind, level=TelemetryLevel.NORMAL)
        train(with_overrides(cfg, {"policy.kind": kind}), telemetry=hub, save=tmp_path / "c.pt")
        started = [e for e in hub.events if isinstance(e, ev.RunStarted)]
        assert [e.policy_kind for e in started] == [kind]


def test_the_run_summary_names_every_path_absolutely(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--policy", "static", *TINY, "--telemetry-dir", "runs", "--run-id", "s"]
    assert esper_main([*argv, "--report"]) == 0
    out = capsys.readouterr().out
    run_dir = tmp_path / "runs" / "s"
    for line in (
        f"run directory: {run_dir}",
        f"checkpoint: {run_dir / 'checkpoint.pt'}",
        f"report: {run_dir / 'report.html'}",
    ):
        assert line in out.splitlines(), out
