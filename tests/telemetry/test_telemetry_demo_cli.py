"""The demo covers every event type; the CLI reports errors as one line."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _telemetry_support import all_seqs, read_type

from esper.cli import main
from esper.core.enums import RunStatus
from esper.telemetry.demo import DemoSettings, run_demo
from esper.telemetry.events import EVENT_TYPES
from esper.telemetry.manifest import read_manifest
from esper.telemetry.paths import manifest_path


def test_demo_emits_every_event_type_consistently(tmp_path: Path) -> None:
    result = run_demo(tmp_path, "demo", DemoSettings(flush_interval_s=0.1))
    assert set(result.counts) == set(EVENT_TYPES)
    run_dir = result.run_dir
    settings = DemoSettings()
    steps = settings.envs * settings.rounds * settings.steps
    for tag in ("env_step", "action_taken", "reward_computed", "counterfactual_computed"):
        assert result.counts[tag] == steps
    assert result.counts["episode_finished"] == settings.envs * settings.rounds
    assert result.counts["governor_rollback"] == 1
    for row in read_type(run_dir, "reward_computed"):
        parts = [v for k, v in row.items() if k not in _NOT_COMPONENTS]
        assert math.isclose(sum(parts), row["total"], abs_tol=1e-9)
    rollback = read_type(run_dir, "governor_rollback")[0]
    assert rollback["penalized_step"] == max(rollback["step"] - 1, 0)
    where = (rollback["round"], rollback["env"], rollback["penalized_step"])
    rewards = read_type(run_dir, "reward_computed")
    penalised = [r for r in rewards if (r["round"], r["env"], r["step"]) == where]
    assert [r["rollback_penalty"] for r in penalised] == [rollback["penalty"]]
    assert sum(1 for r in rewards if r["rollback_penalty"] != 0.0) == 1
    (episode,) = [
        e
        for e in read_type(run_dir, "episode_finished")
        if (e["round"], e["env"]) == (rollback["round"], rollback["env"])
    ]
    assert episode["rollbacks"] == 1 and episode["rollback_penalty"] == rollback["penalty"]
    seqs = all_seqs(run_dir)
    assert sorted(seqs) == list(range(len(seqs)))
    manifest = read_manifest(manifest_path(run_dir, 0))
    assert manifest.status == RunStatus.FINISHED.value


_NOT_COMPONENTS = {
    "run_id", "seq", "ts_ns", "rank", "round", "env", "step", "family", "op", "total",
    "normalized",
}  # fmt: skip


def test_demo_is_deterministic_apart_from_time(tmp_path: Path) -> None:
    a = run_demo(tmp_path, "a", DemoSettings(seed=3, rounds=2))
    b = run_demo(tmp_path, "b", DemoSettings(seed=3, rounds=2))
    assert a.counts == b.counts
    volatile = {"run_id", "ts_ns", "wall_s", "eps", "train_ms", "val_ms", "policy_ms"}
    volatile |= {"action_ms", "ppo_ms", "platform", "bytes_written", "blocked_ns", "flushes"}
    volatile |= {"max_queue_depth", "events_written"}
    for tag in a.counts:
        rows_a = [
            {k: v for k, v in r.items() if k not in volatile} for r in read_type(a.run_dir, tag)
        ]
        rows_b = [
            {k: v for k, v in r.items() if k not in volatile} for r in read_type(b.run_dir, tag)
        ]
        assert repr(rows_a) == repr(rows_b), tag


def test_cli_demo_prints_counts_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["telemetry-demo", "--telemetry-dir", str(tmp_path), "--run-id", "d", "--rounds", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "d") in out and "seed_germinated" in out and "total" in out
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--force" in err and "Traceback" not in err
    assert main([*args, "--force"]) == 0


def test_cli_rejects_bad_run_id_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["telemetry-demo", "--telemetry-dir", str(tmp_path), "--run-id", "../up"])
    assert code == 2
    err = capsys.readouterr().err
    assert "error: invalid run id '../up'" in err and "Traceback" not in err
    assert main(["telemetry-demo", "--telemetry-dir", str(tmp_path), "--level", "loud"]) == 2
    assert main([]) == 2
    assert main(["--version"]) == 0


def test_ctrl_c_exits_130_and_records_interrupted(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "esper", "telemetry-demo", "--telemetry-dir", str(tmp_path),
         "--run-id", "long", "--rounds", "100000", "--envs", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    manifest = tmp_path / "long" / "manifest.json"
    deadline = time.monotonic() + 60
    while not manifest.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert b"Traceback" not in err
    assert read_manifest(manifest).status == RunStatus.INTERRUPTED.value
    assert read_type(tmp_path / "long", "writer_stats")  # closed cleanly


def test_analyze_forwards_its_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "--help"]) == 0
    assert "usage: esper analyze" in capsys.readouterr().out
    run_demo(tmp_path, "fwd", DemoSettings(rounds=2))
    assert main(["analyze", "rollbacks", str(tmp_path / "fwd")]) == 0
    assert "fwd" in capsys.readouterr().out
