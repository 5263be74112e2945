"""Faults through the real ``esper train`` CLI: NaN in one env, NaN in the policy loss,
a data-loader error, a full disk under the telemetry writer, and Ctrl-C.

Each failure must be clear (one ``error:``/``interrupted`` line, no traceback), lose no
recorded event, leave a readable run that says what happened, and keep a checkpoint.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _reliability_support import (
    N_ENVS,
    PROCESS_TIMEOUT_S,
    checkpoint_position,
    cli_env,
    manifest,
    read_emit_log,
    rows,
    run_esper,
    run_seqs,
    start_esper,
    train_args,
    wait_for,
    write_small_config,
)
from esper_analysis import load_run

from esper.core.enums import RunStatus
from esper.telemetry.emit_log import EMIT_LOG_ENV
from esper.telemetry.paths import part_name

NAN_ENV, NAN_ROUND, NAN_STEP = 1, 1, 2


@pytest.fixture(scope="module")
def faulted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-round run with NaN in env 1's host loss (round 1) and in round 0's PPO loss."""
    root = tmp_path_factory.mktemp("faulted")
    config = write_small_config(root)
    args = train_args(
        config,
        root / "tel",
        "faulted",
        "--inject-fault",
        f"nan:env={NAN_ENV},round={NAN_ROUND},step={NAN_STEP}",
        "--inject-fault",
        "policy_nan:round=0",
        rounds=2,
    )
    proc = run_esper(args, env=cli_env(**{EMIT_LOG_ENV: str(root / "emitted.txt")}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return root / "tel" / "faulted"


def test_the_emission_side_channel_is_exact(faulted: Path) -> None:
    """What the crash tests compare with: one line per recorded event, nothing else. The
    final ``writer_stats`` is appended by the hub's close, past the wrapper; the policy
    NaN's debug escalation goes through the wrapper's ``set_level``."""
    logged = [seq for seq, _ in read_emit_log(faulted.parent.parent / "emitted.txt")]
    on_disk = run_seqs(load_run(faulted))
    assert logged == sorted(set(logged))
    stats_seq = rows(faulted, "writer_stats")["seq"].to_list()
    assert sorted([*logged, *stats_seq]) == on_disk
    assert rows(faulted, "telemetry_level_changed").height >= 1


def _analyze(kind: str, run_dir: Path) -> dict:
    proc = run_esper(["analyze", kind, str(run_dir), "--json"])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_nan_in_one_env_rolls_back_that_env_only(faulted: Path) -> None:
    rb = rows(faulted, "governor_rollback")
    assert rb.height == 1
    row = rb.row(0, named=True)
    assert (row["env"], row["round"], row["step"]) == (NAN_ENV, NAN_ROUND, NAN_STEP)
    assert row["reason"] == "non_finite_loss"
    episodes = {
        (r["round"], r["env"]): r["rollbacks"]
        for r in rows(faulted, "episode_finished").iter_rows(named=True)
    }
    assert episodes == {
        (rnd, env): int((rnd, env) == (NAN_ROUND, NAN_ENV))
        for rnd in range(2)
        for env in range(N_ENVS)
    }


def test_rollback_reaches_the_buffer_and_the_episode(faulted: Path) -> None:
    audit = _analyze("rollbacks", faulted)
    assert audit["summary"]["count"] == 1
    assert audit["summary"]["buffer_checked"] is True
    assert audit["summary"]["all_reached_buffer"] is True, audit["rollbacks"]
    assert audit["summary"]["all_reached_episode"] is True, audit["rollbacks"]
    assert audit["problems"] == []
    # The penalised transition's reward event carries the penalty and the episode
    # return equals the sum of its reward events.
    rewards = _analyze("rewards", faulted)
    assert rewards["summary"]["flagged_rows"] == 0
    for ep in rewards["by_episode"]:
        assert ep["total"] == pytest.approx(ep["episode_reward_reported"], abs=1e-6), ep


def test_policy_nan_skips_the_update_and_training_continues(faulted: Path) -> None:
    updates = rows(faulted, "ppo_update").sort("round")
    assert updates["round"].to_list() == [0, 1]
    assert updates["skipped"].to_list() == [True, False]
    assert "non-finite" in updates["skip_reason"][0]
    anomalies = rows(faulted, "anomaly_detected")
    assert "non_finite_loss" in anomalies["kind"].to_list()
    finished = rows(faulted, "run_finished")
    assert finished["status"].to_list() == ["finished"]
    assert finished["rounds_completed"].to_list() == [2]
    assert _analyze("ppo", faulted)["summary"]["skipped"] == 1


def test_data_loader_error_fails_clearly_flushes_and_checkpoints(tmp_path: Path) -> None:
    config = write_small_config(tmp_path)
    log = tmp_path / "emitted.txt"
    args = train_args(
        config, tmp_path / "tel", "dataerr", "--inject-fault", "data_error:round=1,step=1", rounds=2
    )
    proc = run_esper(args, env=cli_env(**{EMIT_LOG_ENV: str(log)}))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "InjectedDataError" in errors[0] and "round 1" in errors[0]
    run_dir = tmp_path / "tel" / "dataerr"
    run = load_run(run_dir)
    assert run.status is RunStatus.FAILED
    assert manifest(run_dir)["status"] == "failed"
    finished = rows(run_dir, "run_finished")
    assert finished["status"].to_list() == ["failed"]
    assert "InjectedDataError" in finished["error"][0]
    # Flushed: every event the process recorded is on disk, as one gapless sequence.
    seqs = run_seqs(run)
    emitted = {seq for seq, _ in read_emit_log(log)}
    assert emitted and emitted <= set(seqs)
    assert seqs == list(range(len(seqs)))
    steps = rows(run_dir, "env_step").filter(round=1)
    assert sorted(steps["step"].to_list()) == [0] * N_ENVS  # step 0 done, step 1 failed
    assert checkpoint_position(run_dir / "checkpoint.pt")[1] == 1  # last completed round


def test_disk_full_under_the_writer_is_a_clear_error_and_corrupts_nothing(
    tmp_path: Path,
) -> None:
    """ENOSPC without privileges: the writer's temporary file for round 0's round_finished
    (named by its seq, which a first run of the same command tells) is a symlink to
    /dev/full, so the checkpoint's flush after round 0 fails with a full disk."""
    full = Path("/dev/full")
    if not full.exists():
        pytest.skip("/dev/full is not available")
    config = write_small_config(tmp_path)
    probe = run_esper(train_args(config, tmp_path / "probe", "full", rounds=1))
    assert probe.returncode == 0, probe.stderr
    seq = rows(tmp_path / "probe" / "full", "round_finished")["seq"][0]
    run_dir = tmp_path / "tel" / "full"
    name = f".{part_name(seq, seq)}.tmp"
    trap = run_dir / "events" / "type=round_finished" / "rank=0" / name
    trap.parent.mkdir(parents=True)
    trap.symlink_to(full)
    proc = run_esper(train_args(config, tmp_path / "tel", "full", rounds=4))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "warning:" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert "No space left on device" in errors[0] and "round_finished" in errors[0]
    # Nothing corrupted: a complete manifest that says failed and why, every part file
    # readable, no temporary files left, and the analysis layer reads the run.
    m = manifest(run_dir)
    assert m["status"] == "failed" and "No space left on device" in m["error"]
    parts = sorted((run_dir / "events").rglob("*.parquet"))
    assert parts
    for part in parts:
        pq.read_table(part)
    assert not [p for p in (run_dir / "events").rglob("*") if p.name.endswith(".tmp")]
    run = load_run(run_dir)
    assert run.status is RunStatus.FAILED
    assert run.rows_on_disk("run_started") == 1
    seqs = run_seqs(run)  # the failed batch's other types may be missing, never doubled
    assert seqs and len(seqs) == len(set(seqs))
    # The flush before round 0's checkpoint failed: no checkpoint points past lost events.
    assert not (run_dir / "checkpoint.pt").exists()
    assert "no checkpoint was written" in proc.stderr
    counts = run_esper(["analyze", "counts", str(run_dir)])
    assert counts.returncode == 0, counts.stderr


@pytest.mark.parametrize(
    ("make_dir", "needle"),
    [
        (lambda tmp: tmp / "a-file", "not a directory"),
        (lambda tmp: tmp / "a-file" / "below", "not a directory"),
        (lambda tmp: Path("/proc/esper-telemetry"), "/proc/esper-telemetry"),
    ],
    ids=["dir-is-a-file", "below-a-file", "under-proc"],
)
def test_unwritable_telemetry_directory_is_a_clear_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make_dir, needle: str
) -> None:
    """Tests may run as root, where permissions do not block: these paths fail for root too.

    In-process through :func:`esper.cli.main` (the CLI's code path without a torch import
    per case; the subprocess behaviour of user errors is covered in the bad-input tests).
    """
    from esper.cli import main as esper_main

    (tmp_path / "a-file").write_text("not a directory\n")
    config = write_small_config(tmp_path)
    code = esper_main(train_args(config, make_dir(tmp_path), "x", rounds=1))
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot create the run directory")
    assert needle.lower() in lines[0].lower()
    assert (tmp_path / "a-file").read_text() == "not a directory\n"
    assert not (tmp_path / "x").exists()


def test_ctrl_c_flushes_checkpoints_and_exits_130(tmp_path: Path) -> None:
    config = write_small_config(tmp_path)
    log = tmp_path / "emitted.txt"
    run_dir = tmp_path / "tel" / "sigint"
    proc = start_esper(
        train_args(config, tmp_path / "tel", "sigint", rounds=200),
        env=cli_env(**{EMIT_LOG_ENV: str(log)}),
    )
    try:
        wait_for((run_dir / "checkpoint.pt").exists, proc, "first checkpoint", 180)
        time.sleep(random.Random(5).uniform(0.0, 1.0))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("interrupted: telemetry flushed; the last good checkpoint is ")
    run = load_run(run_dir)
    assert run.status is RunStatus.INTERRUPTED
    assert manifest(run_dir)["status"] == "interrupted"
    assert rows(run_dir, "run_finished")["status"].to_list() == ["interrupted"]
    seqs = run_seqs(run)
    emitted = {seq for seq, _ in read_emit_log(log)}
    assert emitted <= set(seqs), "Ctrl-C must lose nothing that was recorded"
    assert seqs == list(range(len(seqs)))
    run_id, next_round, seq_position = checkpoint_position(run_dir / "checkpoint.pt")
    assert run_id == "sigint" and next_round >= 1
    assert f"(resumes at round {next_round}: --resume {run_dir / 'checkpoint.pt'})" in lines[0]
    saved = rows(run_dir, "checkpoint_saved").sort("seq")
    assert saved["seq_position"][-1] == seq_position  # the last completed round's


@pytest.mark.parametrize(("step", "penalized"), [(0, 0), (3, 2)])
def test_rollback_penalty_lands_on_the_penalized_reward_event(
    tmp_path: Path, step: int, penalized: int
) -> None:
    """In-process: whatever the panic step, the penalised transition's ``reward_computed``
    carries the penalty, its total still sums its components, and the episode return is
    the sum of the env's reward events (a panic at step 0 penalises transition 0)."""
    from esper.config import load_config, with_overrides
    from esper.core.enums import TelemetryLevel
    from esper.telemetry.events import REWARD_COMPONENTS
    from esper.telemetry.memory_hub import MemoryHub
    from esper.training.loop.faults import Fault, FaultKind, FaultPlan
    from esper.training.run import train

    cfg = with_overrides(
        load_config(write_small_config(tmp_path)),
        {"run.n_envs": N_ENVS, "run.episode_length": 4, "run.rounds": 1, "run.run_id": "p"},
    )
    hub = MemoryHub(run_id="p", level=TelemetryLevel.NORMAL)
    faults = FaultPlan([Fault(kind=FaultKind.NAN, round=0, step=step, env=1)])
    train(cfg, telemetry=hub, faults=faults, save=tmp_path / "c.pt")
    (rb,) = [e for e in hub.events if type(e).__name__ == "GovernorRollback"]
    assert rb.penalized_step == penalized
    rewards = [e for e in hub.events if type(e).__name__ == "RewardComputed"]
    assert len(rewards) == N_ENVS * 4  # one per env-step, none lost by the one-step lag
    for r in rewards:
        expected = rb.penalty if (r.env, r.step) == (1, penalized) else 0.0
        assert r.rollback_penalty == expected, (r.env, r.step)
        assert r.total == pytest.approx(sum(getattr(r, c) for c in REWARD_COMPONENTS))
    episodes = {e.env: e for e in hub.events if type(e).__name__ == "EpisodeFinished"}
    for env, episode in episodes.items():
        total = sum(r.total for r in rewards if r.env == env)
        assert episode.episode_reward == pytest.approx(total, abs=1e-9)
