"""The benchmark scripts cannot rot: each runs end to end in ``--quick`` mode.

Each test runs a script as a user would (a subprocess, its own command line), into a
temporary results directory, and checks the JSON it writes: the machine block, the
figures the README quotes, and the relations that must hold whatever the machine (a
NullHub emit is cheaper than a recorded one; a closed run is one file per event type;
the analyses agree with the synthetic run they read). The numbers of a quick run mean
nothing; these are not timed tests.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
#: A quick script takes a few seconds; this only catches a hang.
SCRIPT_TIMEOUT_S = 300
MACHINE_KEYS = {"cpu_model", "cores", "versions", "torch_threads", "date", "load_average"}


def run_script(name: str, out: Path, *extra: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--quick", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result_name = "eps" if name == "eps" else name
    data: dict[str, Any] = json.loads((out / f"{result_name}.json").read_text())
    assert set(data["machine"]) >= MACHINE_KEYS, data["machine"]
    assert data["machine"]["versions"]["torch"] != "not installed"
    assert data["quick"] is True
    assert not list(out.glob(".*.tmp")), "atomic write left its tmp file"
    return data


def positive(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_eps_trainer_and_floor(tmp_path: Path) -> None:
    data = run_script("eps", tmp_path)
    results = data["results"]
    assert [(r["task"], r["config"]["n_envs"]) for r in results] == [("digits", 1), ("digits", 2)]
    for r in results:
        assert positive(r["trainer"]["eps"]) and positive(r["floor"]["eps"])
        assert r["ratio"] == pytest.approx(r["trainer"]["eps"] / r["floor"]["eps"])
        assert r["config"]["telemetry_level"] == "normal"
        # The trainer's phases come from its own round_finished events.
        assert {"train", "val", "policy", "action", "ppo"} <= set(r["trainer"]["phases_ms"])
        assert positive(r["floor"]["phases_ms"]["train"])


def test_telemetry_overhead_levels(tmp_path: Path) -> None:
    data = run_script("telemetry_overhead", tmp_path)
    levels = data["levels"]
    assert list(levels) == ["off", "lifecycle", "normal", "debug"]
    assert levels["off"]["ratio_to_off"] == pytest.approx(1.0)
    assert levels["off"]["events"] == 0  # level off writes nothing at all
    assert 0 < levels["lifecycle"]["events"] < levels["normal"]["events"]
    assert all(positive(v["eps"]) for v in levels.values())


def test_emit_costs(tmp_path: Path) -> None:
    data = run_script("emit", tmp_path)
    v = data["variants"]
    assert set(v) == {"recorded", "filtered", "null"}
    for r in v.values():
        assert positive(r["median_ns"]) and r["p99_ns"] >= r["median_ns"]
    assert v["recorded"]["blocked_emits"] == 0  # queue sized to hold a repeat
    assert v["null"]["median_ns"] < v["recorded"]["median_ns"]
    # The mix is a real run's: the four per-env-step events dominate.
    top = sorted(v["recorded"]["mix"].items(), key=lambda kv: -kv[1])[:4]
    assert {t for t, _ in top} == {
        "env_step",
        "action_taken",
        "reward_computed",
        "counterfactual_computed",
    }


def test_writer_on_the_demo_stream(tmp_path: Path) -> None:
    data = run_script("writer", tmp_path)
    r = data["result"]
    assert r["events"] >= 20_000 and positive(r["close_s"]) and positive(r["bytes_per_event"])
    assert positive(r["writer_cpu_us_per_event"]) and r["flushes"] >= 1
    # A closed run is one file per event type (the demo writes most of the catalogue).
    assert 10 <= r["files_after_close"] <= 22


def test_analysis_against_scan(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    data = run_script("analysis", tmp_path / "out", "--cache", str(cache))
    run = data["median_analyses_run"]
    assert run["baseline_ok"] is True  # a run checked against its own baseline
    assert run["reward_flagged_rows"] == 0  # synthetic rewards sum to their totals
    assert run["events"] == data["events"] >= 100_000 * 0.9
    assert data["scan_rows"] == data["events"]
    assert data["synthesis_s"] is not None
    for m in data["measurements"].values():
        assert positive(m["seconds"]) and positive(m["peak_rss_mb"])
    # A second invocation reuses the cached run instead of writing it again.
    again = run_script("analysis", tmp_path / "out2", "--cache", str(cache))
    assert again["synthesis_s"] is None


def test_train_phase_variants(tmp_path: Path) -> None:
    data = run_script("train_phase", tmp_path)
    ms = data["ms_per_env_epoch"]
    assert len(ms) == 6 and all(positive(v) for v in ms.values())
    assert data["ratio_to_floor"]["floor (env after env)"] == pytest.approx(1.0)


def test_floor_matches_trainer_split() -> None:
    """The floor trains each env on exactly the samples the trainer's iterator gives it."""
    sys.path.insert(0, str(BENCH))
    import _trainer as T
    import torch

    from esper.data.iterator import SharedBatchIterator

    for n_envs, cap in ((1, None), (3, 100), (8, None)):
        overrides = {"task.train_samples_per_env": cap} if cap else {}
        cfg = T.bench_config("digits", n_envs=n_envs, level="off", threads=1, overrides=overrides)
        data = T.load_data(cfg)
        it = SharedBatchIterator(
            data.train_x,
            data.train_y,
            n_envs=n_envs,
            batch_size=cfg.task.batch_size,
            seed=cfg.run.seed,
            samples_per_env=cfg.task.train_samples_per_env,
        )
        fd = T._floor_data(cfg, data, torch.device("cpu"))
        assert fd.per_env == it.per_env
        assert fd.channels_last == cfg.task.channels_last
        for epoch in (0, 7):
            used = n_envs * fd.per_env
            idx = T.floor_epoch_indices(cfg.run.seed, epoch, data.train_y.shape[0], used)
            assert torch.equal(idx.view(n_envs, fd.per_env), it.epoch_indices(epoch))
        n_val = min(data.val_y.shape[0], cfg.task.val_samples or data.val_y.shape[0])
        assert sum(yb.shape[0] for _, yb in fd.val) == n_val


