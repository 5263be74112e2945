"""Seed lifecycles: one row per seed from germination to its end, and per-blueprint rates.

A seed is identified by ``(run_id, rank, round, env, slot, seed_id)``. Its outcome is
``fossilized`` or ``pruned`` when that event exists, else ``alive`` (still in the slot
when the episode ended, or when a crashed run stopped). Stage durations are in epochs
(env-steps): the ``epochs_in_prev_stage`` of each recorded transition, plus, for a seed
alive at the end, the time from entering its last stage to the episode's end step.

Two ways build the same tables. Where every seed has exactly one germination (a run as
the trainer writes it), :mod:`esper_analysis.dense_lifecycles` numbers the seeds densely
and works by gathers and scatters; otherwise (a crash cut a seed's events, files were
edited) the seed events are joined on the seed key here, or on its 64-bit hash where
that is collision-free for the run.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Final

import numpy as np
import polars as pl

from esper.core.enums import SeedStage
from esper_analysis.dense_lifecycles import dense_tables
from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult
from esper_analysis.seed_events import (
    COLUMNS,
    EPISODE_KEY,
    INT_KEY,
    LIVE_STAGES,
    SEED_HASH,
    SEED_KEY,
    TIMELINE_STAGES,
    derived_seed_columns,
    duration_column,
    order_key,
    read_seed_events,
)

__all__ = ["LIVE_STAGES", "TIMELINE_STAGES", "Lifecycles", "seed_lifecycles", "with_stage"]


@dataclasses.dataclass(frozen=True)
class Lifecycles(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "seeds": "Seeds (germination to end)",
        "by_blueprint": "Per blueprint",
        "segments": "Stage segments (timeline)",
    }
    TEXT_COLUMNS: ClassVar[dict[str, tuple[str, ...]]] = {
        "seeds": (
            "round",
            "env",
            "slot",
            "seed_id",
            "blueprint",
            "outcome",
            "germinated_step",
            "ended_step",
            *(f"epochs_{s.lower()}" for s in LIVE_STAGES),
            "contribution",
        )
    }
    TEXT_SKIP: ClassVar[frozenset[str]] = frozenset({"segments"})

    seeds: pl.DataFrame
    by_blueprint: pl.DataFrame
    segments: pl.DataFrame
    germinated: int
    fossilized: int
    pruned: int
    alive: int


def _seed_keys(frames: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Every distinct seed (``SEED_KEY`` plus its hash) named by any seed event."""
    distinct = pl.concat([f.lazy().select(*SEED_KEY, SEED_HASH) for f in frames.values()])
    return distinct.unique().collect()  # lazily: about half the time of the eager unique


def _narrow(frames: dict[str, pl.DataFrame], key: list[str]) -> dict[str, pl.DataFrame]:
    """On the hash key, the frames without the string key columns (the seed table has
    them); on the six-column key, the frames as read."""
    if key != [SEED_HASH]:
        return frames
    return {t: f.select(*dict.fromkeys([*key, *INT_KEY]), *COLUMNS[t]) for t, f in frames.items()}


def _join_key(keys: pl.DataFrame) -> list[str]:
    """Join on the one-integer hash when it is collision-free in this run (checked on the
    distinct seeds), else on the six key columns; the results are the same."""
    return [SEED_HASH] if keys[SEED_HASH].n_unique() == keys.height else list(SEED_KEY)


def _starts(frames: dict[str, pl.DataFrame], key: list[str]) -> pl.DataFrame:
    """Germinations and stage changes, sorted by seed then ``seq``: the one sort both the
    stage durations and the timeline segments are read from."""
    cols = [*dict.fromkeys([*key, *INT_KEY]), "seq", "step"]
    germ = frames["seed_germinated"].select(*cols, stage=pl.lit(SeedStage.GERMINATED.value))
    changes = frames["seed_stage_changed"].select(
        *cols, "from_stage", "epochs_in_prev_stage", stage="to_stage"
    )
    return pl.concat([germ, changes], how="diagonal").sort(*key, "seq")


def _stage_durations(starts: pl.DataFrame, key: list[str]) -> pl.LazyFrame:
    """Recorded epochs per live stage, one column per stage, and the last change."""
    changes = starts.lazy().filter(pl.col("from_stage").is_not_null())
    return changes.group_by(key).agg(  # rows keep their (seed, seq) order within a group
        *(
            pl.col("epochs_in_prev_stage")
            .filter(pl.col("from_stage") == stage)
            .sum()
            .alias(duration_column(stage))
            for stage in LIVE_STAGES
        ),
        last_stage=pl.col("stage").last(),
        last_change_step=pl.col("step").last(),
    )


