"""Groups of seeds: per group the mean over seeds with a 95 % confidence interval, and
each group against a reference group, paired by seed where they share seeds.

The unit is the seed: each run contributes one number per metric, the mean over the
episodes of the last third of its rounds (its *late* mean). Groups are compared by the
differences of those numbers seed by seed (runs with the same seed and hosts train the
same hosts whatever their policy), else, where no seed can be paired, by Welch's
interval. The frame functions here take plain per-round tables, so the learning
benchmark (which holds its runs in memory) uses them as ``esper analyze compare``
does; :func:`compare_groups` applies them to run directories.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

import polars as pl

from esper_analysis.errors import AnalysisError
from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult
from esper_analysis.run_info import (
    RunInfo,
    describe_differences,
    episode_frame,
    pairing_differences,
    run_info,
)
from esper_analysis.stats import (
    PAIRED_BY_SEED,
    T_OVER_SEEDS,
    WELCH,
    Estimate,
    mean_ci,
    paired_ci,
    welch_ci,
)

#: The late window is the last third of a run's rounds (at least one round).
LATE_FRACTION: Final = 3
#: Metrics of a group comparison: name -> ``episode_finished`` column.
METRICS: Final = {
    "reward": "episode_reward",
    "final_acc": "final_val_acc",
    "params_added": "params_added",
}
GROUP: Final = "group"
SEED: Final = "seed"
ROUND: Final = "round"


class CompareError(AnalysisError):
    """Runs or groups that cannot be compared as asked (exit 2), with the reason."""


def late_from(rounds: Sequence[int]) -> int:
    """First round of the last third of ``rounds`` (sorted, distinct)."""
    return int(rounds[len(rounds) - max(len(rounds) // LATE_FRACTION, 1)])


def seed_means(per_round: pl.DataFrame, metrics: Sequence[str]) -> pl.DataFrame:
    """Per (group, seed): the late window's first round, the rounds played and each
    metric's mean over the late rounds (``per_round``: one row per group, seed, round,
    with the round's env means)."""
    rows = []
    for (group, seed), frame in per_round.group_by(GROUP, SEED, maintain_order=True):
        rounds = frame[ROUND].unique().sort().to_list()
        start = late_from(rounds)
        late = frame.filter(pl.col(ROUND) >= start)
        row: dict[str, Any] = {
            GROUP: group,
            SEED: seed,
            "rounds": len(rounds),
            "late_from_round": start,
        }
        for m in metrics:
            value = late[m].mean()
            row[m] = math.nan if value is None else float(value)  # type: ignore[arg-type]
        rows.append(row)
    schema = {GROUP: pl.String, SEED: pl.Int64, "rounds": pl.Int64, "late_from_round": pl.Int64}
    return pl.DataFrame(rows, schema={**schema, **dict.fromkeys(metrics, pl.Float64)})


def _estimate_row(estimate: Estimate) -> dict[str, Any]:
    return {
        "mean": estimate.mean,
        "ci_low": estimate.low,
        "ci_high": estimate.high,
        "std_err": estimate.std_err,
    }


def group_summary(per_seed: pl.DataFrame, metrics: Sequence[str]) -> pl.DataFrame:
    """Per group and metric: seeds, mean over seeds and its 95 % interval."""
    rows = []
    for group in per_seed[GROUP].unique(maintain_order=True).to_list():
        frame = per_seed.filter(pl.col(GROUP) == group)
        for m in metrics:
            estimate = mean_ci(frame[m].to_list())
            rows.append({GROUP: group, "metric": m, "seeds": estimate.n, **_estimate_row(estimate)})
    return pl.DataFrame(rows, schema=_SUMMARY_SCHEMA)


_SUMMARY_SCHEMA: Final = {
    GROUP: pl.String,
    "metric": pl.String,
    "seeds": pl.Int64,
    "mean": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "std_err": pl.Float64,
}


def group_difference(
    per_seed: pl.DataFrame, reference: str, group: str, metric: str, *, paired: bool
) -> Estimate:
    """``group`` minus ``reference`` on one metric: paired over their shared seeds, or
    Welch over all their seeds."""
    ref = per_seed.filter(pl.col(GROUP) == reference).select(SEED, metric)
    other = per_seed.filter(pl.col(GROUP) == group).select(SEED, metric)
    if not paired:
        return welch_ci(ref[metric].to_list(), other[metric].to_list())
    joined = ref.join(other, on=SEED, suffix="_other")
    diffs = (joined[f"{metric}_other"] - joined[metric]).to_list()
    return paired_ci(diffs, method=PAIRED_BY_SEED)


