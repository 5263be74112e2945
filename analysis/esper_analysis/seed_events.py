"""The seed event tables as the lifecycle analysis reads them, and what its two ways of
building the seed table share: the seed key, the stages, the columns read and the
per-seed columns derived from the joined events.

A seed is identified by ``(run_id, rank, round, env, slot, seed_id)``. Its outcome is
``fossilized`` or ``pruned`` when that event exists, else ``alive`` (still in the slot
when the episode ended, or when a crashed run stopped).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import polars as pl

from esper.core.enums import SeedStage
from esper_analysis.loader import Run

SEED_KEY: Final = ["run_id", "rank", "round", "env", "slot", "seed_id"]
#: Integer parts of :data:`SEED_KEY`.
INT_KEY: Final = ["rank", "round", "env"]
#: String parts of :data:`SEED_KEY`.
STR_KEY: Final = ["run_id", "slot", "seed_id"]
EPISODE_KEY: Final = ["run_id", "rank", "round", "env"]
#: Stages a seed lives through before its end, in order (durations are reported for them).
LIVE_STAGES: Final = (
    SeedStage.GERMINATED.value,
    SeedStage.TRAINING.value,
    SeedStage.BLENDING.value,
    SeedStage.HOLDING.value,
)
#: Stages drawn on the timeline (live stages plus the permanent one).
TIMELINE_STAGES: Final = (*LIVE_STAGES, SeedStage.FOSSILIZED.value)
SEED_EVENT_TYPES: Final = (
    "seed_germinated",
    "seed_stage_changed",
    "seed_fossilized",
    "seed_pruned",
)
#: A 64-bit hash of :data:`SEED_KEY`: joining on one integer instead of six columns
#: (three of them strings) is several times cheaper. It is only trusted where checked:
#: collision-free over the run's distinct seeds, or each event's key equal to its seed's.
SEED_HASH: Final = "_seed_hash"
HASH_SEED: Final = 0
#: A second 64-bit hash, of the key's strings, with another seed: an event the dense
#: way finds by :data:`SEED_HASH` is that seed's when their integer keys are equal and
#: so is this one (a false match needs both hashes to collide at once), so those
#: events are read without their key's strings.
SEED_CHECK: Final = "_seed_check"
CHECK_SEED: Final = 1
#: The columns read per seed event type (besides :data:`SEED_KEY` and its hash).
COLUMNS: Final = {
    "seed_germinated": ("seq", "step", "blueprint", "params"),
    "seed_stage_changed": ("seq", "step", "from_stage", "to_stage", "epochs_in_prev_stage"),
    "seed_fossilized": ("seq", "step", "contribution"),
    "seed_pruned": ("seq", "step", "reason", "initiator", "stage_at_prune", "contribution"),
}
#: An order key packs its integer columns into one Int64 when their spans fit this.
_MAX_PACKED: Final = 2**62


def duration_column(stage: str) -> str:
    return f"epochs_{stage.lower()}"


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
    "contribution",
    "reason",
    "initiator",
    "params",
)


def seed_hashes(key: Sequence[str] = SEED_KEY) -> list[pl.Expr]:
    """:data:`SEED_HASH` and :data:`SEED_CHECK` of a frame with ``key``: the seed key,
    or the seed key without ``run_id`` where every event has the same one."""
    strings = [c for c in key if c in STR_KEY]
    return [
        pl.struct(key).hash(HASH_SEED).alias(SEED_HASH),
        pl.struct(strings).hash(CHECK_SEED).alias(SEED_CHECK),
    ]


def read_seed_events(run: Run, *, keys: bool = True) -> dict[str, pl.DataFrame]:
    """The four seed event types, read once in parallel with the seed key, its hashes
    and only the columns used later: every step after works on these frames.

    ``keys=False``: only the germinations keep the key's strings (the other events are
    matched to their seed by the hashes and the integer key, the dense way's reading).
    Where the footers prove one ``run_id`` for every seed event, it is neither read
    nor hashed, and added to the frames as a constant.
    """
    run_id = _one_run_id(run)
    hashed = SEED_KEY if run_id is None else [c for c in SEED_KEY if c != "run_id"]
    plans = []
    for t, cols in COLUMNS.items():
        key = SEED_KEY if keys or t == SEED_EVENT_TYPES[0] else INT_KEY
        lf = run.scan(t).with_columns(seed_hashes(hashed))
        if run_id is not None and "run_id" in key:
            lf = lf.with_columns(run_id=pl.lit(run_id, dtype=pl.String))
        plans.append(lf.select(*key, SEED_HASH, SEED_CHECK, *cols))
    return dict(zip(COLUMNS, pl.collect_all(plans), strict=True))


def _one_run_id(run: Run) -> str | None:
    """The one ``run_id`` of every seed event, where every file's footer proves it
    (:attr:`PartFile.run_id <esper_analysis.parts.PartFile.run_id>`: statistics of
    every row group, no nulls), else None."""
    found: set[str] = set()
    for event_type in SEED_EVENT_TYPES:
        for part in run.files.get(event_type, ()):
            if part.table is not None or part.run_id is None:
                return None
            found.add(part.run_id)
    return found.pop() if len(found) == 1 else None


def order_key(frame: pl.DataFrame, columns: list[str]) -> list[str | pl.Expr]:
    """Sort keys equivalent to ``columns`` (non-null integers): one packed Int64 when the
    columns' spans fit in it (a sort on one integer instead of several), else as is."""
    if frame.is_empty():
        return list(columns)
    bounds = frame.select(
        *(pl.col(c).min().alias(f"lo_{c}") for c in columns),
        *(pl.col(c).max().alias(f"hi_{c}") for c in columns),
    ).row(0, named=True)
    if any(bounds[f"lo_{c}"] is None for c in columns):
        return list(columns)
    spans = [int(bounds[f"hi_{c}"]) - int(bounds[f"lo_{c}"]) + 1 for c in columns]
    if math.prod(spans) >= _MAX_PACKED:
        return list(columns)
    packed = pl.lit(0, dtype=pl.Int64)
    for c, span in zip(columns, spans, strict=True):
        packed = packed * span + (pl.col(c).cast(pl.Int64) - int(bounds[f"lo_{c}"]))
    return [packed]


