"""Multi-process training on CPU with gloo: 2 ranks launched by torchrun, kept tiny.

Each launch takes ~10-25 s on the 2-core development VM, so runs are shared between
tests through module-scoped fixtures.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import torch
from esper_analysis import load_run
from esper_analysis.counts import event_counts

from esper.training.loop.checkpoint import read_checkpoint

WORKER = Path(__file__).with_name("_worker.py")
#: A launch must end well inside this (a hang is the failure these tests guard against).
LAUNCH_TIMEOUT_S = 240
#: Max |w_2rank - w_1rank| over all policy weights after the first PPO update (float32
#: gradients summed in a different order; measured 9e-8).
WEIGHT_ATOL = 1e-5

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed not built"
)


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    return env


def _torchrun(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        *args,
    ]


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m torch.distributed.run --nproc_per_node=2 -m esper train``: 2 x 2 envs."""
    root = tmp_path_factory.mktemp("dist")
    proc = _run(
        _torchrun(
            "-m", "esper", "train", "--envs", "2", "--rounds", "2", "--episode-length", "4",
            "--seed", "0", "--telemetry-dir", "runs", "--run-id", "two", "--no-progress",
            "--inject-fault", "nan:env=3,round=1,step=2",  # global env 3: rank 1's 2nd env
        ),
        root,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "runs" / "two"


def _parquet(run_dir: Path, event_type: str) -> pl.DataFrame:
    return pl.read_parquet(run_dir / "events" / f"type={event_type}" / "*" / "*.parquet")


def test_two_rank_run_completes_with_identical_replicas(cli_run: Path) -> None:
    rank0 = read_checkpoint(cli_run / "checkpoint.pt")
    rank1 = read_checkpoint(cli_run / "checkpoint-rank1.pt")
    assert (rank0["world_size"], rank0["rank"], rank1["rank"]) == (2, 0, 1)
    assert rank0["next_round"] == rank1["next_round"] == 2
    policy0, policy1 = rank0["learner"]["policy"], rank1["learner"]["policy"]
    assert policy0.keys() == policy1.keys()
    for key in policy0:
        assert torch.equal(policy0[key], policy1[key]), key
    for norm in ("obs_norm", "reward_norm", "value_norm"):  # merged, not per rank
        for key, value in rank0["learner"][norm].items():
            assert torch.equal(value, rank1["learner"][norm][key]), (norm, key)
    # Each rank samples from its own stream.
    assert not torch.equal(rank0["learner"]["generator"], rank1["learner"]["generator"])


def test_each_rank_writes_its_own_contiguous_partitions(cli_run: Path) -> None:
    manifests = {
        r: json.loads((cli_run / name).read_text())
        for r, name in ((0, "manifest.json"), (1, "manifest-rank1.json"))
    }
    assert {m["world_size"] for m in manifests.values()} == {2}
    frames = [
        pl.read_parquet(p, hive_partitioning=False).select("rank", "seq")
        for p in (cli_run / "events").glob("type=*/rank=*/*.parquet")
    ]
    seqs = pl.concat(frames)
    for rank, manifest in manifests.items():
        got = sorted(seqs.filter(pl.col("rank") == rank)["seq"].to_list())
        assert got == list(range(manifest["last_seq"] + 1)), rank
        assert manifest["status"] == "finished"
    steps = _parquet(cli_run, "env_step")
    assert sorted(steps.unique(["rank", "env"]).select("rank", "env").rows()) == [
        (0, 0), (0, 1), (1, 2), (1, 3),
    ]  # fmt: skip
    # Lifecycle records name the env by its global index, on its own rank.
    lifecycle = pl.concat(
        _parquet(cli_run, t).select("rank", "env")
        for t in ("gate_evaluated", "seed_stage_changed", "seed_germinated", "seed_pruned")
        if (cli_run / "events" / f"type={t}").exists()
    )
    assert set(lifecycle.unique().rows()) <= {(0, 0), (0, 1), (1, 2), (1, 3)}
    assert set(lifecycle["rank"].to_list()) == {0, 1}
    for run_level in ("run_started", "run_finished", "round_finished", "ppo_update"):
        assert set(_parquet(cli_run, run_level)["rank"].to_list()) == {0}, run_level
    assert _parquet(cli_run, "run_finished")["env_steps"].to_list() == [2 * 2 * 2 * 4]


def test_fault_specs_name_global_envs(cli_run: Path) -> None:
    rollbacks = _parquet(cli_run, "governor_rollback")
    assert rollbacks.select("rank", "env", "round").rows() == [(1, 3, 1)]


def test_analysis_counts_are_the_sum_over_ranks(cli_run: Path) -> None:
    run = load_run(cli_run)
    assert not run.degraded
    counts = event_counts(run)
    summed: dict[str, int] = {}
    for name in ("manifest.json", "manifest-rank1.json"):
        for event_type, n in json.loads((cli_run / name).read_text())["counts"].items():
            summed[event_type] = summed.get(event_type, 0) + n
    got = {row["type"]: row["events"] for row in counts.by_type.iter_rows(named=True)}
    assert got == {t: n for t, n in summed.items() if n}
    assert got["episode_finished"] == 2 * 2 * 2  # rounds x ranks x envs


def test_resume_with_another_world_size_is_refused(cli_run: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "esper", "train", "--resume", str(cli_run / "checkpoint.pt"),
         "--rounds", "3", "--telemetry-dir", str(tmp_path), "--no-progress"],
        env=_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "written by a run with 2 rank(s)" in proc.stderr
    assert "this run has 1" in proc.stderr


def test_two_ranks_of_n_envs_update_like_one_rank_of_2n(tmp_path: Path) -> None:
    """Same host seeds, data shards and (greedy) actions: the same first PPO update."""
    worker = [str(WORKER), "--dir", str(tmp_path), "--rounds", "1"]
    one = _run([sys.executable, *worker, "--run-id", "one", "--envs", "4"], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _run(_torchrun(*worker, "--run-id", "two", "--envs", "2"), tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    rewards = [
        _parquet(tmp_path / run, "reward_computed").sort("env", "step") for run in ("one", "two")
    ]
    assert rewards[0]["total"].to_list() == rewards[1]["total"].to_list()
    assert rewards[0]["normalized"].to_list() == pytest.approx(
        rewards[1]["normalized"].to_list(), rel=1e-6
    )
    s1 = read_checkpoint(tmp_path / "one" / "checkpoint.pt")["learner"]
    s2 = read_checkpoint(tmp_path / "two" / "checkpoint.pt")["learner"]
    # Merged moments = one batch's (returns carry float32 value predictions: rtol 1e-6).
    for norm in ("obs_norm", "reward_norm", "value_norm"):
        for key, value in s1[norm].items():
            assert torch.allclose(value.double(), s2[norm][key].double(), rtol=1e-6), (norm, key)
    w1, w2 = s1["policy"], s2["policy"]
    diff = max(float((w1[k].double() - w2[k].double()).abs().max()) for k in w1)
    changed = max(float((w1[k].double()).abs().max()) for k in w1)
    assert diff < WEIGHT_ATOL and changed > 0
    ppo = [_parquet(tmp_path / run, "ppo_update") for run in ("one", "two")]
    assert ppo[0]["approx_kl"][0] == pytest.approx(ppo[1]["approx_kl"][0], rel=1e-4)
    assert ppo[0]["grad_norm"][0] == pytest.approx(ppo[1]["grad_norm"][0], rel=1e-4)


def test_an_error_on_one_rank_ends_both(tmp_path: Path) -> None:
    """Rank 1's data loader fails in round 1: both ranks stop, round 0 stays resumable."""
    t0 = time.monotonic()
    proc = _run(
        _torchrun(str(WORKER), "--dir", str(tmp_path), "--run-id", "err", "--envs", "1",
                  "--rounds", "2", "--fail-rank", "1", "--timeout", "60"),
        tmp_path,
    )  # fmt: skip
    assert proc.returncode != 0
    assert time.monotonic() - t0 < LAUNCH_TIMEOUT_S
    assert "InjectedDataError" in proc.stderr
    _check_ended_readable(tmp_path / "err", failed_rank=1)


def test_killing_one_rank_ends_both_with_a_readable_run(tmp_path: Path) -> None:
    """kill -9 of rank 1 mid-run: rank 0 is stopped too (no hang), its checkpoint loads."""
    run_dir = tmp_path / "runs" / "kill"
    cmd = _torchrun(
        "-m", "esper", "train", "--envs", "1", "--rounds", "50", "--episode-length", "3",
        "--telemetry-dir", "runs", "--run-id", "kill", "--no-progress", "--dist-timeout", "60",
    )  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while not (run_dir / "checkpoint-rank1.pt").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "run ended early"
            time.sleep(0.2)
        pid = json.loads((run_dir / "manifest-rank1.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, err[-2000:]
    _check_ended_readable(run_dir, failed_rank=1)


def _check_ended_readable(run_dir: Path, *, failed_rank: int) -> None:
    manifests = {
        0: json.loads((run_dir / "manifest.json").read_text()),
        1: json.loads((run_dir / "manifest-rank1.json").read_text()),
    }
    assert manifests[0]["status"] in ("failed", "interrupted"), manifests[0]["status"]
    run = load_run(run_dir)
    assert run.status.value in ("failed", "interrupted", "crashed")
    assert event_counts(run).by_type.height > 0
    state = read_checkpoint(run_dir / "checkpoint.pt")
    assert state["next_round"] >= 1 and state["world_size"] == 2
    assert failed_rank == 1


def test_counts_and_baseline_are_per_rank_and_name_the_rank_that_drifted(cli_run: Path) -> None:
    from esper_analysis.baseline import capture_baseline, check_baseline

    run = load_run(cli_run)
    by_rank = event_counts(run).by_rank
    steps = by_rank.filter(pl.col("type") == "env_step").sort("rank")
    assert steps.select("rank", "events").rows() == [(0, 16), (1, 16)]
    baseline = capture_baseline(run)
    assert baseline["fingerprint"]["world_size"] == 2
    assert baseline["by_rank"]["run_started"] == {"0": 1}
    assert check_baseline(run, baseline).ok
    # Rank 1 stepping one env-step fewer than the baseline recorded: drift on rank 1.
    drifted = json.loads(json.dumps(baseline))
    drifted["counts"]["env_step"] += 1
    drifted["by_rank"]["env_step"]["1"] += 1
    check = check_baseline(run, drifted)
    assert not check.ok and check.drifted_ranks == [1]
    assert "on rank(s) 1" in check.message()
    # A baseline captured before ranks were recorded is still comparable.
    old = {k: v for k, v in baseline.items() if k != "by_rank"}
    assert check_baseline(run, old).ok


def test_a_missing_rank_makes_a_degraded_read(cli_run: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "two"
    shutil.copytree(cli_run, copy)
    (copy / "manifest-rank1.json").unlink()
    for part_dir in (copy / "events").glob("type=*/rank=1"):
        shutil.rmtree(part_dir)
    with pytest.warns(UserWarning, match="world size 2"):
        run = load_run(copy)
    assert any("world size 2, but rank(s) [1] have no manifest" in d for d in run.degraded)


@pytest.mark.parametrize("analysis", ["rewards", "rollbacks", "lifecycles", "actions", "ppo"])
def test_analyses_read_every_rank(cli_run: Path, analysis: str) -> None:
    """``esper analyze <analysis> RUN --json`` (in-process: the CLI's own entry point)."""
    from esper_analysis.cli import main as analyze

    out, err = io.StringIO(), io.StringIO()
    assert analyze([analysis, str(cli_run), "--json"], stdout=out, stderr=err) == 0, err.getvalue()
    assert "degraded" not in err.getvalue()
    assert json.loads(out.getvalue())["run"]["degraded"] == []


def test_report_of_a_two_rank_run(cli_run: Path, tmp_path: Path) -> None:
    from esper_analysis import write_report

    html = write_report(load_run(cli_run), tmp_path / "report.html").read_text()
    assert "two" in html


def test_resuming_a_smaller_world_names_the_world_size(tmp_path: Path) -> None:
    from esper.config import Config
    from esper.errors import CheckpointError
    from esper.training.loop.checkpoint import compat_fingerprint, save_checkpoint
    from esper.training.loop.distributed import Collective, rank_checkpoint

    cfg = Config()
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(
        path,
        {"run_id": "one", "next_round": 1, "seq_position": 0, "config": cfg.to_json(),
         "compat": compat_fingerprint(cfg), "learner": {}, "torch_rng": torch.get_rng_state(),
         "world_size": 1, "rank": 0},
    )  # fmt: skip
    rank1 = Collective(rank=1, world_size=2, local_rank=1, device=torch.device("cpu"))
    with pytest.raises(CheckpointError, match=r"written by a run with 1 rank\(s\)"):
        rank_checkpoint(path, rank1)
    rank0 = Collective(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    assert rank_checkpoint(path, rank0) == path


def test_benchmark_script_runs(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    script = root / "benchmarks" / "distributed.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--out", str(tmp_path)],
        cwd=root, env=_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads((tmp_path / "distributed.json").read_text())
    assert set(data["eps"]) == {"1", "2"} and all(v > 0 for v in data["eps"].values())
    assert data["machine"]["cores"] >= 1
    for sample in data["samples"]["2"]:  # rank 0 reports every rank's env-steps
        assert sample["env_steps"] == sample["ranks"] * sample["envs_per_rank"] * 3


@pytest.mark.slow  # two launches: ~32 s on the 2-core VM
def test_sigterm_to_torchrun_interrupts_every_rank_with_checkpoints(tmp_path: Path) -> None:
    """``scancel``/``docker stop``: torchrun forwards SIGTERM; both ranks close cleanly."""
    run_dir = tmp_path / "runs" / "term"
    cmd = _torchrun(
        "-m", "esper", "train", "--envs", "1", "--rounds", "50", "--episode-length", "3",
        "--telemetry-dir", "runs", "--run-id", "term", "--no-progress",
    )  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while not (run_dir / "checkpoint-rank1.pt").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "run ended early"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    for name in ("manifest.json", "manifest-rank1.json"):
        manifest = json.loads((run_dir / name).read_text())
        assert manifest["status"] in ("interrupted", "failed"), (name, err[-2000:])
    states = [read_checkpoint(run_dir / n) for n in ("checkpoint.pt", "checkpoint-rank1.pt")]
    assert states[0]["next_round"] == states[1]["next_round"] >= 1
    assert load_run(run_dir).status.value in ("interrupted", "failed")
    assert "--resume runs/term/checkpoint-rank1.pt" not in err  # rank 0's file resumes
    # Continue the same run: each rank cuts its own tail and goes on from its checkpoint.
    total = states[0]["next_round"] + 1
    again = _run(
        _torchrun("-m", "esper", "train", "--resume", "runs/term/checkpoint.pt",
                  "--continue-run", "--rounds", str(total), "--no-progress"),
        tmp_path,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    run = load_run(run_dir)
    assert run.status.value == "finished" and not run.degraded
    seqs = pl.concat(
        pl.read_parquet(p, hive_partitioning=False).select("rank", "seq")
        for p in run_dir.glob("events/type=*/rank=*/*.parquet")
    )
    for rank in (0, 1):
        got = sorted(seqs.filter(pl.col("rank") == rank)["seq"].to_list())
        assert got == list(range(len(got))), rank  # contiguous: no gap, no duplicate
    episodes = _parquet(run_dir, "episode_finished")
    assert sorted(episodes.select("round", "env").rows()) == [
        (r, e) for r in range(total) for e in (0, 1)
    ]