def group_differences(
    per_seed: pl.DataFrame,
    reference: str,
    metrics: Sequence[str],
    paired: Mapping[str, bool],
) -> pl.DataFrame:
    """Each group but the reference minus the reference, per metric (``paired``: per
    group, whether it is paired with the reference by seed)."""
    rows = []
    for group in per_seed[GROUP].unique(maintain_order=True).to_list():
        if group == reference:
            continue
        for m in metrics:
            est = group_difference(per_seed, reference, group, m, paired=paired[group])
            rows.append(
                {
                    GROUP: group,
                    "metric": m,
                    "pairing": est.method,
                    "seeds": est.n,
                    "mean_diff": est.mean,
                    "ci_low": est.low,
                    "ci_high": est.high,
                    "std_err": est.std_err,
                }
            )
    schema = {
        GROUP: pl.String,
        "metric": pl.String,
        "pairing": pl.String,
        "seeds": pl.Int64,
        "mean_diff": pl.Float64,
        "ci_low": pl.Float64,
        "ci_high": pl.Float64,
        "std_err": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema)


def group_curves(per_round: pl.DataFrame, metrics: Sequence[str]) -> pl.DataFrame:
    """Per group and round: each metric's mean over the seeds that reached the round,
    with its 95 % interval over seeds (NaN with one seed) and the seeds counted."""
    rows = []
    for (group, rnd), frame in per_round.sort(GROUP, ROUND).group_by(
        GROUP, ROUND, maintain_order=True
    ):
        row: dict[str, Any] = {GROUP: group, ROUND: rnd, "seeds": frame.height}
        for m in metrics:
            est = mean_ci(frame[m].to_list(), method=T_OVER_SEEDS)
            row.update({m: est.mean, f"{m}_low": est.low, f"{m}_high": est.high})
        rows.append(row)
    schema: dict[str, Any] = {GROUP: pl.String, ROUND: pl.Int64, "seeds": pl.Int64}
    for m in metrics:
        schema.update(dict.fromkeys((m, f"{m}_low", f"{m}_high"), pl.Float64))
    return pl.DataFrame(rows, schema=schema)


# --- run directories ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GroupComparison(AnalysisResult):
    """Groups of seeds side by side and against the first group (the reference)."""

    TITLES: ClassVar[dict[str, str]] = {
        "groups": "Groups: late mean over seeds, 95 % CI",
        "differences": "Each group minus the reference, 95 % CI",
        "seeds": "Runs: late means (last third of each run's rounds)",
        "curves": "Per round: mean over seeds, 95 % CI",
    }
    TEXT_SKIP: ClassVar[frozenset[str]] = frozenset({"curves"})

    groups: pl.DataFrame
    differences: pl.DataFrame
    seeds: pl.DataFrame
    curves: pl.DataFrame
    reference: str
    grouped_by: str
    pairing: str
    rounds_compared: str


def _group_checks(name: str, runs: Sequence[Run], infos: Sequence[RunInfo]) -> None:
    """One run per seed, and runs that differ in their seed alone."""
    by_seed: dict[int | None, str] = {}
    for run, info in zip(runs, infos, strict=True):
        if info.seed in by_seed:
            raise CompareError(
                f"group {name} has seed {info.seed} twice (runs {by_seed[info.seed]} and "
                f"{run.run_id}): a group averages over seeds, one run each"
            )
        by_seed[info.seed] = run.run_id
        diffs = pairing_differences(infos[0], info, ignore=frozenset({"seed"}))
        if diffs:
            raise CompareError(
                f"group {name}: run {run.run_id} differs from {infos[0].run_id} in more than "
                f"its seed: {describe_differences(diffs)}"
            )


