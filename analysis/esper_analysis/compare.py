"""Compare runs: learning curves side by side and paired differences against a reference.

``esper analyze compare RUN [RUN ...]``: the first run is the reference. Runs started
with the same seed get the same freshly seeded hosts in round ``r``, env ``e`` whatever
their policy, so each other run is compared with the reference *paired* by (round, env)
over the rounds both have: mean difference of the episode reward and of the final
accuracy, its standard error, and in how many rounds the run was ahead. The report
overlays the curves (:func:`compare_section`).
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import math
from collections.abc import Sequence
from typing import Any, ClassVar, Final, TextIO

import polars as pl

from esper_analysis.errors import AnalysisError
from esper_analysis.loader import Run, load_run
from esper_analysis.result import AnalysisResult, jsonable
from esper_analysis.tables import WIDTH_HELP, add_max_rows

#: The per-episode numbers a comparison reads from ``episode_finished``.
_EPISODE_COLUMNS: Final = (
    "episode_reward",
    "final_val_acc",
    "params_added",
    "seeds_germinated",
    "seeds_fossilized",
    "seeds_pruned",
)
#: Short names of the late-window means (terminal tables stay narrow).
_LATE_NAMES: Final = ("reward", "acc", "params_added", "germinated", "fossilized", "pruned")
#: Paired metrics: (column in episode_finished, label).
_PAIRED: Final = (("episode_reward", "reward"), ("final_val_acc", "final_acc"))
#: The summary's "late" window is the last third of each run's rounds.
LATE_FRACTION: Final = 3


class CompareError(AnalysisError):
    """A usage error of ``compare`` (exit 2): duplicate runs or a run without episodes."""


@dataclasses.dataclass(frozen=True)
class Comparison(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "runs": "Runs (late = last third of each run's rounds)",
        "paired": "Paired differences against the reference, by (round, env)",
        "curves": "Per round: mean episode reward and final accuracy",
    }
    TEXT_SKIP: ClassVar[frozenset[str]] = frozenset({"curves"})

    runs: pl.DataFrame
    paired: pl.DataFrame
    curves: pl.DataFrame
    reference: str
    n_runs: int


def _episodes(run: Run) -> pl.DataFrame:
    frame = (
        run.scan("episode_finished")
        .select("round", "env", *_EPISODE_COLUMNS)
        .unique(subset=["round", "env"], keep="last", maintain_order=True)
        .collect()
    )
    if frame.height == 0:
        raise CompareError(f"run {run.run_id} ({run.path}) has no finished episodes to compare")
    return frame


def _label(runs: Sequence[Run]) -> list[str]:
    labels = [r.run_id for r in runs]
    seen: set[str] = set()
    for r, label in zip(runs, labels, strict=True):
        if label in seen:
            raise CompareError(f"run {label} ({r.path}) is given twice")
        seen.add(label)
    return labels


def _run_row(label: str, ep: pl.DataFrame) -> dict[str, Any]:
    rounds = ep["round"].unique().sort()
    late_from = int(rounds[len(rounds) - max(len(rounds) // LATE_FRACTION, 1)])
    late = ep.filter(pl.col("round") >= late_from)
    row: dict[str, Any] = {"run": label, "rounds": len(rounds), "late_from_round": late_from}
    row["reward_mean"] = float(ep["episode_reward"].mean())  # type: ignore[arg-type]
    for col, name in zip(_EPISODE_COLUMNS, _LATE_NAMES, strict=True):
        row[f"late_{name}"] = float(late[col].mean())  # type: ignore[arg-type]
    return row


def _paired(ref: pl.DataFrame, other: pl.DataFrame, label: str) -> list[dict[str, Any]]:
    joined = ref.join(other, on=["round", "env"], suffix="_run")
    rows = []
    for col, name in _PAIRED:
        per_round = joined.group_by("round").agg((pl.col(f"{col}_run") - pl.col(col)).mean())
        diffs = joined[f"{col}_run"] - joined[col]
        n = diffs.len()
        sd = float(diffs.std()) if n > 1 else math.nan  # type: ignore[arg-type]
        rows.append(
            {
                "run": label,
                "metric": name,
                "pairs": n,
                "mean_diff": float(diffs.mean()) if n else math.nan,  # type: ignore[arg-type]
                "std_err": sd / math.sqrt(n) if n > 1 else math.nan,
                "rounds_ahead": int((per_round[f"{col}_run"] > 0).sum()),
                "rounds": per_round.height,
            }
        )
    return rows


def compare_runs(runs: Sequence[Run]) -> Comparison:
    """Compare ``runs`` (the first is the reference); see the module docstring."""
    if not runs:
        raise CompareError("compare needs at least one run")
    labels = _label(runs)
    episodes = [_episodes(r) for r in runs]
    rows = [_run_row(label, ep) for label, ep in zip(labels, episodes, strict=True)]
    paired: list[dict[str, Any]] = []
    for label, ep in zip(labels[1:], episodes[1:], strict=True):
        paired.extend(_paired(episodes[0], ep, label))
    curves = pl.concat(
        [
            ep.group_by("round")
            .agg(pl.col("episode_reward").mean(), pl.col("final_val_acc").mean())
            .with_columns(run=pl.lit(label))
            for label, ep in zip(labels, episodes, strict=True)
        ]
    ).sort("run", "round")
    paired_schema = {
        "run": pl.String,
        "metric": pl.String,
        "pairs": pl.Int64,
        "mean_diff": pl.Float64,
        "std_err": pl.Float64,
        "rounds_ahead": pl.Int64,
        "rounds": pl.Int64,
    }
    return Comparison(
        runs=pl.DataFrame(rows),
        paired=pl.DataFrame(paired, schema=paired_schema),
        curves=curves.select("run", "round", "episode_reward", "final_val_acc"),
        reference=labels[0],
        n_runs=len(runs),
    )


# --- command line ----------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    """Register ``compare`` on the analyze sub-parsers."""
    p = sub.add_parser(
        "compare",
        help="compare runs: curves and paired differences against the first run",
        description=(
            "Compare runs side by side; the first RUN is the reference, the others are "
            "paired with it by (round, env). Runs with the same seed train the same hosts "
            "whatever their policy, so a PPO run and its baselines "
            "(esper train --policy heuristic|eager|random|static) compare pair by pair."
        ),
        epilog=WIDTH_HELP,
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_max_rows(p)


def run_compare(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``esper analyze compare``; returns the exit code (errors raise AnalysisError: 2)."""
    from esper_analysis.tables import console_for, print_result

    runs = [load_run(path) for path in args.runs]
    for run in runs:
        if run.recovery is not None:
            err.write(f"warning: {run.recovery.message}\n")
    result = compare_runs(runs)
    if args.json:
        info = [{"run_id": r.run_id, "path": str(r.path), "status": r.status} for r in runs]
        payload = {"runs_compared": info, **result.to_json()}
        out.write(json.dumps(jsonable(payload), indent=2, allow_nan=False) + "\n")
        return 0
    print_result(result, console_for(out), max_rows=args.max_rows)  # its summary names them
    return 0


# --- report ------------------------------------------------------------------------------


def compare_section(runs: Sequence[Run]) -> str:
    """HTML for the report: overlaid curves and the paired-difference table."""
    from esper_analysis.svg import Series, line_chart
    from esper_analysis.tables import html_table

    result = compare_runs(runs)
    charts = []
    plots = (
        ("episode_reward", "Mean episode reward", "reward"),
        ("final_val_acc", "Final accuracy", "accuracy (%)"),
    )
    for col, title, y_label in plots:
        series = [
            Series(
                label,
                result.curves.filter(pl.col("run") == label)["round"].cast(pl.Float64).to_list(),
                result.curves.filter(pl.col("run") == label)[col].to_list(),
            )
            for label in result.runs["run"].to_list()
        ]
        charts.append(
            line_chart(
                f"compare-{col}", f"{title} per round", series, x_label="round", y_label=y_label
            )
        )
    note = (
        f"<p>Reference: {html.escape(result.reference)}. Differences are run minus "
        "reference, paired by (round, env).</p>"
    )
    return "".join(charts) + note + html_table(result.paired) + html_table(result.runs)