def test_watch_overhead(tmp_path: Path) -> None:
    data = run_script("watch_overhead", tmp_path)
    assert set(data["samples"]) == {"alone", "watched"}
    assert all(positive(v) for vs in data["samples"].values() for v in vs)
    assert data["watcher"] and all(w["watcher_cpu_s"] >= 0 for w in data["watcher"])


def test_cuda_graphs_eager_figures_on_cpu(tmp_path: Path) -> None:
    """On a CPU the script takes the eager figures only (capture needs CUDA); the seed
    layouts it builds must give the kinds it names."""
    data = run_script("cuda_graphs", tmp_path, "--device", "cpu")
    rows = {r["layout"]: r for r in data["rows"]}
    assert list(rows) == ["host", "one_kind", "mixed", "late"]
    assert [rows[k]["kinds"] for k in ("host", "one_kind")] == [0, 1]
    assert rows["mixed"]["kinds"] > 1 and rows["late"]["kinds"] > 1
    for r in rows.values():
        assert positive(r["per_env_ms"]) and positive(r["eager_ms"]) and positive(r["build_ms"])
        assert "replay_ms" not in r and "error" not in r
    launches = [rows[k]["eager_launches"] for k in ("host", "one_kind", "mixed")]
    assert launches == sorted(launches) and launches[0] > 0
    # Validation: the trainer's configurations (late: several seeds, rows unpadded).
    val = {r["layout"]: r for r in data["validation"]}
    assert (val["host"]["configs_per_env"], val["one_kind"]["configs_per_env"]) == (1, 2)
    assert val["late"]["configs_per_env"] > 2
    for r in val.values():
        assert positive(r["val_stacked_ms"]) and positive(r["val_per_env_ms"])
        assert r["val_max_abs_diff"] < 1e-3  # the same pass, up to summation order


def test_with_settings_runs_a_script_with_its_own_arguments(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "with_settings.py"), "--no-channels-last", "--",
         str(BENCH / "cuda_graphs.py"), "--quick", "--device", "cpu", "--out", str(tmp_path),
         "--layouts", "host"],
        capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "cuda_graphs.json").read_text())
    assert [r["layout"] for r in data["rows"]] == ["host"]