def _seed_table(
    run: Run,
    frames: dict[str, pl.DataFrame],
    keys: pl.DataFrame,
    key: list[str],
    durations: pl.LazyFrame,
) -> pl.LazyFrame:
    germ = (
        frames["seed_germinated"].lazy().select(*key, "blueprint", "params", germinated_step="step")
    )
    fossil = (
        frames["seed_fossilized"]
        .lazy()
        .select(*key, fossil_step="step", fossil_contribution="contribution")
    )
    pruned = (
        frames["seed_pruned"]
        .lazy()
        .select(
            *key,
            "reason",
            "initiator",
            "stage_at_prune",
            prune_step="step",
            prune_contribution="contribution",
        )
    )
    episodes = run.scan("episode_finished").select(*EPISODE_KEY, episode_end_step="step")
    joined = (
        keys.lazy()
        .join(germ, on=key, how="left", nulls_equal=True)
        .join(durations, on=key, how="left", nulls_equal=True)
        .join(fossil, on=key, how="left", nulls_equal=True)
        .join(pruned, on=key, how="left", nulls_equal=True)
        .join(episodes, on=EPISODE_KEY, how="left")
    )
    return (
        derived_seed_columns(joined, SEED_HASH)
        # seed_id last: every tie broken, so the table's row order is deterministic
        .sort(
            "run_id",
            "rank",
            "round",
            "env",
            "germinated_step",
            "slot",
            "seed_id",
            nulls_last=True,
        )
    )


def _segments(
    starts: pl.DataFrame, seeds: pl.DataFrame, keys: pl.DataFrame, key: list[str]
) -> pl.DataFrame:
    """Timeline pieces ``(seed, stage, start_step, end_step)`` of live and fossilized stages.

    A piece ends where the seed's next transition happens (``starts`` is sorted by seed,
    then ``seq``); the last one (fossilized, or alive at the end) runs to the episode's
    end. Sorted by run, rank, round, env, start step and ``seq`` (a total order), on
    integers; the string key columns are joined last.
    """
    same_seed = pl.all_horizontal(pl.col(k) == pl.col(k).shift(-1) for k in key)
    ends = seeds.select(*key, "episode_end_step", "ended_step")
    pieces = (
        starts.lazy()
        .with_columns(next_step=pl.when(same_seed).then(pl.col("step").shift(-1)))
        .filter(pl.col("stage").is_in(TIMELINE_STAGES))
        .join(ends.lazy(), on=key, how="left", nulls_equal=True, maintain_order="left")
        .with_columns(end_step=pl.coalesce("next_step", "episode_end_step", "ended_step", "step"))
        .select(*dict.fromkeys([*key, *INT_KEY]), "seq", "stage", "step", "end_step")
        .collect()
    )
    by = [*INT_KEY, "step"]
    if key == [SEED_HASH]:  # one run id sorts like none; several: sort on it first
        if keys["run_id"].n_unique() > 1:
            run_ids = keys.select(SEED_HASH, "run_id")
            pieces = pieces.join(run_ids, on=SEED_HASH, how="left", maintain_order="left")
            by = ["run_id", *by]
        ordered = pieces.sort(
            *order_key(pieces, [*by, "seq"]) if by[0] != "run_id" else [*by, "seq"]
        )
        names = keys.select(SEED_HASH, *(c for c in SEED_KEY if c not in INT_KEY))
        ordered = ordered.drop("run_id", strict=False).join(
            names, on=SEED_HASH, how="left", maintain_order="left"
        )
    else:
        ordered = pieces.sort("run_id", *by, "seq")
    return ordered.select(*SEED_KEY, "stage", start_step="step", end_step="end_step")


