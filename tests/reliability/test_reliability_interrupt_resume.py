"""An interrupted or failed run, continued with ``--resume ... --continue-run``, must give
exactly the events of a run that was never interrupted (as a kill -9 already does).

Ctrl-C, SIGTERM and a training error each end a run in the middle of a round. The
checkpoint left behind must be the last *completed* round (its sequence position before
the partial round's events, its learner state from the end of that round), the message
must say so truthfully, and the continued run must contain every round exactly once,
with the same numbers as an uninterrupted run.
"""

from __future__ import annotations

import collections
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from _reliability_support import (
    N_ENVS,
    PROCESS_TIMEOUT_S,
    checkpoint_position,
    cli_env,
    manifest,
    rows,
    run_esper,
    start_esper,
    train_args,
    wait_for,
    write_small_config,
)
from esper_analysis import load_run
from esper_analysis.schema import known_event_types

from esper.core.enums import RunStatus

ROUNDS = 5
#: Events that describe a session (start, end, writer), not the training.
SESSION_EVENTS = frozenset(
    {"run_started", "run_finished", "checkpoint_loaded", "writer_stats", "telemetry_level_changed"}
)
#: Fields of ``checkpoint_saved`` that name the session's files and positions: a continued
#: run's sessions add their own start events, so its later positions lie further on.
CHECKPOINT_VOLATILE = frozenset({"path", "bytes", "seq_position"})
#: Envelope and wall-clock fields: everything else must match exactly.
VOLATILE = frozenset({"seq", "ts_ns", "run_id", "rank", "eps", "wall_s"})
#: Exit status of a run ended by SIGTERM (128 + 15).
EXIT_TERMINATED = 143