def test_host_work_measures_both_trees_by_turns(tmp_path: Path) -> None:
    """Calls, loops, CPU share, launches and transfers of the working tree and of HEAD
    (exported with git archive); where the measured parts are as committed, the
    deterministic counts of the two trees agree exactly."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout (--ref needs one)")
    data = run_script("host_work", tmp_path, "--variants", "batched", "--ref", "HEAD")
    assert [t["label"] for t in data["trees"]] == ["working", "HEAD"]
    rows = {r["tree"]: r for r in data["results"]}
    assert list(rows) == ["working", "HEAD"]
    for r in rows.values():
        assert (r["variant"], r["n_envs"]) == ("batched", 2)
        assert positive(r["calls_per_env_step"]) and positive(r["transfers_per_step"])
        # Every Python call counts in "all", ours and torch's among them (vmap's included).
        calls, torch_calls = r["calls_per_env_step"], r["torch_calls_per_env_step"]
        assert positive(torch_calls) and r["all_calls_per_env_step"] >= calls + torch_calls
        assert r["top_functions"] and all(positive(f["per_env_step"]) for f in r["top_functions"])
        loops = r["loops"]  # the loops that grow with n_envs are some of all the loops
        assert loops["loop_iterations_per_env_step"] >= 0
        assert loops["loop_iterations_per_env_step"] <= loops["all_loop_iterations_per_env_step"]
        assert 0 < r["outside_share"] < 1  # the capturable bodies were found and timed
        assert sum(r["timing"][0]["bodies_us_per_env_step"].values()) > 0
        assert positive(r["launches"]["launches_per_env_step"])
        assert r["launches"]["syncs_per_env_step"] >= 0
        sites = r["sites"]  # every site resolved and was timed inside the rounds
        assert not sites["unresolved"] and sites["shares"]
        assert all(0 <= v < 1 for v in sites["shares"].values())
        assert sites["shares"]["esper.training.envs.host_envs:HostEnvs.step"] > 0
    if not data["trees"][0]["dirty"]:  # same code: the counts are deterministic
        work, ref = rows["working"], rows["HEAD"]
        for key in ("calls_per_env_step", "torch_calls_per_env_step", "transfers_per_step",
                    "top_functions", "loops"):  # fmt: skip
            assert work[key] == ref[key], key
        for key in ("launches_per_env_step", "syncs_per_env_step"):
            assert work["launches"][key] == ref["launches"][key], key


def test_seed_layouts_counts_the_rows_fixed_shapes_would_run(tmp_path: Path) -> None:
    """digits_tiny at 4 envs (not --quick: its episodes are too short for a seed to
    reach a forward): sleepers run every (row, slot, blueprint), buckets pad each kind's
    rows to a power of two, and a run's graphs and layouts are at most its uses."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / "seed_layouts.py"), "--n-envs", "4", "--rounds", "2",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "seed_layouts.json").read_text())
    rows = {r["pass"]: r for r in data["results"]}
    assert list(rows) == ["train", "validation"]
    train = rows["train"]
    assert train["passes"] == 2 * 20 and train["n_envs"] == 4  # 2 rounds of 20 steps
    assert train["seed_rows_per_pass"] > 0, "no seed ran: nothing was counted"
    # digits_tiny's host has 5 slots and the CNN registry 7 blueprints.
    assert train["sleeper_kinds"] == 5 * 7
    assert train["sleeper_rows_per_pass"] == 4 * 5 * 7
    for r in rows.values():
        assert r["seed_rows_per_pass"] <= r["bucketed_rows_per_pass"]
        assert r["bucketed_rows_per_pass"] < 2 * r["seed_rows_per_pass"] + 1e-9
        assert r["kinds_per_pass"] <= r["seed_rows_per_pass"] <= r["sleeper_rows_per_pass"]
        assert r["kind_buckets"] <= r["kinds_per_pass"] * r["passes"]
        assert 1 <= r["pass_layouts"] <= r["passes"]
