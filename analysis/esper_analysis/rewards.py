"""Reward breakdowns per env, episode, op and component, with a sum check on every row.

The component list is :data:`esper.telemetry.events.REWARD_COMPONENTS`, so a component
added to the reward is picked up here without edits. A row is flagged when its
components do not sum to its total within :data:`SUM_TOLERANCE` (a NaN anywhere flags
it too). A component column missing from an older schema reads as null and counts as
0 in the sum, which is what that older reward computed; the summary names it. Sums of
floats may differ in their last bits from call to call (the group-bys run in parallel);
the tables present them rounded.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Final

import polars as pl

from esper.telemetry.events import REWARD_COMPONENTS
from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult

#: Absolute tolerance of the components-sum-to-total check.
SUM_TOLERANCE: Final = 1e-6
COMPONENTS: Final = list(REWARD_COMPONENTS)
#: The summed columns: every component and the total.
SUMMED: Final = [*COMPONENTS, "total"]
_EPISODE: Final = ["rank", "round", "env"]
_FLAGGED: Final = ["round", "env", "step", "op", "total", "component_sum", *COMPONENTS]


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


def _missing_components(run: Run) -> list[str]:
    """Components absent from every reward_computed file (older schema versions)."""
    files = run.files.get("reward_computed", [])
    if not files:
        return []
    present: set[str] = set()
    for f in files:
        present.update(f.columns)
    return [c for c in COMPONENTS if c not in present]


def _sums(lf: pl.LazyFrame, keys: list[str], *, mean: bool = False) -> pl.LazyFrame:
    """Rows, and the sum (or mean over non-null values) of every summed column, per key."""
    agg = [pl.col(c).mean() if mean else pl.col(c).sum() for c in SUMMED]
    return lf.group_by(keys).agg(pl.len().alias("rows"), *agg)


def _by_component(lf: pl.LazyFrame) -> pl.LazyFrame:
    """One row per summed column: sum and mean (null where no row has it), min, max (a
    zero as +0.0) and the non-zero count."""
    return pl.concat(
        [
            lf.select(
                component=pl.lit(c),
                sum=pl.when(pl.col(c).count() > 0).then(pl.col(c).sum()),
                mean=pl.col(c).mean(),
                min=pl.col(c).min() + 0.0,
                max=pl.col(c).max() + 0.0,
                nonzero=(pl.col(c) != 0).sum().cast(pl.Int64),
            )
            for c in SUMMED
        ]
    )


def reward_breakdown(run: Run) -> RewardBreakdown:
    """Totals per env, episode, op and component; flags rows that do not add up."""
    columns = ["rank", "round", "env", "step", "op", *SUMMED]
    rewards = run.scan("reward_computed").select(columns).collect().lazy()  # read once
    component_sum = pl.sum_horizontal([pl.col(c).fill_null(0.0) for c in COMPONENTS])
    diff = (pl.col("component_sum") - pl.col("total")).abs()
    ok = (diff <= SUM_TOLERANCE).fill_null(False) & diff.is_not_nan()
    reported = run.scan("episode_finished").select(
        *_EPISODE, episode_reward_reported="episode_reward"
    )
    by_component, by_env, by_episode, by_op, by_round, flagged = pl.collect_all(
        [
            _by_component(rewards),
            _sums(rewards, ["env"]).sort("env"),
            _sums(rewards, _EPISODE)
            .join(reported, on=_EPISODE, how="left")
            .sort("round", "env", "rank"),
            _sums(rewards, ["op"])
            .with_columns(mean_total=pl.col("total") / pl.col("rows"))
            .sort("op"),
            _sums(rewards, ["round"], mean=True).sort("round"),
            rewards.with_columns(component_sum=component_sum)
            .filter(~ok)
            .select(_FLAGGED)
            .with_columns(diff=pl.col("component_sum") - pl.col("total"))
            .sort("round", "env", "step", maintain_order=True),
        ]
    )
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
