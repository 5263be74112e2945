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
#: The seed key the events are joined on: ``run_id`` is one per run.
KEY: Final = SEED_KEY[1:]
EPISODE_KEY: Final = ["rank", "round", "env"]
#: Each seed's number (its row in the table of distinct keys).
SEED: Final = "_seed"
#: Stages a seed lives through before its end, in order (durations are reported for them).
LIVE_STAGES: Final = (
    SeedStage.GERMINATED.value,
    SeedStage.TRAINING.value,
    SeedStage.BLENDING.value,
    SeedStage.HOLDING.value,
)
#: Stages drawn on the timeline (live stages plus the permanent one).
TIMELINE_STAGES: Final = (*LIVE_STAGES, SeedStage.FOSSILIZED.value)
#: The columns read per seed event type (besides :data:`KEY`).
COLUMNS: Final = {
    "seed_germinated": ("seq", "step", "blueprint", "params"),
    "seed_stage_changed": ("seq", "step", "from_stage", "to_stage", "epochs_in_prev_stage"),
    "seed_fossilized": ("step", "contribution"),
    "seed_pruned": ("step", "reason", "initiator", "stage_at_prune", "contribution"),
}


#: A seed's contribution, in accuracy percentage points (the counterfactual's), and what
#: a missing one means (``contribution_status``: JSON has null for both of the first two).
CONTRIBUTION: Final = "contribution_pp"
ALIVE, MEASURED, UNMEASURED = "alive", "measured", "ended unmeasured"


def duration_column(stage: str) -> str:
    return f"epochs_{stage.lower()}"


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
            *(duration_column(s) for s in LIVE_STAGES),
            CONTRIBUTION,
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


