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
SEED_EVENT_TYPES: Final = (
    "seed_germinated",
    "seed_stage_changed",
    "seed_fossilized",
    "seed_pruned",
)
#: A 64-bit hash of :data:`SEED_KEY`: joining and sorting on one integer instead of six
#: columns (three of them strings) makes this analysis several times cheaper. Used only
#: where it is collision-free for the run (checked); otherwise the key columns are used.
SEED_HASH: Final = "_seed_hash"
HASH_SEED: Final = 0


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


def _stage_durations(changes: pl.LazyFrame, key: list[str]) -> pl.LazyFrame:
    """Recorded epochs per live stage, one column per stage."""
    return changes.group_by(key).agg(
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


def _scans(run: Run) -> dict[str, pl.LazyFrame]:
    """The four seed event types, each with :data:`SEED_HASH` added."""
    return {
        t: run.scan(t).with_columns(pl.struct(SEED_KEY).hash(HASH_SEED).alias(SEED_HASH))
        for t in SEED_EVENT_TYPES
    }


def _seed_keys(scans: dict[str, pl.LazyFrame]) -> pl.DataFrame:
    """Every distinct seed (``SEED_KEY`` plus its hash) named by any seed event."""
    return pl.concat([f.select(*SEED_KEY, SEED_HASH) for f in scans.values()]).unique().collect()


def _join_key(keys: pl.DataFrame) -> list[str]:
    """Join on the one-integer hash when it is collision-free in this run (checked on the
    distinct seeds), else on the six key columns; the results are the same."""
    return [SEED_HASH] if keys[SEED_HASH].n_unique() == keys.height else list(SEED_KEY)


def _seed_table(
    run: Run, scans: dict[str, pl.LazyFrame], keys: pl.DataFrame, key: list[str]
) -> pl.LazyFrame:
    germ = scans["seed_germinated"].select(*key, "blueprint", "params", germinated_step="step")
    fossil = scans["seed_fossilized"].select(
        *key, fossil_step="step", fossil_contribution="contribution"
    )
    pruned = scans["seed_pruned"].select(
        *key,
        "reason",
        "initiator",
        "stage_at_prune",
        prune_step="step",
        prune_contribution="contribution",
    )
    episodes = run.scan("episode_finished").select(*_EPISODE_KEY, episode_end_step="step")
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
        keys.lazy()
        .join(germ, on=key, how="left", nulls_equal=True)
        .join(
            _stage_durations(scans["seed_stage_changed"], key), on=key, how="left", nulls_equal=True
        )
        .join(fossil, on=key, how="left", nulls_equal=True)
        .join(pruned, on=key, how="left", nulls_equal=True)
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
            SEED_HASH,
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


def _segments(scans: dict[str, pl.LazyFrame], seeds: pl.LazyFrame, key: list[str]) -> pl.LazyFrame:
    """Timeline pieces ``(seed, stage, start_step, end_step)`` of live and fossilized stages.

    A piece ends where the seed's next transition happens (rows sorted by seed, then
    ``seq``); the last one (fossilized, or alive at the end) runs to the episode's end.
    """
    columns = [*key, "seq", "step"]  # narrow: the key columns are joined back at the end
    starts = pl.concat(
        [
            scans["seed_germinated"].select(*columns, stage=pl.lit(SeedStage.GERMINATED.value)),
            scans["seed_stage_changed"].select(*columns, stage="to_stage"),
        ]
    )
    rest = [c for c in SEED_KEY if c not in key]
    ends = seeds.select(*key, *rest, "episode_end_step", "ended_step")
    same_seed = pl.all_horizontal(pl.col(k) == pl.col(k).shift(-1) for k in key)
    return (
        starts.sort(*key, "seq")
        .with_columns(next_step=pl.when(same_seed).then(pl.col("step").shift(-1)))
        .filter(pl.col("stage").is_in(TIMELINE_STAGES))
        .join(ends, on=key, how="left", nulls_equal=True)
        .with_columns(end_step=pl.coalesce("next_step", "episode_end_step", "ended_step", "step"))
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
    scans = _scans(run)
    keys = _seed_keys(scans)
    key = _join_key(keys)
    seeds_lf = _seed_table(run, scans, keys, key)
    seeds, by_blueprint, segments = pl.collect_all(
        [seeds_lf.drop(SEED_HASH), _by_blueprint(seeds_lf), _segments(scans, seeds_lf, key)]
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
