"""``benchmarks/learning.py --family`` cannot rot: every stage runs end to end at quick
sizes (the rules table on one blueprint), and the summary pairs PPO, the frozen policy
and the transfer with the rules by (seed, round)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "learning.py"
STAGES = ("rules", "ppo", "pair", "transfer", "descriptors", "summary")


def _stage(out: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out), "--family", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.slow
def test_every_family_stage_runs_and_the_summary_pairs_them(tmp_path: Path) -> None:
    for name in STAGES:
        proc = _stage(tmp_path, name)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = _stage(tmp_path, "rules")  # stored work is skipped, not redone
    assert again.returncode == 0 and "rules conv_heavy" not in again.stdout
    data: dict[str, Any] = json.loads((tmp_path / "learning_family_quick.json").read_text())
    rules = data["rules"]
    assert set(rules["members"]) == {"w2-4-8", "w3-6-12", "w8-4-64", "w16-4-64"}
    assert set(rules["table"]) == {"conv_heavy@r0c0", "conv_heavy@r0c1", "conv_heavy@r0c2"}
    assert rules["best_fixed"] in [*rules["table"], "static"]
    main = data["ppo"]["ppo"]
    for key in ("ppo", "frozen", "frozen_sample"):
        for other in ("best_fixed", "oracle", "static"):
            assert math.isfinite(main[key]["minus"][other]["acc"]["mean"])
    assert set(data["transfer"]["choices"]) == {"w4-8-16", "w12-4-48"}
    use = data["descriptor_use"]  # the final policy probed with swapped descriptors
    assert use["seeds"] == [0] and 0 <= use["all descriptors"]["op"] <= 1
    assert 0 <= use["slot costs"]["growth"] <= 1
    refused = _stage(tmp_path, "rules", "--set", "ppo.lr=0.001")
    assert refused.returncode != 0 and "only with --family ppo" in refused.stderr
    # a variant: trained apart, transferred apart, its own tables in the summary; with
    # other envs and rounds, its final policy still plays the rules table's episodes
    variant_settings = {"ppo.lr": 0.001, "run.n_envs": 4, "run.rounds": 4}
    for argv in (
        ("ppo", "--variant", "v", *(f"--set={k}={v}" for k, v in variant_settings.items())),
        ("transfer", "--variant", "v"),
    ):
        proc = _stage(tmp_path, *argv)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _stage(tmp_path, "summary").returncode == 0
    data = json.loads((tmp_path / "learning_family_quick.json").read_text())
    block = data["ppo"]["ppo-v"]
    assert block["overrides"] == variant_settings and len(block["per_round"]["acc"]) == 4
    for key in ("frozen", "frozen_sample"):
        assert math.isfinite(block[key]["minus"]["best_fixed"]["acc"]["mean"])
    for name in ("ppo-v", "ppo-v:sample"):
        variant = data["transfer"]["variants"][name]
        assert math.isfinite(variant["minus"]["static"]["acc"]["mean"])
        assert set(variant["choices"]) == {"w4-8-16", "w12-4-48"}
