"""Reward breakdowns per env, episode, op and component, with a sum check on every row.

The component list is :data:`esper.core.records.REWARD_COMPONENTS`, so a component
added to the reward is picked up here without edits. A row is flagged when its
components do not sum to its total within :data:`SUM_TOLERANCE` (a NaN anywhere flags
it too). A component column missing from an older schema reads as null and counts as
0 in the sum, which is what that older reward computed; the summary names it.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Final

import polars as pl
import pyarrow.parquet as pq

from esper.core.records import REWARD_COMPONENTS
from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult

#: Absolute tolerance of the components-sum-to-total check.
SUM_TOLERANCE: Final = 1e-6
_COMPONENTS: Final = list(REWARD_COMPONENTS)


@dataclasses.dataclass(frozen=True)
class RewardBreakdown(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "by_component": "Reward components (whole run)",
        "by_env": "Reward by env",
        "by_episode": "Reward by episode (round, env)",
        "by_op": "Reward by op",
        "by_round": "Mean reward components per round",
        "flagged": "Rows whose components do not sum to the total",
    }
    #: Terminal tables keep totals; per-component detail is in by_component (and JSON).
    TEXT_COLUMNS: ClassVar[dict[str, tuple[str, ...]]] = {
        "by_env": ("env", "rows", "total"),
        "by_episode": ("rank", "round", "env", "rows", "total", "episode_reward_reported"),
        "by_op": ("op", "rows", "total", "mean_total"),
        "flagged": ("round", "env", "step", "op", "total", "component_sum", "diff"),
    }
    TEXT_SKIP: ClassVar[frozenset[str]] = frozenset({"by_round"})

    by_component: pl.DataFrame
    by_env: pl.DataFrame
    by_episode: pl.DataFrame
    by_op: pl.DataFrame
    by_round: pl.DataFrame
    flagged: pl.DataFrame
    rows: int
    flagged_rows: int
    tolerance: float
    missing_components: list[str]


def _sums(*, mean: bool = False) -> list[pl.Expr]:
    """Row count plus the sum (or mean) of every component and of the total."""
    cols = [pl.col(c) for c in [*_COMPONENTS, "total"]]
    return [pl.len().alias("rows"), *(c.mean() if mean else c.sum() for c in cols)]


def _with_check(lf: pl.LazyFrame) -> pl.LazyFrame:
    component_sum = pl.sum_horizontal([pl.col(c).fill_null(0.0) for c in _COMPONENTS])
    diff = (pl.col("component_sum") - pl.col("total")).abs()
    return lf.with_columns(component_sum=component_sum).with_columns(
        sum_ok=(diff <= SUM_TOLERANCE).fill_null(False) & diff.is_not_nan()
    )


def _missing_components(run: Run) -> list[str]:
    """Components absent from every reward_computed file (older schema versions)."""
    files = run.files.get("reward_computed", [])
    if not files:
        return []
    present: set[str] = set()
    for f in files:
        present.update(pq.read_schema(f.path).names)
    return [c for c in _COMPONENTS if c not in present]


def reward_breakdown(run: Run) -> RewardBreakdown:
    """Totals per env, episode, op and component; flags rows that do not add up."""
    lf = _with_check(run.scan("reward_computed"))
    episodes = run.scan("episode_finished").select(
        "rank", "round", "env", pl.col("episode_reward").alias("episode_reward_reported")
    )
    by_component_exprs = [
        pl.struct(
            sum=pl.col(c).sum(),
            mean=pl.col(c).mean(),
            min=pl.col(c).min(),
            max=pl.col(c).max(),
            nonzero=(pl.col(c) != 0).sum(),
        ).alias(c)
        for c in [*_COMPONENTS, "total"]
    ]
    plans = [
        lf.select(by_component_exprs),
        lf.group_by("env").agg(_sums()).sort("env"),
        lf.group_by("rank", "round", "env")
        .agg(_sums())
        .join(episodes, on=["rank", "round", "env"], how="left")
        .sort("round", "env", "rank"),
        lf.group_by("op").agg(*_sums(), mean_total=pl.col("total").mean()).sort("op"),
        lf.group_by("round").agg(_sums(mean=True)).sort("round"),
        lf.filter(~pl.col("sum_ok"))
        .select("round", "env", "step", "op", "total", "component_sum", *_COMPONENTS)
        .with_columns(diff=pl.col("component_sum") - pl.col("total"))
        .sort("round", "env", "step"),
    ]
    comp, by_env, by_episode, by_op, by_round, flagged = pl.collect_all(plans)
    by_component = _component_table(comp)
    return RewardBreakdown(
        by_component=by_component,
        by_env=by_env,
        by_episode=by_episode,
        by_op=by_op,
        by_round=by_round,
        flagged=flagged,
        rows=int(by_env["rows"].sum()) if by_env.height else 0,
        flagged_rows=flagged.height,
        tolerance=SUM_TOLERANCE,
        missing_components=_missing_components(run),
    )


def _component_table(wide: pl.DataFrame) -> pl.DataFrame:
    """One row per component (and the total) from the one-row struct aggregate."""
    rows = []
    for name in [*_COMPONENTS, "total"]:
        stats = wide[name][0] if wide.height else None
        stats = stats or {}
        rows.append({"component": name, **{k: stats.get(k) for k in _STAT_KEYS}})
    return pl.DataFrame(rows, schema=_COMPONENT_SCHEMA)


_STAT_KEYS: Final = ("sum", "mean", "min", "max", "nonzero")
_COMPONENT_SCHEMA: Final = pl.Schema(
    {
        "component": pl.String,
        "sum": pl.Float64,
        "mean": pl.Float64,
        "min": pl.Float64,
        "max": pl.Float64,
        "nonzero": pl.Int64,
    }
)
