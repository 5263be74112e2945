"""Seed lifecycles: one row per seed from germination to its end, and per-blueprint rates.

A seed is identified by ``(run_id, rank, round, env, slot, seed_id)``. Its outcome is
``fossilized`` or ``pruned`` when that event exists, else ``alive`` (still in the slot
when the episode ended, or when a crashed run stopped). Stage durations are in epochs
(env-steps): the ``epochs_in_prev_stage`` of each recorded transition, plus, for a seed
alive at the end, the time from entering its last stage to the episode's end step.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Final

import polars as pl

from esper.core.enums import SeedStage
from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult

SEED_KEY: Final = ["run_id", "rank", "round", "env", "slot", "seed_id"]
#: Stages a seed lives through before its end, in order (durations are reported for them).
LIVE_STAGES: Final = (
    SeedStage.GERMINATED.value,
    SeedStage.TRAINING.value,
    SeedStage.BLENDING.value,
    SeedStage.HOLDING.value,
)
#: Stages drawn on the timeline (live stages plus the permanent one).
TIMELINE_STAGES: Final = (*LIVE_STAGES, SeedStage.FOSSILIZED.value)
_EPISODE_KEY: Final = ["run_id", "rank", "round", "env"]


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


def _duration_column(stage: str) -> str:
    return f"epochs_{stage.lower()}"


def _stage_durations(changes: pl.LazyFrame) -> pl.LazyFrame:
    """Recorded epochs per live stage, one column per stage."""
    return changes.group_by(SEED_KEY).agg(
        *(
            pl.col("epochs_in_prev_stage")
            .filter(pl.col("from_stage") == stage)
            .sum()
            .alias(_duration_column(stage))
            for stage in LIVE_STAGES
        ),
        last_stage=pl.col("to_stage").sort_by("seq").last(),
        last_change_step=pl.col("step").sort_by("seq").last(),
    )


def _seed_table(run: Run) -> pl.LazyFrame:
    germ = run.scan("seed_germinated").select(
        *SEED_KEY, "blueprint", "params", germinated_step="step"
    )
    changes = run.scan("seed_stage_changed")
    fossil = run.scan("seed_fossilized").select(
        *SEED_KEY, fossil_step="step", fossil_contribution="contribution"
    )
    pruned = run.scan("seed_pruned").select(
        *SEED_KEY,
        "reason",
        "initiator",
        "stage_at_prune",
        prune_step="step",
        prune_contribution="contribution",
    )
    episodes = run.scan("episode_finished").select(*_EPISODE_KEY, episode_end_step="step")
    keys = pl.concat(
        [f.select(SEED_KEY) for f in (germ, changes, fossil, pruned)], how="vertical"
    ).unique()
    outcome = (
        pl.when(pl.col("fossil_step").is_not_null())
        .then(pl.lit("fossilized"))
        .when(pl.col("prune_step").is_not_null())
        .then(pl.lit("pruned"))
        .otherwise(pl.lit("alive"))
    )
    entered = pl.coalesce("last_change_step", "germinated_step")
    open_epochs = pl.col("episode_end_step") - entered
    current = pl.coalesce("last_stage", pl.lit(SeedStage.GERMINATED.value))
    add_open = [
        pl.when((pl.col("outcome") == "alive") & (current == stage))
        .then(pl.col(_duration_column(stage)).fill_null(0) + open_epochs)
        .otherwise(pl.col(_duration_column(stage)).fill_null(0))
        .alias(_duration_column(stage))
        for stage in LIVE_STAGES
    ]
    return (
        keys.join(germ, on=SEED_KEY, how="left", nulls_equal=True)
        .join(_stage_durations(changes), on=SEED_KEY, how="left", nulls_equal=True)
        .join(fossil, on=SEED_KEY, how="left", nulls_equal=True)
        .join(pruned, on=SEED_KEY, how="left", nulls_equal=True)
        .join(episodes, on=_EPISODE_KEY, how="left")
        .with_columns(outcome=outcome)
        .with_columns(add_open)
        .with_columns(
            ended_step=pl.coalesce("fossil_step", "prune_step", "episode_end_step"),
            contribution=pl.coalesce("fossil_contribution", "prune_contribution"),
            final_stage=pl.when(pl.col("outcome") == "pruned")
            .then(pl.col("stage_at_prune"))
            .otherwise(current),
        )
        .with_columns(lifetime_epochs=pl.col("ended_step") - pl.col("germinated_step"))
        .select(
            *SEED_KEY,
            "blueprint",
            "outcome",
            "final_stage",
            "germinated_step",
            "ended_step",
            "lifetime_epochs",
            "episode_end_step",
            *(_duration_column(s) for s in LIVE_STAGES),
            "contribution",
            "reason",
            "initiator",
            "params",
        )
        .sort("run_id", "rank", "round", "env", "germinated_step", "slot", nulls_last=True)
    )


def _segments(run: Run, seeds: pl.LazyFrame) -> pl.LazyFrame:
    """Timeline pieces ``(seed, stage, start_step, end_step)`` of live and fossilized stages.

    A piece ends where the next transition happens; the last one (fossilized, or alive
    at the end) runs to the episode's end step.
    """
    starts = pl.concat(
        [
            run.scan("seed_germinated").select(
                *SEED_KEY, "seq", "step", stage=pl.lit(SeedStage.GERMINATED.value)
            ),
            run.scan("seed_stage_changed").select(*SEED_KEY, "seq", "step", stage="to_stage"),
        ]
    )
    ends = seeds.select(*SEED_KEY, "episode_end_step", "ended_step")
    return (
        starts.sort("seq")
        .with_columns(next_step=pl.col("step").shift(-1).over(SEED_KEY))
        .join(ends, on=SEED_KEY, how="left", nulls_equal=True)
        .with_columns(end_step=pl.coalesce("next_step", "episode_end_step", "ended_step", "step"))
        .filter(pl.col("stage").is_in(TIMELINE_STAGES))
        .select(*SEED_KEY, "stage", start_step="step", end_step="end_step")
        .sort("run_id", "rank", "round", "env", "start_step")
    )


def _by_blueprint(seeds: pl.LazyFrame) -> pl.LazyFrame:
    ended = pl.col("outcome").is_in(["fossilized", "pruned"])
    finite = pl.col("contribution").is_not_null() & pl.col("contribution").is_finite()
    fossilized = (pl.col("outcome") == "fossilized").sum()
    pruned = (pl.col("outcome") == "pruned").sum()
    return (
        seeds.group_by("blueprint")
        .agg(
            germinated=pl.len(),
            fossilized=fossilized,
            pruned=pruned,
            alive=(pl.col("outcome") == "alive").sum(),
            fossilize_rate=pl.when(fossilized + pruned > 0).then(
                fossilized / (fossilized + pruned)
            ),
            mean_contribution=pl.col("contribution").filter(ended & finite).mean(),
            mean_contribution_fossilized=pl.col("contribution")
            .filter((pl.col("outcome") == "fossilized") & finite)
            .mean(),
            mean_lifetime_epochs=pl.col("lifetime_epochs").mean(),
        )
        .sort("germinated", "blueprint", descending=[True, False])
    )


def seed_lifecycles(run: Run) -> Lifecycles:
    """Per-seed lifecycle table, per-blueprint rates and the timeline segments."""
    seeds_lf = _seed_table(run)
    seeds, by_blueprint, segments = pl.collect_all(
        [seeds_lf, _by_blueprint(seeds_lf), _segments(run, seeds_lf)]
    )
    outcomes = seeds["outcome"].value_counts()
    count = dict(zip(outcomes["outcome"].to_list(), outcomes["count"].to_list(), strict=True))
    return Lifecycles(
        seeds=seeds,
        by_blueprint=by_blueprint,
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
