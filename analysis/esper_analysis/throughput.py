"""Throughput and phase timings per round: EPS from round_finished, env_step timings.

EPS is env-steps per second (rounds x episode length x envs / wall seconds). When a
round has no ``round_finished`` (a crashed run's last round), its EPS is estimated from
the ``env_step`` timestamps of that round and marked ``estimated``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Final

import polars as pl

from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult

_NS_PER_S: Final = 1e9
_ROUND_PHASES: Final = ("train_ms", "val_ms", "policy_ms", "action_ms", "ppo_ms")
_STEP_PHASES: Final = ("train_ms", "val_ms", "features_ms", "policy_ms")


@dataclasses.dataclass(frozen=True)
class Throughput(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {"rounds": "Throughput and phase timings per round"}

    rounds: pl.DataFrame
    env_steps: int
    wall_s: float | None
    eps: float | None


def throughput(run: Run) -> Throughput:
    """EPS and phase timings per round; run totals from run_finished when present."""
    finished = run.scan("round_finished").select(
        "round",
        "wall_s",
        "eps",
        *(pl.col(p).alias(f"round_{p}") for p in _ROUND_PHASES),
    )
    steps = (
        run.scan("env_step")
        .group_by("round")
        .agg(
            *(pl.col(p).mean().alias(f"step_{p}_mean") for p in _STEP_PHASES),
            env_steps=pl.len(),
            span_s=(pl.col("ts_ns").max() - pl.col("ts_ns").min()) / _NS_PER_S,
        )
    )
    table = (
        finished.join(steps, on="round", how="full", coalesce=True)
        .with_columns(
            estimated=pl.col("eps").is_null(),
            eps=pl.coalesce("eps", pl.col("env_steps") / pl.col("span_s")),
        )
        .sort("round")
        .collect()
    )
    env_steps = int(table["env_steps"].sum()) if "env_steps" in table.columns else 0
    wall_s: float | None = None
    eps: float | None = None
    if run.rows_on_disk("run_finished"):
        row = run.scan("run_finished").select("wall_s", "eps", "env_steps").collect().row(-1)
        wall_s, eps = float(row[0]), float(row[1])
        env_steps = env_steps or int(row[2])
    elif table.height and table["wall_s"].drop_nulls().len():
        wall_s = float(table["wall_s"].sum())
        eps = env_steps / wall_s if wall_s and env_steps else None
    return Throughput(rounds=table, env_steps=env_steps, wall_s=wall_s, eps=eps)