def derived_seed_columns(joined: pl.LazyFrame, carried: str) -> pl.LazyFrame:
    """The seed table's columns (:data:`SEED_KEY`, then ``carried``, an id of the seed
    the caller joins on later, then :data:`SEED_COLUMNS`) from one row per seed of its
    joined events.

    ``joined`` holds per seed: ``blueprint``, ``params``, ``germinated_step``, the
    recorded ``epochs_<stage>`` sums (null or 0 without changes), ``last_stage`` and
    ``last_change_step`` of its last change, ``fossil_step`` / ``fossil_contribution``,
    ``prune_step`` / ``prune_contribution`` / ``reason`` / ``initiator`` /
    ``stage_at_prune`` and ``episode_end_step``. Stage durations are the recorded epochs
    plus, for a seed alive at the end, the time from entering its last stage to the
    episode's end step.
    """
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
        .then(pl.col(duration_column(stage)).fill_null(0) + open_epochs)
        .otherwise(pl.col(duration_column(stage)).fill_null(0))
        .alias(duration_column(stage))
        for stage in LIVE_STAGES
    ]
    return (
        joined.with_columns(outcome=outcome)
        .with_columns(add_open)
        .with_columns(
            ended_step=pl.coalesce("fossil_step", "prune_step", "episode_end_step"),
            contribution=pl.coalesce("fossil_contribution", "prune_contribution"),
            final_stage=pl.when(pl.col("outcome") == "pruned")
            .then(pl.col("stage_at_prune"))
            .otherwise(current),
        )
        .with_columns(lifetime_epochs=pl.col("ended_step") - pl.col("germinated_step"))
        .select(*SEED_KEY, carried, *SEED_COLUMNS)
    )
