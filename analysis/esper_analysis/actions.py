"""Action distributions: which ops the policy chose, per round and env, and how many ran.

``executed`` is false when a chosen op could not be carried out (the action layer
turned it into a no-op), so the executed rate per op is a direct health signal.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import polars as pl

from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult


@dataclasses.dataclass(frozen=True)
class Actions(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "by_op": "Ops chosen (whole run)",
        "by_round": "Ops per round",
        "by_env": "Ops per env",
    }

    by_op: pl.DataFrame
    by_round: pl.DataFrame
    by_env: pl.DataFrame
    actions: int
    executed_rate: float | None


def _per(dim: str, lf: pl.LazyFrame) -> pl.LazyFrame:
    return (
        lf.group_by(dim, "op")
        .agg(actions=pl.len(), executed=pl.col("executed").sum())
        .with_columns(share=pl.col("actions") / pl.col("actions").sum().over(dim))
        .sort(dim, "op")
    )


def action_distribution(run: Run) -> Actions:
    """Op counts and shares overall, per round and per env, with executed rates."""
    lf = run.scan("action_taken")
    by_op = (
        lf.group_by("op")
        .agg(
            actions=pl.len(),
            executed=pl.col("executed").sum(),
            mean_op_prob=pl.col("op_prob").mean(),
            mean_value=pl.col("value").mean(),
            mean_valid_ops=pl.col("n_valid_ops").mean(),
        )
        .with_columns(
            share=pl.col("actions") / pl.col("actions").sum(),
            executed_rate=pl.col("executed") / pl.col("actions"),
        )
        .sort("actions", "op", descending=[True, False])
    )
    op_table, by_round, by_env = pl.collect_all([by_op, _per("round", lf), _per("env", lf)])
    total = int(op_table["actions"].sum()) if op_table.height else 0
    executed = int(op_table["executed"].sum()) if op_table.height else 0
    return Actions(
        by_op=op_table,
        by_round=by_round,
        by_env=by_env,
        actions=total,
        executed_rate=executed / total if total else None,
    )
