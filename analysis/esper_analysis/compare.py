"""Compare runs: learning curves side by side and differences against a reference.

``esper analyze compare RUN [RUN ...]``: the first run is the reference. Runs started
with the same seed, envs, episode length, task, host and host family train the same
freshly seeded hosts in round ``r``, env ``e`` whatever their policy, so each other run
is compared with the reference *paired* by (round, env) over the rounds both have:
mean difference of the episode reward and of the final accuracy, its standard error
and 95 % interval, and in how many rounds the run was ahead. Runs that do not train
the same hosts are refused, naming the difference (exit 2), unless ``--unpaired`` asks
for unpaired statistics (Welch's interval over the episodes), which the table and the
JSON then say. Groups of seeds (``--group KEY``, or directories of runs) are compared
by :mod:`esper_analysis.groups`. The report overlays the curves (:mod:`compare_report`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, Final

import polars as pl

from esper_analysis.groups import CompareError, late_from
from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult
from esper_analysis.run_info import (
    describe_differences,
    episode_frame,
    pairing_differences,
    run_info,
)
from esper_analysis.stats import PAIRED_BY_EPISODE, WELCH, paired_ci, welch_ci

__all__ = ["CompareError", "Comparison", "compare_runs"]

#: The per-episode numbers averaged over each run's late window.
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
#: Compared metrics: (column in episode_finished, label).
_PAIRED: Final = (("episode_reward", "reward"), ("final_val_acc", "final_acc"))
#: Curves drawn per run: per round the env mean and the lowest and highest env.
CURVE_METRICS: Final = ("episode_reward", "final_val_acc")


@dataclasses.dataclass(frozen=True)
class Comparison(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "runs": "Runs (late = last third of each run's rounds)",
        "paired": "Each run minus the reference, 95 % CI",
        "curves": "Per round: mean over envs, lowest and highest env",
    }
    TEXT_SKIP: ClassVar[frozenset[str]] = frozenset({"curves"})

    runs: pl.DataFrame
    paired: pl.DataFrame
    curves: pl.DataFrame
    reference: str
    n_runs: int
    #: How the differences were computed: paired by (round, env), or unpaired (Welch).
    pairing: str


def _episodes(run: Run) -> pl.DataFrame:
    frame = episode_frame(run)
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
    start = late_from(ep["round"].unique().sort().to_list())
    late = ep.filter(pl.col("round") >= start)
    row: dict[str, Any] = {"run": label, "rounds": ep["round"].n_unique(), "late_from_round": start}
    row["reward_mean"] = float(ep["episode_reward"].mean())  # type: ignore[arg-type]
    for col, name in zip(_EPISODE_COLUMNS, _LATE_NAMES, strict=True):
        row[f"late_{name}"] = float(late[col].mean())  # type: ignore[arg-type]
    return row


def _differences(
    ref: pl.DataFrame, other: pl.DataFrame, label: str, *, unpaired: bool
) -> list[dict[str, Any]]:
    """``other`` minus ``ref`` over the rounds both have: paired by (round, env), or
    Welch over the two runs' episodes of those rounds."""
    shared = ref.select("round").unique().join(other.select("round").unique(), on="round")
    ref = ref.join(shared, on="round")
    other = other.join(shared, on="round")
    joined = ref.join(other, on=["round", "env"], suffix="_run")
    rows = []
    for col, name in _PAIRED:
        if unpaired:
            est = welch_ci(ref[col].to_list(), other[col].to_list())
            per_round = (
                other.group_by("round")
                .agg(pl.col(col).mean())
                .join(ref.group_by("round").agg(pl.col(col).mean()), on="round", suffix="_ref")
                .select("round", diff=pl.col(col) - pl.col(f"{col}_ref"))
            )
        else:
            est = paired_ci(
                (joined[f"{col}_run"] - joined[col]).to_list(), method=PAIRED_BY_EPISODE
            )
            per_round = joined.group_by("round").agg(
                diff=(pl.col(f"{col}_run") - pl.col(col)).mean()
            )
        rows.append(
            {
                "run": label,
                "metric": name,
                "pairing": est.method,
                "n": est.n,
                "mean_diff": est.mean,
                "ci_low": est.low,
                "ci_high": est.high,
                "std_err": est.std_err,
                "rounds_ahead": int((per_round["diff"] > 0).sum()),
                "rounds": per_round.height,
            }
        )
    return rows


_DIFF_SCHEMA: Final = {
    "run": pl.String,
    "metric": pl.String,
    "pairing": pl.String,
    "n": pl.Int64,
    "mean_diff": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "std_err": pl.Float64,
    "rounds_ahead": pl.Int64,
    "rounds": pl.Int64,
}


def check_pairable(runs: Sequence[Run]) -> None:
    """Raise :class:`CompareError` naming the first run that does not train the
    reference's hosts env by env (another seed, envs, task, host or family)."""
    ref = run_info(runs[0])
    for run in runs[1:]:
        diffs = pairing_differences(ref, run_info(run))
        if diffs:
            raise CompareError(
                f"run {run.run_id} cannot be paired env by env with {ref.run_id}: "
                f"{describe_differences(diffs)}; pass --unpaired for unpaired (Welch) "
                "statistics, or compare groups of seeds (--group KEY)"
            )


def curves_of(label: str, ep: pl.DataFrame) -> pl.DataFrame:
    """Per round: the env mean, lowest and highest env of each curve metric."""
    aggs = []
    for col in CURVE_METRICS:
        value = pl.col(col).cast(pl.Float64)
        aggs += [value.mean(), value.min().alias(f"{col}_low"), value.max().alias(f"{col}_high")]
    return ep.group_by("round").agg(*aggs).with_columns(run=pl.lit(label)).sort("round")


def compare_runs(runs: Sequence[Run], *, unpaired: bool = False) -> Comparison:
    """Compare ``runs`` (the first is the reference); see the module docstring."""
    if not runs:
        raise CompareError("compare needs at least one run")
    labels = _label(runs)
    if not unpaired:
        check_pairable(runs)
    episodes = [_episodes(r) for r in runs]
    rows = [_run_row(label, ep) for label, ep in zip(labels, episodes, strict=True)]
    paired: list[dict[str, Any]] = []
    for label, ep in zip(labels[1:], episodes[1:], strict=True):
        paired.extend(_differences(episodes[0], ep, label, unpaired=unpaired))
    curves = pl.concat(
        [curves_of(label, ep) for label, ep in zip(labels, episodes, strict=True)]
    ).select("run", "round", pl.exclude("run", "round"))
    return Comparison(
        runs=pl.DataFrame(rows),
        paired=pl.DataFrame(paired, schema=_DIFF_SCHEMA),
        curves=curves,
        reference=labels[0],
        n_runs=len(runs),
        pairing=(WELCH if unpaired else PAIRED_BY_EPISODE) if len(runs) > 1 else "one run",
    )
