"""benchmarks/learning.py cannot rot: --quick runs every policy end to end, --merge joins
per-seed files into one summary with paired differences."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "learning.py"
POLICIES = ["ppo", "heuristic", "eager", "random", "static"]


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )


def _run(out: Path, *args: str) -> None:
    proc = _invoke("--out", str(out), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_quick_per_seed_runs_merge_into_one_summary(tmp_path: Path) -> None:
    _run(tmp_path, "--quick", "--seeds", "0", "--name", "a")
    _run(tmp_path, "--quick", "--seeds", "1", "--name", "b")
    _run(tmp_path, "--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--name", "m")
    data: dict[str, Any] = json.loads((tmp_path / "m.json").read_text())
    assert data["quick"] is True and data["seeds"] == [0, 1]
    summary = data["summary"]
    rounds = data["rounds"]
    for policy in POLICIES:
        assert len(summary[policy]["reward_per_round"]) == rounds
        assert math.isfinite(summary[policy]["acc"])
    assert summary["static"]["params"] == 0.0 and summary["static"]["germinated"] == 0.0
    assert summary["random"]["germinated"] > 0.0  # a random valid policy does act
    pair = summary["paired"]["ppo-static:reward"]
    assert pair["n"] == 2 * len(range(rounds - max(rounds // 3, 1), rounds))
    assert math.isfinite(summary["ppo"]["ev_last_third"])
    vs = summary["vs_static"]
    assert set(vs) == set(POLICIES) - {"static"} and vs["ppo"]["n"] == pair["n"]
    assert 0 <= vs["random"]["agree"] <= vs["random"]["n"]


def test_merge_rounds_cuts_a_longer_run_to_the_rounds_a_shorter_run_played(
    tmp_path: Path,
) -> None:
    """Round r does not depend on run.rounds, so a 3-round run cut to 2 rounds is the
    2-round run (PPO included): what lets one long run stand for several lengths."""
    common = ("--quick", "--seeds", "0", "--policies", "static,ppo")
    _run(tmp_path, *common, "--name", "long")
    _run(tmp_path, *common, "--set", "run.rounds=2", "--name", "short")
    _run(tmp_path, "--merge", str(tmp_path / "long.json"), "--rounds", "2", "--name", "cut")
    cut: dict[str, Any] = json.loads((tmp_path / "cut.json").read_text())
    short: dict[str, Any] = json.loads((tmp_path / "short.json").read_text())
    assert cut["rounds"] == 2 and cut["overrides"]["run.rounds"] == 2
    for policy in ("static", "ppo"):
        a, b = cut["runs"][policy]["0"], short["runs"][policy]["0"]
        for key in ("reward", "acc", "params", "germinated"):
            assert a[key] == b[key] and len(a[key]) == 2, (policy, key)
    assert cut["runs"]["ppo"]["0"]["ppo"] == short["runs"]["ppo"]["0"]["ppo"]
    assert cut["summary"]["paired"] == short["summary"]["paired"]


def test_merge_rounds_refuses_more_rounds_than_a_file_has_and_needs_merge(
    tmp_path: Path,
) -> None:
    _run(tmp_path, "--quick", "--seeds", "0", "--policies", "static", "--name", "s")
    merge = ("--merge", str(tmp_path / "s.json"), "--rounds", "4")
    longer = _invoke("--out", str(tmp_path), *merge)
    assert longer.returncode != 0 and "only 3 rounds" in longer.stderr
    alone = _invoke("--rounds", "2")
    assert alone.returncode == 2 and "--rounds" in alone.stderr


def test_merge_pairs_a_ppo_variant_with_baselines_run_once(tmp_path: Path) -> None:
    """ppo.* settings and the policy network's (op prior) change only the PPO runs: a
    PPO-only variant merges with the other policies of a baseline file (--baselines); a
    (policy, seed) twice is refused."""
    _run(tmp_path, "--quick", "--seeds", "0", "--policies", "static,ppo", "--name", "base")
    prior = ("--set", 'policy.op_prior={"prune": -5.0}')
    variant = ("--set", "ppo.entropy_coef=0.02", *prior, "--policies", "ppo")
    _run(tmp_path, "--quick", "--seeds", "0", *variant, "--name", "var")
    files = (str(tmp_path / "base.json"), str(tmp_path / "var.json"))
    var: dict[str, Any] = json.loads((tmp_path / "var.json").read_text())
    var["experiment"] = "a patched run"  # provenance recorded by the file's producer
    (tmp_path / "var.json").write_text(json.dumps(var))
    _run(tmp_path, "--merge", files[1], "--baselines", files[0], "--name", "m")
    data: dict[str, Any] = json.loads((tmp_path / "m.json").read_text())
    assert data["experiment"] == "a patched run"
    assert data["overrides"]["ppo.entropy_coef"] == 0.02
    assert data["overrides"]["policy.op_prior"] == {"prune": -5.0}
    assert data["runs"]["ppo"]["0"]["reward"] == var["runs"]["ppo"]["0"]["reward"]
    assert set(data["runs"]) == {"ppo", "static"}
    assert "ppo-static:reward" in data["summary"]["paired"]
    twice = _invoke("--out", str(tmp_path), "--merge", *files)
    assert twice.returncode != 0 and "ppo seed 0 is in two files" in twice.stderr


def test_merge_compares_resolved_configs(tmp_path: Path) -> None:
    """An override equal to the preset's value merges with a file that did not set it
    (the configs resolve the same); a different value is refused."""
    _run(tmp_path, "--quick", "--seeds", "0", "--policies", "static", "--name", "base")
    for name, value in (("same", "false"), ("other", "true")):
        gates = ("--set", f"host.strict_gates={value}", "--policies", "ppo")
        _run(tmp_path, "--quick", "--seeds", "0", *gates, "--name", name)
    base = str(tmp_path / "base.json")
    _run(tmp_path, "--merge", str(tmp_path / "same.json"), "--baselines", base, "--name", "m")
    assert set(json.loads((tmp_path / "m.json").read_text())["runs"]) == {"ppo", "static"}
    merge = ("--merge", str(tmp_path / "other.json"), "--baselines", base)
    other = _invoke("--out", str(tmp_path), *merge)
    assert other.returncode != 0 and "different configuration" in other.stderr