def _pairable(
    ref: Sequence[RunInfo], other: Sequence[RunInfo], ref_name: str, name: str
) -> str | None:
    """Why group ``name`` cannot be paired by seed with the reference (None: it can)."""
    ref_by_seed = {i.seed: i for i in ref}
    shared = [i for i in other if i.seed in ref_by_seed]
    if not shared:
        seeds = ", ".join(str(i.seed) for i in ref)
        theirs = ", ".join(str(i.seed) for i in other)
        return f"they share no seed ({ref_name}: {seeds}; {name}: {theirs})"
    for info in shared:
        diffs = pairing_differences(ref_by_seed[info.seed], info)
        if diffs:
            return f"seed {info.seed} trains other hosts: {describe_differences(diffs)}"
    return None


def _per_round(label: str, run: Run, info: RunInfo) -> pl.DataFrame:
    episodes = episode_frame(run)
    if episodes.height == 0:
        raise CompareError(f"run {run.run_id} ({run.path}) has no finished episodes to compare")
    cols = [pl.col(c).cast(pl.Float64).mean().alias(m) for m, c in METRICS.items()]
    return (
        episodes.group_by(ROUND)
        .agg(*cols)
        .with_columns(pl.lit(label).alias(GROUP), pl.lit(info.seed, dtype=pl.Int64).alias(SEED))
        .select(GROUP, SEED, ROUND, *METRICS)
        .sort(ROUND)
    )


def common_rounds(frames: Sequence[pl.DataFrame], names: Sequence[str]) -> pl.DataFrame:
    """The per-round frames of several runs cut to the rounds every run played, so each
    seed's late window covers the same rounds in every group."""
    shared = set(frames[0][ROUND].to_list())
    for frame in frames[1:]:
        shared &= set(frame[ROUND].to_list())
    if not shared:
        raise CompareError(f"runs {', '.join(names)} share no round with finished episodes")
    return pl.concat(frames).filter(pl.col(ROUND).is_in(sorted(shared)))


def compare_groups(
    groups: Mapping[str, Sequence[Run]], *, grouped_by: str, unpaired: bool = False
) -> GroupComparison:
    """Compare groups of runs (the first is the reference); see the module docstring.

    Raises :class:`CompareError` naming the runs when a group is not a set of seeds of
    one configuration, or when a group cannot be paired with the reference by seed
    and ``unpaired`` was not asked for.
    """
    if len(groups) < 1:
        raise CompareError("compare needs at least one group")
    infos = {name: [run_info(r) for r in runs] for name, runs in groups.items()}
    for name, runs in groups.items():
        _group_checks(name, runs, infos[name])
    reference = next(iter(groups))
    paired: dict[str, bool] = {}
    for name in groups:
        if name == reference:
            continue
        why = _pairable(infos[reference], infos[name], reference, name)
        if why is not None and not unpaired:
            raise CompareError(
                f"group {name} cannot be paired by seed with group {reference}: {why}; "
                "pass --unpaired for unpaired (Welch) statistics"
            )
        paired[name] = not unpaired
    per_round = common_rounds(
        [
            _per_round(name, run, info)
            for name, runs in groups.items()
            for run, info in zip(runs, infos[name], strict=True)
        ],
        [r.run_id for runs in groups.values() for r in runs],
    )
    metrics = list(METRICS)
    per_seed = seed_means(per_round, metrics)
    run_ids = pl.DataFrame(
        {
            GROUP: [n for n, runs in groups.items() for _ in runs],
            SEED: [i.seed for n in groups for i in infos[n]],
            "run": [r.run_id for runs in groups.values() for r in runs],
        },
        schema={GROUP: pl.String, SEED: pl.Int64, "run": pl.String},
    )
    seeds = per_seed.join(run_ids, on=[GROUP, SEED], how="left").select(
        GROUP, SEED, "run", "rounds", "late_from_round", *metrics
    )
    methods = {WELCH if unpaired else PAIRED_BY_SEED} if len(groups) > 1 else set()
    return GroupComparison(
        groups=group_summary(per_seed, metrics),
        differences=group_differences(per_seed, reference, metrics, paired),
        seeds=seeds,
        curves=group_curves(per_round, metrics),
        reference=reference,
        grouped_by=grouped_by,
        pairing=", ".join(sorted(methods)) or "one group",
        rounds_compared=_span(per_round[ROUND].unique().sort().to_list()),
    )


def _span(rounds: Sequence[int]) -> str:
    return f"{rounds[0]}-{rounds[-1]}" if len(rounds) > 1 else str(rounds[0])
