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


def _run(out: Path, *args: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )
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