def _keyed_tables(run: Run, frames: dict[str, pl.DataFrame]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Seed table and segments by joins on the seed key (or its hash where that is
    collision-free): the general way, for any mix of seed events."""
    keys = _seed_keys(frames)
    key = _join_key(keys)
    frames = _narrow(frames, key)
    starts = _starts(frames, key)
    seeds_with_hash = _seed_table(run, frames, keys, key, _stage_durations(starts, key)).collect()
    del frames  # peak memory: the event frames are not needed past this point
    segments = _segments(
        starts.drop("from_stage", "epochs_in_prev_stage"), seeds_with_hash, keys, key
    )
    return seeds_with_hash.drop(SEED_HASH), segments


def _by_blueprint(seeds: pl.DataFrame) -> pl.DataFrame:
    """Per-blueprint counts and means. The means are sums in ``np.bincount`` over the
    seed table's fixed row order, so every run of the analysis gives the same bits (a
    parallel group-by sums in an order that varies from run to run)."""
    if seeds.is_empty():
        return pl.DataFrame(schema=_BY_BLUEPRINT_SCHEMA)
    seen = seeds.select(pl.col("blueprint").unique(maintain_order=True)).to_series()
    named = seen.drop_nulls()
    # A seed without a germination event has no blueprint: its group, if any, comes last.
    names = named.extend(pl.Series([None], dtype=named.dtype)) if seen.null_count() else named
    code = pl.col("blueprint").replace_strict(
        named, np.arange(len(named)), default=len(named), return_dtype=pl.Int64
    )
    outcome = pl.col("outcome")
    contribution = pl.col("contribution").cast(pl.Float64)
    ended = outcome.is_in(["fossilized", "pruned"]) & contribution.is_finite().fill_null(False)
    fossil = (outcome == "fossilized") & contribution.is_finite().fill_null(False)
    cols = seeds.select(
        code=code,
        fossilized=outcome == "fossilized",
        pruned=outcome == "pruned",
        alive=outcome == "alive",
        ended=ended,
        fossil=fossil,
        contribution=contribution.fill_nan(0.0).fill_null(0.0),
        lifetime=pl.col("lifetime_epochs").cast(pl.Float64),
    )
    group = cols["code"].to_numpy()
    n = len(names)

    def count(mask: str) -> np.ndarray:
        return np.bincount(group, weights=cols[mask].to_numpy(), minlength=n)

    def mean(values: np.ndarray, weights: np.ndarray) -> pl.Series:
        total = np.bincount(group, weights=values * weights, minlength=n)
        seen = np.bincount(group, weights=weights, minlength=n)
        means = np.divide(total, seen, out=np.zeros(n), where=seen > 0)
        return pl.Series(means).scatter(np.flatnonzero(seen == 0), None)

    contributions = cols["contribution"].to_numpy()
    lifetime = cols["lifetime"]
    fossilized, pruned = count("fossilized"), count("pruned")
    ended_count = fossilized + pruned
    rate = np.divide(fossilized, ended_count, out=np.zeros(n), where=ended_count > 0)
    table = pl.DataFrame(
        {
            "blueprint": names,
            "germinated": np.bincount(group, minlength=n),
            "fossilized": fossilized,
            "pruned": pruned,
            "alive": count("alive"),
            "fossilize_rate": pl.Series(rate).scatter(np.flatnonzero(ended_count == 0), None),
            "mean_contribution": mean(contributions, cols["ended"].to_numpy()),
            "mean_contribution_fossilized": mean(contributions, cols["fossil"].to_numpy()),
            "mean_lifetime_epochs": mean(
                lifetime.fill_null(0.0).to_numpy(), lifetime.is_not_null().to_numpy()
            ),
        },
        schema=_BY_BLUEPRINT_SCHEMA,
        strict=False,
    )
    return table.sort("germinated", "blueprint", descending=[True, False], nulls_last=True)


_BY_BLUEPRINT_SCHEMA: Final = {
    "blueprint": pl.String,
    "germinated": pl.UInt32,
    "fossilized": pl.UInt32,
    "pruned": pl.UInt32,
    "alive": pl.UInt32,
    "fossilize_rate": pl.Float64,
    "mean_contribution": pl.Float64,
    "mean_contribution_fossilized": pl.Float64,
    "mean_lifetime_epochs": pl.Float64,
}


def seed_lifecycles(run: Run) -> Lifecycles:
    """Per-seed lifecycle table, per-blueprint rates and the timeline segments."""
    tables = dense_tables(run, read_seed_events(run, keys=False))
    if tables is None:  # its preconditions do not hold: the general way, on the full keys
        tables = _keyed_tables(run, read_seed_events(run))
    seeds, segments = tables
    outcomes = seeds["outcome"].value_counts()
    count = dict(zip(outcomes["outcome"].to_list(), outcomes["count"].to_list(), strict=True))
    return Lifecycles(
        seeds=seeds,
        by_blueprint=_by_blueprint(seeds),
        segments=segments,
        germinated=seeds.height,
        fossilized=int(count.get("fossilized", 0)),
        pruned=int(count.get("pruned", 0)),
        alive=int(count.get("alive", 0)),
    )


def with_stage(seeds: pl.DataFrame) -> pl.DataFrame:
    """``seeds`` plus ``stage``: PRUNED / FOSSILIZED for ended seeds, else the stage it is in.

    (``final_stage`` of a pruned seed is the stage it was pruned from.)
    """
    return seeds.with_columns(
        stage=pl.when(pl.col("outcome") == "pruned")
        .then(pl.lit(SeedStage.PRUNED.value))
        .when(pl.col("outcome") == "fossilized")
        .then(pl.lit(SeedStage.FOSSILIZED.value))
        .otherwise(pl.col("final_stage"))
    )