def training_events(run_dir: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every training event of a run, per type, without envelope or timing fields."""
    run = load_run(run_dir)
    out: dict[str, list[tuple[Any, ...]]] = {}
    for event_type in known_event_types():
        if event_type in SESSION_EVENTS or run.rows_on_disk(event_type) == 0:
            continue
        frame = run.scan(event_type).collect()
        volatile = VOLATILE | (CHECKPOINT_VOLATILE if event_type == "checkpoint_saved" else set())
        keep = [c for c in frame.columns if c not in volatile and not c.endswith("_ms")]
        out[event_type] = sorted(tuple(map(repr, r)) for r in frame.select(keep).iter_rows())
    return out


def assert_same_training(got_dir: Path, want_dir: Path) -> None:
    got, want = training_events(got_dir), training_events(want_dir)
    assert set(got) == set(want)
    for event_type, expected in want.items():
        assert got[event_type] == expected, f"{event_type}: differs from the uninterrupted run"
    totals = ["status", "rounds_completed", "env_steps", "rollbacks"]
    last = [rows(d, "run_finished").sort("seq").select(totals).row(-1) for d in (got_dir, want_dir)]
    assert last[0] == last[1], "the last run_finished describes the whole run"


def assert_each_round_once(run_dir: Path) -> None:
    steps = rows(run_dir, "env_step")
    keys = collections.Counter(zip(steps["round"], steps["env"], steps["step"], strict=True))
    assert [k for k, n in keys.items() if n > 1] == [], "duplicated env steps"
    for event_type in ("round_started", "round_finished"):
        assert sorted(rows(run_dir, event_type)["round"].to_list()) == list(range(ROUNDS))
    assert rows(run_dir, "episode_finished").height == ROUNDS * N_ENVS


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("whole")
    proc = run_esper(train_args(write_small_config(root), root / "tel", "run", rounds=ROUNDS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "tel" / "run"


def _continue(config: Path, tel: Path, run_id: str) -> None:
    ckpt = tel / run_id / "checkpoint.pt"
    args = train_args(config, tel, run_id, "--resume", str(ckpt), "--continue-run", rounds=ROUNDS)
    proc = run_esper(args)
    assert proc.returncode == 0, proc.stderr[-3000:]


def checkpoint_is_the_last_completed_round(run_dir: Path) -> tuple[Path, int]:
    """Every round before the checkpoint's finished, none after; the partial round's
    events all lie past its sequence position (a continued run cuts them)."""
    ckpt = run_dir / "checkpoint.pt"
    _, next_round, seq_position = checkpoint_position(ckpt)
    finished = rows(run_dir, "round_finished")
    assert sorted(finished["round"].to_list()) == list(range(next_round))
    assert finished["seq"].max() < seq_position
    partial = rows(run_dir, "env_step").filter(round=next_round)
    assert partial.height == 0 or partial["seq"].min() >= seq_position
    return ckpt, next_round


def assert_says(stderr: str, ckpt: Path, next_round: int) -> None:
    assert f"the last good checkpoint is {ckpt} (resumes at round {next_round}" in stderr


def test_training_error_then_continue_run_matches_an_uninterrupted_run(
    uninterrupted: Path, tmp_path: Path
) -> None:
    config = write_small_config(tmp_path)
    tel = tmp_path / "tel"
    fault = "data_error:round=2,step=2"
    proc = run_esper(train_args(config, tel, "run", "--inject-fault", fault, rounds=ROUNDS))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert load_run(tel / "run").status is RunStatus.FAILED
    ckpt, next_round = checkpoint_is_the_last_completed_round(tel / "run")
    assert next_round == 2

    _continue(config, tel, "run")
    assert load_run(tel / "run").status is RunStatus.FINISHED
    assert_each_round_once(tel / "run")
    assert_same_training(tel / "run", uninterrupted)
    # What the failed run said about its checkpoint was true.
    assert_says(proc.stderr, ckpt, next_round)
    assert "checkpoint of the last completed round saved" not in proc.stderr


@pytest.mark.parametrize(
    ("sig", "code", "said", "error"),
    [
        (signal.SIGINT, 130, "interrupted", "interrupted by user (Ctrl-C)"),
        (signal.SIGTERM, EXIT_TERMINATED, "terminated (SIGTERM)", "terminated (SIGTERM)"),
    ],
    ids=["sigint", "sigterm"],
)
def test_signal_mid_round_then_continue_run_matches_an_uninterrupted_run(
    uninterrupted: Path, tmp_path: Path, sig: signal.Signals, code: int, said: str, error: str
) -> None:
    config = write_small_config(tmp_path)
    tel = tmp_path / "tel"
    run_dir = tel / "run"
    proc = start_esper(train_args(config, tel, "run", rounds=ROUNDS), env=cli_env())
    try:
        wait_for((run_dir / "checkpoint.pt").exists, proc, "first checkpoint", 180)
        # Into the next round: its first env steps are on their way to disk.
        wait_for(lambda: _seen_steps_of_round(run_dir, 1), proc, "round 1", 180)
        time.sleep(0.1)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err
    assert manifest(run_dir)["status"] == "interrupted"
    finished = rows(run_dir, "run_finished")
    assert finished["status"].to_list() == ["interrupted"]
    assert finished["error"].to_list() == [error]
    ckpt, next_round = checkpoint_is_the_last_completed_round(run_dir)
    assert 1 <= next_round < ROUNDS, "the signal must land before the run ends"

    _continue(config, tel, "run")
    assert load_run(run_dir).status is RunStatus.FINISHED
    assert_each_round_once(run_dir)
    assert_same_training(run_dir, uninterrupted)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{said}: telemetry flushed; "), err
    assert_says(err, ckpt, next_round)


def _seen_steps_of_round(run_dir: Path, rnd: int) -> bool:
    try:
        steps = load_run(run_dir).scan("env_step").collect()
    except Exception:  # the writer is mid-flush: try again
        return False
    return steps.height > 0 and rnd in steps["round"].to_list()


def test_a_completed_round_not_yet_saved_is_saved_on_error(tmp_path: Path) -> None:
    """``checkpoint_every`` 2: round 2 completed without a save; an error in round 3 writes
    round 2's end state (not the partial round 3), and the ledger says so."""
    from esper.config import load_config, with_overrides
    from esper.core.enums import TelemetryLevel
    from esper.telemetry.memory_hub import MemoryHub
    from esper.training.loop.faults import Fault, FaultKind, FaultPlan, InjectedDataError
    from esper.training.run import CheckpointLedger, train

    cfg = with_overrides(
        load_config(write_small_config(tmp_path)),
        {
            "run.n_envs": N_ENVS,
            "run.episode_length": 4,
            "run.rounds": 5,
            "run.run_id": "e",
            "run.checkpoint_every": 2,
        },
    )
    hub = MemoryHub(run_id="e", level=TelemetryLevel.NORMAL)
    ledger = CheckpointLedger()
    faults = FaultPlan([Fault(kind=FaultKind.DATA_ERROR, round=3, step=1)])
    with pytest.raises(InjectedDataError):
        train(cfg, telemetry=hub, faults=faults, save=tmp_path / "c.pt", ledger=ledger)
    _, next_round, seq_position = checkpoint_position(tmp_path / "c.pt")
    assert (ledger.path, ledger.next_round, ledger.save_error) == (tmp_path / "c.pt", 3, "")
    assert next_round == 3
    events = {e.seq: e for e in hub.events}
    last_before = events[seq_position - 1]
    assert type(last_before).__name__ == "RoundFinished" and last_before.round == 2
    saved = [e.next_round for e in hub.events if type(e).__name__ == "CheckpointSaved"]
    assert saved == [2, 3]
