"""benchmarks/learning.py cannot rot: --quick runs every policy end to end (once, shared by
the module), and --merge joins results files into one summary with paired differences.

The merge logic is tested on canned results files: the quick run's own file, split by
seed or edited the way another producer would have written it (other overrides, other
numbers), so only one real benchmark run is paid for.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "learning.py"
POLICIES = ["ppo", "heuristic", "eager", "random", "static"]
SEEDS = (0, 1)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """The script as a module (its merge runs in-process: no training, no subprocess)."""
    spec = importlib.util.spec_from_file_location("learning_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real run, as a user starts it: every policy, two seeds, quick sizes."""
    out = tmp_path_factory.mktemp("learning")
    seeds = ",".join(map(str, SEEDS))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--seeds", seeds, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data: dict[str, Any] = json.loads((out / "learning_quick.json").read_text())
    return data


def _write(path: Path, data: dict[str, Any]) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def _part(data: dict[str, Any], policies: list[str], seeds: tuple[int, ...]) -> dict[str, Any]:
    """The results file a run of only these policies and seeds would have written."""
    part = copy.deepcopy(data)
    part["runs"] = {
        p: {s: r for s, r in by.items() if int(s) in seeds}
        for p, by in part["runs"].items()
        if p in policies
    }
    return part


def _merge(bench: ModuleType, out: Path, *argv: str) -> dict[str, Any]:
    assert bench.main(["--out", str(out), "--name", "merged", *argv]) == 0
    merged: dict[str, Any] = json.loads((out / "merged.json").read_text())
    return merged