def _seed_table(
    run: Run, ids: pl.LazyFrame, frames: dict[str, pl.LazyFrame], starts: pl.LazyFrame
) -> pl.LazyFrame:
    """One row per seed named by any seed event (``ids``): its events joined on the
    seed's number."""
    changes = starts.filter(pl.col("from_stage").is_not_null())
    durations = changes.group_by(SEED).agg(  # rows keep their (seed, seq) order
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
    germ = frames["seed_germinated"].select(SEED, "blueprint", "params", germinated_step="step")
    fossil = frames["seed_fossilized"].select(
        SEED, fossil_step="step", fossil_contribution="contribution"
    )
    pruned = frames["seed_pruned"].select(
        SEED, "reason", "initiator", "stage_at_prune", prune_step="step",
        prune_contribution="contribution",
    )  # fmt: skip
    episodes = run.scan("episode_finished").select(*EPISODE_KEY, episode_end_step="step")
    joined = ids
    for right in (germ, durations, fossil, pruned):
        joined = joined.join(right, on=SEED, how="left")
    joined = joined.join(episodes, on=EPISODE_KEY, how="left")
    outcome = (
        pl.when(pl.col("fossil_step").is_not_null())
        .then(pl.lit("fossilized"))
        .when(pl.col("prune_step").is_not_null())
        .then(pl.lit("pruned"))
        .otherwise(pl.lit("alive"))
    )
    entered = pl.coalesce("last_change_step", "germinated_step")
    current = pl.coalesce("last_stage", pl.lit(SeedStage.GERMINATED.value))
    open_epochs = [
        pl.when((pl.col("outcome") == "alive") & (current == stage))
        .then(pl.col(duration_column(stage)).fill_null(0) + pl.col("episode_end_step") - entered)
        .otherwise(pl.col(duration_column(stage)).fill_null(0))
        .alias(duration_column(stage))
        for stage in LIVE_STAGES
    ]
    return (
        joined.with_columns(outcome=outcome)
        .with_columns(open_epochs)
        .with_columns(
            ended_step=pl.coalesce("fossil_step", "prune_step", "episode_end_step"),
            contribution_pp=pl.coalesce("fossil_contribution", "prune_contribution"),
            final_stage=pl.when(pl.col("outcome") == "pruned")
            .then(pl.col("stage_at_prune"))
            .otherwise(current),
        )
        .with_columns(
            lifetime_epochs=pl.col("ended_step") - pl.col("germinated_step"),
            contribution_status=pl.when(pl.col("outcome") == "alive")
            .then(pl.lit(ALIVE))
            .when(pl.col(CONTRIBUTION).cast(pl.Float64).is_finite().fill_null(False))
            .then(pl.lit(MEASURED))
            .otherwise(pl.lit(UNMEASURED)),
        )
        .select(SEED, *KEY, *SEED_COLUMNS)
        # seed_id last: every tie broken, so the table's row order is deterministic
        .sort("rank", "round", "env", "germinated_step", "slot", "seed_id", nulls_last=True)
    )


#: The seed table's columns after its key, in order.
SEED_COLUMNS: Final = (
    "blueprint",
    "outcome",
    "final_stage",
    "germinated_step",
    "ended_step",
    "lifetime_epochs",
    "episode_end_step",
    *(duration_column(s) for s in LIVE_STAGES),
    CONTRIBUTION,
    "contribution_status",
    "reason",
    "initiator",
    "params",
)


def _segments(starts: pl.LazyFrame, seeds: pl.LazyFrame) -> pl.LazyFrame:
    """Timeline pieces ``(seed, stage, start_step, end_step)`` of live and fossilized
    stages: a piece ends where the seed's next transition happens (``starts`` is sorted
    by seed, then ``seq``), the last one (fossil, or alive at the end) at the episode's
    end. Sorted by rank, round, env, start step and ``seq`` (a total order)."""
    same_seed = pl.col(SEED) == pl.col(SEED).shift(-1)
    ends = seeds.select(SEED, *KEY, "episode_end_step", "ended_step")
    return (
        starts.with_columns(next_step=pl.when(same_seed).then(pl.col("step").shift(-1)))
        .filter(pl.col("stage").is_in(TIMELINE_STAGES))
        .join(ends, on=SEED, how="left")
        .sort("rank", "round", "env", "step", "seq", nulls_last=True)
        .select(
            *KEY,
            "stage",
            start_step="step",
            end_step=pl.coalesce("next_step", "episode_end_step", "ended_step", "step"),
        )
    )


def _by_blueprint(seeds: pl.DataFrame) -> pl.DataFrame:
    """Per-blueprint counts, fossilize rate and means (a seed without a germination event
    has no blueprint: its group, if any, sorts last)."""
    outcome = pl.col("outcome")
    finite = pl.col(CONTRIBUTION).cast(pl.Float64).is_finite().fill_null(False)
    ended = outcome.is_in(["fossilized", "pruned"])
    fossilized, pruned = (outcome == "fossilized").sum(), (outcome == "pruned").sum()
    table = seeds.group_by("blueprint").agg(
        germinated=pl.len(),
        fossilized=fossilized,
        pruned=pruned,
        alive=(outcome == "alive").sum(),
        fossilize_rate=pl.when(fossilized + pruned > 0).then(fossilized / (fossilized + pruned)),
        mean_contribution_pp=pl.col(CONTRIBUTION).filter(ended & finite).mean(),
        mean_contribution_fossilized_pp=pl.col(CONTRIBUTION)
        .filter((outcome == "fossilized") & finite)
        .mean(),
        mean_lifetime_epochs=pl.col("lifetime_epochs").cast(pl.Float64).mean(),
    )
    table = table.cast(_BY_BLUEPRINT_SCHEMA)  # type: ignore[arg-type]
    return table.sort("germinated", "blueprint", descending=[True, False], nulls_last=True)


_BY_BLUEPRINT_SCHEMA: Final = {
    "blueprint": pl.String,
    "germinated": pl.UInt32,
    "fossilized": pl.UInt32,
    "pruned": pl.UInt32,
    "alive": pl.UInt32,
    "fossilize_rate": pl.Float64,
    "mean_contribution_pp": pl.Float64,
    "mean_contribution_fossilized_pp": pl.Float64,
    "mean_lifetime_epochs": pl.Float64,
}


def _run_id(run: Run) -> str:
    """The ``run_id`` of the run's seed events: one per run (the loader refuses files of
    another run), so it is no part of the keys the events are joined on."""
    for event_type in COLUMNS:
        if run.rows_on_disk(event_type):
            value = run.scan(event_type).select("run_id").head(1).collect().item()
            return str(value)
    return run.run_id


def seed_lifecycles(run: Run) -> Lifecycles:
    """Per-seed lifecycle table, per-blueprint rates and the timeline segments."""
    read = pl.collect_all([run.scan(t).select(*KEY, *cols) for t, cols in COLUMNS.items()])
    # Every seed numbered once; the events then carry its number, not the key's strings.
    ids = pl.concat([f.select(KEY) for f in read]).unique().with_row_index(SEED)
    numbered = pl.collect_all(
        [f.lazy().join(ids.lazy(), on=KEY, how="left", nulls_equal=True).drop(KEY) for f in read]
    )
    del read  # peak memory: the key's strings are in ``ids`` alone from here on
    frames = {t: f.lazy() for t, f in zip(COLUMNS, numbered, strict=True)}
    starts = pl.concat(
        [
            frames["seed_germinated"].select(
                SEED, "seq", "step", stage=pl.lit(SeedStage.GERMINATED.value)
            ),
            frames["seed_stage_changed"].select(
                SEED, "seq", "step", "from_stage", "epochs_in_prev_stage", stage="to_stage"
            ),
        ],
        how="diagonal",
    ).sort(SEED, "seq")
    seed_plan = _seed_table(run, ids.lazy(), frames, starts)
    seeds, segments = pl.collect_all([seed_plan, _segments(starts, seed_plan)])
    run_id = pl.lit(_run_id(run), dtype=pl.String).alias("run_id")
    seeds = seeds.select(run_id, *KEY, *SEED_COLUMNS)
    segments = segments.select(run_id, pl.all())
    outcomes = dict(seeds["outcome"].value_counts().iter_rows())
    return Lifecycles(
        seeds=seeds,
        by_blueprint=(
            _by_blueprint(seeds) if seeds.height else pl.DataFrame(schema=_BY_BLUEPRINT_SCHEMA)
        ),
        segments=segments,
        germinated=seeds.height,
        fossilized=int(outcomes.get("fossilized", 0)),
        pruned=int(outcomes.get("pruned", 0)),
        alive=int(outcomes.get("alive", 0)),
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
