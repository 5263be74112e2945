"""The report's compared-runs section: curves overlaid with their spread as bands, and
the differences against the reference (runs pair by pair, or groups of seeds)."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Final

import polars as pl

from esper_analysis.compare import Comparison, compare_runs
from esper_analysis.compare_cli import group_label
from esper_analysis.groups import GroupComparison, compare_groups
from esper_analysis.loader import Run
from esper_analysis.run_info import run_info
from esper_analysis.svg import Series, line_chart
from esper_analysis.tables import html_table

#: The x axes the report can draw per-round charts on.
X_AXES: Final = ("round", "env-steps")
#: (column, chart title, y label) of the overlaid curves.
_PLOTS: Final = (
    ("episode_reward", "Mean episode reward", "reward"),
    ("final_val_acc", "Final accuracy", "accuracy (%)"),
)
#: The group comparison's names of the same metrics.
_GROUP_METRIC: Final = {"episode_reward": "reward", "final_val_acc": "final_acc"}


def steps_per_round(run: Run) -> int | None:
    """Env-steps one round adds (all envs of all ranks), when the run recorded it."""
    info = run_info(run)
    if info.envs is None or info.episode_length is None:
        return None
    return info.envs * info.episode_length


def x_values(rounds: Sequence[int], per_round: int | None, x_axis: str) -> list[float]:
    """Rounds, or the env-steps done by the end of each round."""
    if x_axis == "env-steps" and per_round:
        return [float((r + 1) * per_round) for r in rounds]
    return [float(r) for r in rounds]


def x_label(x_axis: str) -> str:
    return "env-steps (at the end of each round)" if x_axis == "env-steps" else "round"


def compare_section(
    runs: Sequence[Run], *, by: str | None = None, unpaired: bool = False, x_axis: str = "round"
) -> str:
    """HTML for the report: the first run is the reference; ``by`` groups the runs (mean
    over seeds, 95 % CI bands) instead of comparing them pair by pair."""
    if by is None:
        return _runs_section(runs, compare_runs(runs, unpaired=unpaired), x_axis)
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(group_label(run, by), []).append(run)
    result = compare_groups(groups, grouped_by=by, unpaired=unpaired)
    per_round = {name: steps_per_round(rs[0]) for name, rs in groups.items()}
    return _groups_section(result, per_round, x_axis)


def _curve_charts(
    curves: pl.DataFrame,
    key: str,
    labels: list[str],
    per_round: dict[str, int | None],
    x_axis: str,
    *,
    metric: Callable[[str], str],
    by: str = "",
) -> list[str]:
    """One line chart per plotted column, a line (and band) per label, in ``labels``'
    order (the curves' rows where ``key`` is that label)."""
    charts = []
    for col, title, y_label in _PLOTS:
        name = metric(col)
        series = []
        for label in labels:
            frame = curves.filter(pl.col(key) == label)
            series.append(
                Series(
                    label,
                    x_values(frame["round"].to_list(), per_round.get(label), x_axis),
                    frame[name].to_list(),
                    low=frame[f"{name}_low"].to_list(),
                    high=frame[f"{name}_high"].to_list(),
                )
            )
        charts.append(
            line_chart(
                f"compare-{col}",
                f"{title} per round" + (f", by {by}" if by else ""),
                series,
                x_label=x_label(x_axis),
                y_label=y_label,
                zero_based=col == "episode_reward",
            )
        )
    return charts


def _runs_section(runs: Sequence[Run], result: Comparison, x_axis: str) -> str:
    per_round = {r.run_id: steps_per_round(r) for r in runs}
    labels = result.runs["run"].to_list()
    charts = _curve_charts(result.curves, "run", labels, per_round, x_axis, metric=str)
    note = (
        f"<p class='note'>Lines: mean over envs; bands: lowest to highest env. Reference: "
        f"{html.escape(result.reference)}; differences are run minus reference, "
        f"{html.escape(result.pairing)}, with 95 % confidence intervals.</p>"
    )
    return "".join(charts) + note + html_table(result.paired) + html_table(result.runs)


def _groups_section(result: GroupComparison, per_round: dict[str, int | None], x_axis: str) -> str:
    labels = result.groups["group"].unique(maintain_order=True).to_list()
    charts = _curve_charts(
        result.curves, "group", labels, per_round, x_axis, metric=_GROUP_METRIC.__getitem__,
        by=result.grouped_by,
    )  # fmt: skip
    note = (
        "<p class='note'>Lines: mean over each group's seeds; bands: 95 % confidence "
        "interval over seeds (none for a group of one seed). Reference group: "
        f"{html.escape(result.reference)}; differences are group minus reference, "
        f"{html.escape(result.pairing)}, over rounds {html.escape(result.rounds_compared)}"
        " (late: the last third).</p>"
    )
    return (
        "".join(charts)
        + note
        + html_table(result.groups)
        + html_table(result.differences)
        + html_table(result.seeds)
    )