def test_quick_runs_every_policy_and_summarises(quick: dict[str, Any]) -> None:
    assert quick["quick"] is True and quick["seeds"] == list(SEEDS)
    summary, rounds = quick["summary"], quick["rounds"]
    for policy in POLICIES:
        assert len(summary[policy]["reward_per_round"]) == rounds
        assert math.isfinite(summary[policy]["acc"])
    assert summary["static"]["params"] == 0.0 and summary["static"]["germinated"] == 0.0
    assert summary["random"]["germinated"] > 0.0  # a random valid policy does act
    assert summary["eager"]["germinated"] >= summary["heuristic"]["germinated"]
    pair = summary["paired"]["ppo-static:reward"]
    # the statistics of esper analyze compare --group: over seeds, paired by seed
    assert pair["n"] == len(SEEDS) and pair["method"] == "paired by seed"
    assert pair["ci_low"] <= pair["mean"] <= pair["ci_high"]
    assert summary["ppo"]["seeds"] == len(SEEDS) and len(summary["ppo"]["reward_ci"]) == 2
    assert math.isfinite(summary["ppo"]["ev_last_third"])
    vs = summary["vs_static"]
    assert set(vs) == set(POLICIES) - {"static"} and vs["ppo"]["n"] == pair["n"]
    last = len(range(rounds - max(rounds // 3, 1), rounds))
    assert vs["random"]["pairs"] == len(SEEDS) * last
    assert 0 <= vs["random"]["agree"] <= vs["random"]["pairs"]


def test_summary_is_the_grouped_statistics_of_compare(
    bench: ModuleType, quick: dict[str, Any]
) -> None:
    """The benchmark's differences are esper_analysis.groups' paired-by-seed intervals
    over the per-seed last-third means, not statistics of its own."""
    from esper_analysis.stats import paired_ci

    last = range(*quick["summary"]["last_third_rounds"])
    last = range(last.start, last.stop + 1)
    runs = quick["runs"]
    diffs = [
        sum(runs["ppo"][s]["acc"][r] - runs["static"][s]["acc"][r] for r in last) / len(last)
        for s in runs["ppo"]
    ]
    expected = paired_ci(diffs)
    got = quick["summary"]["paired"]["ppo-static:acc"]
    assert (got["mean"], got["ci_low"], got["ci_high"]) == pytest.approx(
        (expected.mean, expected.low, expected.high)
    )


def test_per_seed_files_merge_into_the_summary_of_one_joint_run(
    bench: ModuleType, quick: dict[str, Any], tmp_path: Path
) -> None:
    files = [_write(tmp_path / f"s{s}.json", _part(quick, POLICIES, (s,))) for s in SEEDS]
    merged = _merge(bench, tmp_path, "--merge", *files)
    assert merged["seeds"] == list(SEEDS) and merged["quick"] is True
    assert merged["runs"] == quick["runs"]
    assert merged["summary"] == quick["summary"]
    assert "sum of the merged parts" in merged["wall_minutes_note"]


def test_merge_rounds_cuts_a_longer_run_to_the_rounds_a_shorter_run_played(
    bench: ModuleType, quick: dict[str, Any], tmp_path: Path
) -> None:
    """Round r does not depend on run.rounds, so a 3-round run cut to 2 rounds is the
    2-round run (PPO included): what lets one long run stand for several lengths."""
    cfg = bench.with_overrides(bench.load_config(quick["config"]), quick["overrides"])
    short_cfg = bench.with_overrides(cfg, {"run.rounds": 2})
    data = bench.load_task(cfg.task, seed=0)
    long_file = _write(tmp_path / "long.json", _part(quick, ["static", "ppo"], (0,)))
    cut = _merge(bench, tmp_path, "--merge", long_file, "--rounds", "2")
    assert cut["rounds"] == 2 and cut["overrides"]["run.rounds"] == 2
    for policy in ("static", "ppo"):
        short = bench.run_policy(short_cfg, policy, 0, data)
        a = cut["runs"][policy]["0"]
        for key in ("reward", "acc", "params", "germinated"):
            assert a[key] == short[key] and len(a[key]) == 2, (policy, key)
        if policy == "ppo":
            assert a["ppo"] == short["ppo"]


def test_merge_rounds_refuses_more_rounds_than_a_file_has_and_needs_merge(
    bench: ModuleType, quick: dict[str, Any], tmp_path: Path
) -> None:
    part = _write(tmp_path / "s.json", _part(quick, ["static"], (0,)))
    with pytest.raises(SystemExit, match="only 3 rounds"):
        bench.main(["--out", str(tmp_path), "--merge", part, "--rounds", "4"])
    with pytest.raises(SystemExit) as alone:
        bench.parse_args(["--rounds", "2"])
    assert alone.value.code == 2


def test_merge_pairs_a_ppo_variant_with_baselines_run_once(
    bench: ModuleType, quick: dict[str, Any], tmp_path: Path
) -> None:
    """ppo.* settings and the policy network's (op prior) change only the PPO runs: a
    PPO-only variant merges with the other policies of a baseline file (--baselines); a
    (policy, seed) twice is refused."""
    base = _write(tmp_path / "base.json", _part(quick, ["static", "ppo"], (0,)))
    variant = _part(quick, ["ppo"], (0,))
    ppo_only = {"ppo.entropy_coef": 0.02, "policy.op_prior": {"prune": -5.0}}
    variant["overrides"] = {**variant["overrides"], **ppo_only}
    variant["runs"]["ppo"]["0"]["reward"] = [r + 1.0 for r in variant["runs"]["ppo"]["0"]["reward"]]
    variant["experiment"] = "a patched run"  # provenance recorded by the file's producer
    var = _write(tmp_path / "var.json", variant)
    data = _merge(bench, tmp_path, "--merge", var, "--baselines", base)
    assert data["experiment"] == "a patched run"
    assert data["overrides"]["ppo.entropy_coef"] == 0.02
    assert data["overrides"]["policy.op_prior"] == {"prune": -5.0}
    assert data["runs"]["ppo"]["0"]["reward"] == variant["runs"]["ppo"]["0"]["reward"]
    assert set(data["runs"]) == {"ppo", "static"}
    last = data["summary"]["last_third_rounds"]
    expected = [
        p - s
        for p, s in zip(
            variant["runs"]["ppo"]["0"]["reward"],
            quick["runs"]["static"]["0"]["reward"],
            strict=True,
        )
    ][last[0] : last[1] + 1]
    assert data["summary"]["paired"]["ppo-static:reward"]["mean"] == pytest.approx(
        sum(expected) / len(expected)
    )
    with pytest.raises(SystemExit, match="ppo seed 0 is in two files"):
        bench.main(["--out", str(tmp_path), "--merge", base, var])


def test_merge_compares_resolved_configs(
    bench: ModuleType, quick: dict[str, Any], tmp_path: Path
) -> None:
    """An override equal to the preset's value merges with a file that did not set it
    (the configs resolve the same); a different value is refused."""
    base = _write(tmp_path / "base.json", _part(quick, ["static"], (0,)))
    for name, value in (("same", False), ("other", True)):
        part = _part(quick, ["ppo"], (0,))
        part["overrides"] = {**part["overrides"], "host.strict_gates": value}
        _write(tmp_path / f"{name}.json", part)
    same = _merge(bench, tmp_path, "--merge", str(tmp_path / "same.json"), "--baselines", base)
    assert set(same["runs"]) == {"ppo", "static"}
    with pytest.raises(SystemExit, match="different configuration"):
        bench.main(
            ["--out", str(tmp_path), "--merge", str(tmp_path / "other.json"), "--baselines", base]
        )
