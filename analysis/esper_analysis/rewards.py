"""Reward breakdowns per env, episode, op and component, with a sum check on every row.

The component list is :data:`esper.core.records.REWARD_COMPONENTS`, so a component
added to the reward is picked up here without edits. A row is flagged when its
components do not sum to its total within :data:`SUM_TOLERANCE` (a NaN anywhere flags
it too). A component column missing from an older schema reads as null and counts as
0 in the sum, which is what that older reward computed; the summary names it.

Grouped sums and means are added up in a fixed order (per finest group in row order,
then rolled up over those groups: :mod:`esper_analysis.reward_partials`), so every call
gives the same bits (a parallel group-by adds floats in an order that varies from call
to call).
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, Final

import numpy as np
import polars as pl

from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult
from esper_analysis.reward_checks import SUM_TOLERANCE, RowChecks, flagged_rows, stats, with_check
from esper_analysis.reward_partials import COMPONENTS, FINE, SUMMED, Partials, group_sums
from esper_analysis.reward_stream import stream_partials

__all__ = ["SUM_TOLERANCE", "RewardBreakdown", "reward_breakdown"]


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
        present.update(f.column_names())
    return [c for c in COMPONENTS if c not in present]


def reward_breakdown(run: Run, *, stream: bool = True) -> RewardBreakdown:
    """Totals per env, episode, op and component; flags rows that do not add up.

    ``stream``: read the reward table one row group at a time where the run allows it
    (:mod:`esper_analysis.reward_stream`); False reads it whole. The tables are the same.
    """
    episodes = run.scan("episode_finished").select(
        "rank", "round", "env", pl.col("episode_reward").alias("episode_reward_reported")
    )
    checks = RowChecks()
    partials = stream_partials(run, checks) if stream else None
    if partials is None:  # read whole: the same tables (see reward_stream)
        lf = with_check(run.scan("reward_computed"))
        comp, rows, reported, flagged = pl.collect_all(
            [stats(lf), lf.select(*FINE, *SUMMED), episodes, flagged_rows(lf)]
        )
        partials = Partials.of(rows)
        del rows  # peak memory: every table below is a roll-up of the partials
    else:
        reported = episodes.collect()
        comp, flagged = checks.results()
    flagged = flagged.with_columns(diff=pl.col("component_sum") - pl.col("total")).sort(
        "round", "env", "step", maintain_order=True
    )
    # The two largest roll-ups on a second thread while the others are built (numpy's
    # kernels and polars release the GIL).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="esper-rewards") as pool:
        per_episode = pool.submit(group_sums, partials, ["rank", "round", "env"])
        per_round = pool.submit(group_sums, partials, ["round"], mean=True)
        by_component = _component_table(comp, partials)
        by_env = group_sums(partials, ["env"]).sort("env")
        by_op = (
            group_sums(partials, ["op"])
            .with_columns(mean_total=pl.col("total") / pl.col("rows"))
            .sort("op")
        )
        by_episode = (
            per_episode.result()
            .join(reported, on=["rank", "round", "env"], how="left")
            .sort("round", "env", "rank")
        )
        by_round = per_round.result().sort("round")
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


def _component_table(wide: pl.DataFrame, partials: Partials) -> pl.DataFrame:
    """One row per component (and the total) from the one-row struct aggregate; sum and
    mean are numpy's over the per-group partial sums, in their fixed order (see the
    module docstring)."""
    table = []
    for name in SUMMED:
        stats = dict(wide[name][0] or {}) if wide.height else {}
        present = int(partials.present[name].sum())
        if present:
            stats["sum"] = float(np.sum(partials.sums[name]))
            stats["mean"] = stats["sum"] / present
        table.append({"component": name, **{k: stats.get(k) for k in _STAT_KEYS}})
    return pl.DataFrame(table, schema=_COMPONENT_SCHEMA)


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
