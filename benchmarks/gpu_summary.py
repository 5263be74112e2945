"""The summary table of a ``gpu_check.sh`` run, from the JSON files it left.

python benchmarks/gpu_summary.py benchmarks/results/gpu_check
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

#: The goal the GPU issue states: batched / floor at 16 envs.
BATCHED_GOAL = 2.0


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    root = Path((argv or sys.argv[1:])[0])
    rows = []
    for name in ("eps_synthetic_ref", "eps_digits", "eps_tiny"):
        data = _load(root / name / "eps.json")
        for r in (data or {}).get("results", []):
            rows.append(
                [
                    r["task"],
                    r["config"]["n_envs"],
                    r.get("trainer", {}).get("eps", "-"),
                    r.get("batched", {}).get("eps", "-"),
                    r["floor"]["eps"],
                    r.get("ratio", "-"),
                    r.get("batched_ratio", "-"),
                ]
            )
    C.print_table(
        f"EPS on the device (goal: batched >= {BATCHED_GOAL}x floor at 16 envs)",
        ["task", "n_envs", "trainer", "batched", "floor", "trainer/floor", "batched/floor"],
        rows,
    )
    turns = []
    for turn in (1, 2):
        for tree in ("base", "new"):
            data = _load(root / f"eps_{tree}_{turn}" / "eps.json")
            for r in (data or {}).get("results", []):
                batched = r.get("batched", {}).get("eps", "-")
                turns.append([turn, tree, r["config"]["n_envs"], batched, r["floor"]["eps"]])
    if turns:
        C.print_table(
            "Batched EPS, the earlier tree (.base) and this one by turns",
            ["turn", "tree", "n_envs", "batched", "floor"],
            turns,
        )
    launches = _load(root / "launches.json")
    if launches:
        C.print_table(
            "Launches and syncs per env-step, counted on the device",
            ["variant", "n_envs", "launches", "collection", "syncs", "transfers"],
            [
                [
                    r["variant"],
                    r["n_envs"],
                    r["launches"],
                    r["collection"],
                    r["syncs"],
                    r["transfers"],
                ]
                for r in launches["results"]
            ],
        )
    checks = _load(root / "cuda_checks.json")
    if checks:
        syncs = checks.get("syncs", {})
        C.print_table(
            "Synchronising CUDA calls per env-step (sync debug mode 'warn')",
            ["variant", "per env-step", "where"],
            [[k, v["syncs_per_env_step"], v["where"]] for k, v in syncs.items()],
        )
        amp = checks.get("amp", {})
        print("AMP:", {k: ("ok" if v.get("ok") else v.get("error")) for k, v in amp.items()})
        prof = checks.get("profile")
        if prof:
            print(
                f"profile: GPU idle {prof['gpu_idle_fraction']}, kernels {prof['kernel_launches']}"
            )
    status = root / "status.txt"
    if status.exists():
        print(status.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
