"""``esper train`` killed with SIGKILL at a random point, read back, then resumed both ways.

The killed process reports every event it recorded through the ``ESPER_EMIT_LOG`` side
channel (``seq ts_ns`` per line, written right after ``emit``). The analysis layer must
mark the run crashed and recover every event older than one flush interval at the
moment of the kill; then the last checkpoint resumes it as a new linked run and as a
continuation of the same run, and the analysis reads both parts.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from _reliability_support import (
    N_ENVS,
    NS_PER_S,
    checkpoint_position,
    cli_env,
    kill_hard,
    manifest,
    read_emit_log,
    run_esper,
    run_seqs,
    start_esper,
    train_args,
    wait_for,
    write_small_config,
)
from esper_analysis import event_counts, load_run, load_runs

from esper.core.enums import RunStatus
from esper.telemetry.emit_log import EMIT_LOG_ENV

FLUSH_INTERVAL_S = 0.25
#: The killed run is long enough never to finish before the kill.
KILLED_ROUNDS = 200
#: Rounds the resumed runs add after the checkpoint's round (kept short).
EXTRA_ROUNDS = 2
MAX_KILL_DELAY_S = 1.5
RUN_ID = "victim"
#: Events a kill must find durable for the test to mean something (round 0 emits ~45).
MIN_DURABLE = 20


@dataclass(frozen=True)
class Killed:
    root: Path
    tel: Path
    config: Path
    emitted: list[tuple[int, int]]
    killed_ns: int
    checkpoint: Path

    @property
    def run_dir(self) -> Path:
        return self.tel / RUN_ID


def kill_at_random(root: Path, seed: int, max_delay_s: float = MAX_KILL_DELAY_S) -> Killed:
    """Start a long run, wait for its first checkpoint, SIGKILL it after a seeded delay."""
    config = write_small_config(root, flush_interval_s=FLUSH_INTERVAL_S)
    tel = root / "tel"
    log = root / "emitted.txt"
    proc = start_esper(
        train_args(config, tel, RUN_ID, rounds=KILLED_ROUNDS),
        env=cli_env(**{EMIT_LOG_ENV: str(log)}),
    )
    checkpoint = tel / RUN_ID / "checkpoint.pt"
    try:
        wait_for(lambda: log.exists() and log.stat().st_size > 0, proc, "first event", 180)
        wait_for(checkpoint.exists, proc, "first checkpoint", 180)
        time.sleep(random.Random(seed).uniform(0.0, max_delay_s))
        killed_ns = kill_hard(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return Killed(root, tel, config, read_emit_log(log), killed_ns, checkpoint)


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Killed:
    return kill_at_random(tmp_path_factory.mktemp("killed"), seed=2024)


@pytest.fixture(scope="module")
def killed_at_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Killed:
    """Killed the moment its first checkpoint appears: the worst case for a resume."""
    return kill_at_random(tmp_path_factory.mktemp("killed0"), seed=0, max_delay_s=0.0)


def check_recovered_everything_durable(k: Killed) -> None:
    run = load_run(k.run_dir)
    assert run.status is RunStatus.CRASHED
    assert manifest(k.run_dir)["status"] == "running"  # nobody closed it
    recovery = run.recovery
    assert recovery is not None
    on_disk = run_seqs(run)
    assert len(on_disk) == len(set(on_disk)), "no duplicates"
    emitted = dict(k.emitted)
    durable_before = k.killed_ns - int(FLUSH_INTERVAL_S * NS_PER_S)
    must_survive = {seq for seq, ts in k.emitted if ts < durable_before}
    assert len(must_survive) > MIN_DURABLE, "the kill came too early to prove anything"
    missing = sorted(must_survive - set(on_disk))
    assert not missing, f"lost events older than one flush interval: {missing[:10]}"
    # A batch is written one event type at a time, so a kill mid-batch may leave gaps,
    # but only among the events of the last flush interval; the recovery counts them.
    gaps = set(range(on_disk[-1] + 1)) - set(on_disk)
    assert all(emitted.get(seq, k.killed_ns) >= durable_before for seq in gaps)
    assert recovery.events == len(on_disk) and recovery.seq_gaps == {0: len(gaps)}
    # Nothing invented: at most the one event whose log line the kill cut off.
    assert len(set(on_disk) - set(emitted)) <= 1
    assert on_disk[-1] <= max(emitted) + 1


def test_sigkill_loses_at_most_one_flush_interval(killed: Killed) -> None:
    check_recovered_everything_durable(killed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 7, 99])
def test_sigkill_at_other_random_points(tmp_path: Path, seed: int) -> None:
    check_recovered_everything_durable(kill_at_random(tmp_path, seed))


def test_analyze_cli_reports_the_crash(killed: Killed) -> None:
    proc = run_esper(["analyze", "counts", str(killed.run_dir), "--json"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["run"]["status"] == "crashed"
    assert data["run"]["recovery"]["events"] == len(run_seqs(load_run(killed.run_dir)))
    assert f"warning: run {RUN_ID} is crashed" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_events_a_checkpoint_covers_are_durable_when_it_exists(
    killed_at_checkpoint: Killed,
) -> None:
    k = killed_at_checkpoint
    run_id, next_round, seq_position = checkpoint_position(k.checkpoint)
    assert run_id == RUN_ID and next_round == 1 and seq_position > 0
    on_disk = set(run_seqs(load_run(k.run_dir)))
    assert set(range(seq_position)) <= on_disk


def _copy(k: Killed, dest: Path) -> Path:
    tel = dest / "tel"
    shutil.copytree(k.tel, tel)
    return tel


def test_resume_as_a_new_run_linked_to_its_parent(killed: Killed, tmp_path: Path) -> None:
    tel = _copy(killed, tmp_path)
    ckpt = tel / RUN_ID / "checkpoint.pt"
    parent_id, next_round, seq_position = checkpoint_position(ckpt)
    child_id = f"{RUN_ID}-resume{next_round}"
    rounds = next_round + EXTRA_ROUNDS
    args = train_args(killed.config, tel, child_id, "--resume", str(ckpt), rounds=rounds)
    proc = run_esper(args)
    assert proc.returncode == 0, proc.stderr[-3000:]

    runs = {r.run_id: r for r in load_runs(tel)}
    assert set(runs) == {parent_id, child_id}
    parent, child = runs[parent_id], runs[child_id]
    assert parent.status is RunStatus.CRASHED and parent.recovery is not None
    assert child.status is RunStatus.FINISHED and child.recovery is None
    assert child.manifest is not None and child.manifest.parent_run_id == parent_id
    started = child.scan("run_started").collect()
    assert started["parent_run_id"].to_list() == [parent_id]
    assert started["resumed_from_round"].to_list() == [next_round]
    loaded = child.scan("checkpoint_loaded").collect()
    assert loaded["parent_run_id"].to_list() == [parent_id]
    assert loaded["next_round"].to_list() == [next_round]
    assert loaded["seq_position"].to_list() == [seq_position]
    child_rounds = sorted(child.scan("round_started").collect()["round"].to_list())
    assert child_rounds == list(range(next_round, rounds))
    assert run_seqs(child) == list(range(len(run_seqs(child))))

    # The analysis shows both parts: the parent's recovered rounds, the child's rounds.
    parent_counts, child_counts = event_counts(parent), event_counts(child)
    assert child_counts.of("episode_finished") == EXTRA_ROUNDS * N_ENVS
    parent_rounds = set(parent.scan("round_finished").collect()["round"].to_list())
    assert parent_rounds and max(parent_rounds) >= next_round - 2
    assert parent_counts.total == parent.recovery.events


def test_resume_continues_the_same_run_and_sequence(
    killed_at_checkpoint: Killed, tmp_path: Path
) -> None:
    killed = killed_at_checkpoint
    tel = _copy(killed, tmp_path)
    ckpt = tel / RUN_ID / "checkpoint.pt"
    _, next_round, seq_position = checkpoint_position(ckpt)
    rounds = next_round + EXTRA_ROUNDS
    args = train_args(
        killed.config, tel, RUN_ID, "--resume", str(ckpt), "--continue-run", rounds=rounds
    )
    proc = run_esper(args)
    assert proc.returncode == 0, proc.stderr[-3000:]

    runs = load_runs(tel)
    assert [r.run_id for r in runs] == [RUN_ID]
    run = runs[0]
    assert run.status is RunStatus.FINISHED
    seqs = run_seqs(run)
    assert seqs == list(range(len(seqs))), "one gapless sequence across both sessions"
    assert run.manifest is not None
    resumes = run.manifest.resumes
    assert len(resumes) == 1 and resumes[0].start_seq == seq_position
    # The killed session's partial round was cut: every round appears exactly once.
    for event_type in ("round_started", "round_finished"):
        got = sorted(run.scan(event_type).collect()["round"].to_list())
        assert got == list(range(rounds)), event_type
    episodes = run.scan("episode_finished").collect()
    assert episodes.height == rounds * N_ENVS
    assert run.scan("run_started").collect()["resumed_from_round"].to_list() == [-1, next_round]
    assert run.scan("run_finished").collect()["status"].to_list() == ["finished"]
    loaded = run.scan("checkpoint_loaded").collect()
    assert loaded["seq_position"].to_list() == [seq_position]
    assert loaded["seq"].to_list()[0] > seq_position  # after the resumed run_started
    assert event_counts(run).of("run_started") == 2


def test_continuing_a_run_written_by_a_newer_schema_is_refused(
    killed_at_checkpoint: Killed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process through :func:`esper.cli.main` (same code path, no second torch import)."""
    from esper.cli import main as esper_main
    from esper.telemetry.events import SCHEMA_VERSION

    tel = _copy(killed_at_checkpoint, tmp_path)
    path = tel / RUN_ID / "manifest.json"
    data = json.loads(path.read_text())
    data["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(data))
    before = sorted(p.name for p in (tel / RUN_ID).rglob("*"))
    ckpt = tel / RUN_ID / "checkpoint.pt"
    args = train_args(
        killed_at_checkpoint.config, tel, RUN_ID, "--resume", str(ckpt), "--continue-run"
    )
    code = esper_main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot resume")
    assert f"v{SCHEMA_VERSION + 1}" in lines[0]
    assert sorted(p.name for p in (tel / RUN_ID).rglob("*")) == before  # nothing touched
