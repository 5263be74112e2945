"""Event counts and baseline regression checks, through the API and the CLI."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from _analysis_support import LENGTH, N_ENVS, ROUNDS, Script, emit_run
from conftest import Crashed, copy_run
from esper_analysis.baseline import (
    DEFAULT_RULES,
    capture_baseline,
    check_baseline,
    read_baseline,
    write_baseline,
)
from esper_analysis.cli import main
from esper_analysis.counts import event_counts
from esper_analysis.errors import BaselineError
from esper_analysis.loader import load_run

from esper.telemetry import events as ev


def extra_stage_change() -> ev.SeedStageChanged:
    """One more event than the script (a fresh object: emitted events cannot be re-sent)."""
    return ev.SeedStageChanged(
        round=1, env=0, step=5, slot="r0c0", seed_id="seed-c", blueprint="conv_small",
        from_stage="TRAINING", to_stage="BLENDING", epochs_in_prev_stage=3, alpha=0.1,
        initiator="policy",
    )  # fmt: skip


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_counts_match_the_script(scripted: tuple[Path, Script]) -> None:
    path, script = scripted
    counts = event_counts(load_run(path))
    expected = script.expected_counts()
    got = dict(zip(counts.by_type["type"], counts.by_type["events"], strict=True))
    assert got == expected
    assert counts.by_type["manifest"].to_list() == counts.by_type["events"].to_list()
    assert counts.total == sum(expected.values())
    assert counts.env_steps == ROUNDS * N_ENVS * LENGTH
    env_rounds = counts.by_round.filter(type="env_step")
    assert env_rounds["round"].to_list() == list(range(ROUNDS))
    assert env_rounds["events"].to_list() == [N_ENVS * LENGTH] * ROUNDS
    assert counts.by_env.filter(type="action_taken")["events"].to_list() == [ROUNDS * LENGTH] * 2
    assert counts.by_step.filter(type="reward_computed")["events"].to_list() == [4] * LENGTH
    per_step = counts.by_type.filter(type="reward_computed")["per_env_step"].item()
    assert per_step == pytest.approx(1.0)
    assert counts.by_round.filter(type="governor_rollback")["events"].to_list() == [1, 1]


def test_identical_reemission_matches_and_one_extra_event_drifts(
    scripted_run: Path, runs_root: Path, tmp_path: Path
) -> None:
    baseline_file = tmp_path / "baseline.json"
    data = write_baseline(load_run(scripted_run), baseline_file)
    assert read_baseline(baseline_file) == data
    assert data["fingerprint"]["config_hash"] == "cfg-abc123"
    assert data["fingerprint"]["seed"] == 7
    assert set(data["rules"]) == set(DEFAULT_RULES)
    rerun, _ = emit_run(runs_root, "rerun")
    same = check_baseline(load_run(rerun), data)
    assert same.ok, same.drift
    assert set(same.types["status"]) == {"ok"}
    extra, _ = emit_run(runs_root, "extra", extra=(extra_stage_change(),))
    drift = check_baseline(load_run(extra), data)
    assert not drift.ok
    assert drift.drifted_types == ["seed_stage_changed"]
    rows = drift.drift.to_dicts()
    assert {"dimension": "total", "expected": "7", "got": "8", "rule": "exact"}.items() <= rows[
        0
    ].items()
    assert {(r["dimension"], r["key"]) for r in rows} == {
        ("total", ""),
        ("round", "1"),
        ("env", "0"),
    }
    assert "seed_stage_changed" in drift.message()


def test_stochastic_types_follow_their_declared_rule(scripted_run: Path, runs_root: Path) -> None:
    data = capture_baseline(load_run(scripted_run))
    data["counts"]["writer_stats"] = 3  # presence: any positive count matches
    anomaly = ev.AnomalyDetected(
        round=1, kind="kl_spike", detail="", value=1.0, threshold=0.5, escalated=False
    )
    noisy, _ = emit_run(runs_root, "noisy", extra=(anomaly,))
    check = check_baseline(load_run(noisy), data)
    assert check.ok, check.drift
    rules = dict(zip(check.types["type"], check.types["rule"], strict=True))
    assert rules["writer_stats"] == "presence"
    assert rules["anomaly_detected"].startswith("tolerance")
    data["rules"]["anomaly_detected"] = {"kind": "exact", "rel_tol": 0, "abs_tol": 0, "why": "x"}
    assert check_baseline(load_run(noisy), data).drifted_types == ["anomaly_detected"]


def test_config_fingerprint_change_is_drift(scripted_run: Path) -> None:
    data = capture_baseline(load_run(scripted_run))
    data["fingerprint"]["seed"] = 8
    check = check_baseline(load_run(scripted_run), data)
    assert not check.ok
    assert check.fingerprint_drift == ["seed"]


def test_crashed_run_drifts_from_the_finished_baseline(
    scripted_run: Path, crashed: Crashed
) -> None:
    check = check_baseline(load_run(crashed.path), capture_baseline(load_run(scripted_run)))
    assert not check.ok
    assert "run_finished" in check.drifted_types


def test_baseline_file_errors(tmp_path: Path) -> None:
    with pytest.raises(BaselineError, match="does not exist"):
        read_baseline(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(BaselineError, match="not an esper event baseline"):
        read_baseline(bad)


def test_cli_exit_codes(scripted_run: Path, runs_root: Path, tmp_path: Path) -> None:
    baseline = tmp_path / "b.json"
    code, out, _ = _cli("baseline", "capture", str(scripted_run), "-o", str(baseline))
    assert code == 0 and baseline.exists() and "written" in out
    code, out, _ = _cli("baseline", "check", str(scripted_run), "--baseline", str(baseline))
    assert code == 0 and "OK:" in out
    extra, _ = emit_run(runs_root, "extra_cli", extra=(extra_stage_change(),))
    code, out, _ = _cli("baseline", "check", str(extra), "--baseline", str(baseline), "--json")
    assert code == 1
    result = json.loads(out)
    assert result["summary"]["drifted_types"] == ["seed_stage_changed"]
    code, out, err = _cli("baseline", "check", str(scripted_run), "--baseline", str(tmp_path / "x"))
    assert code == 2 and err.startswith("error: baseline file") and err.count("\n") == 1
    code, _, err = _cli("counts", str(tmp_path / "no-such-run"))
    assert code == 2 and err == f"error: run directory {tmp_path / 'no-such-run'} does not exist\n"
    code, _, _ = _cli("counts")  # missing RUN: argparse usage error
    assert code == 2
    assert _cli("--help")[0] == 0


def test_cli_reports_user_errors_without_traceback(scripted_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(scripted_run, tmp_path / "corrupt")
    victim = next((run_dir / "events" / "type=env_step").rglob("*.parquet"))
    victim.write_bytes(b"garbage")
    code, out, err = _cli("counts", str(run_dir))
    assert code == 2 and out == ""
    assert err.startswith("error: corrupt Parquet file") and str(victim) in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_cli_tables_and_json_for_every_analysis(scripted_run: Path, crashed: Crashed) -> None:
    for command in ("counts", "rewards", "rollbacks", "lifecycles", "actions", "ppo", "throughput"):
        code, out, err = _cli(command, str(scripted_run))
        assert code == 0 and err == "", (command, err)
        assert "run scripted (finished)" in out
        code, out, _ = _cli(command, str(scripted_run), "--json")
        assert code == 0
        assert json.loads(out)["run"]["status"] == "finished"
    code, out, err = _cli("counts", str(crashed.path), "--json")
    assert code == 0
    assert err.startswith("warning: run crashed is crashed: recovered")
    assert json.loads(out)["run"]["recovery"]["events"] == crashed.durable_events


def test_cli_names_a_file_whose_data_pages_are_corrupt(scripted_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(scripted_run, tmp_path / "bad_pages")
    victim = next((run_dir / "events" / "type=reward_computed").rglob("*.parquet"))
    data = bytearray(victim.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    for i in range(8, len(data) - 8 - footer):  # data pages only: the footer stays readable
        data[i] = (data[i] * 7 + 3) % 256
    victim.write_bytes(bytes(data))
    code, out, err = _cli("rewards", str(run_dir))
    assert code == 2 and out == ""
    assert err.startswith(f"error: corrupt Parquet data in {victim}")
    assert err.count("\n") == 1
