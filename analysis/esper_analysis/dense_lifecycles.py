"""Seed lifecycles on dense seed ids: the fast way for a run whose seeds each have one
germination event.

Then the germinations, sorted in the seed table's order, *are* the seed table: seed
``i`` is germination row ``i``, every other seed event finds its seed by one join on the
key's hash, and everything per seed is a gather, a scatter or a ``np.bincount`` over
that dense id, where the general way (:mod:`esper_analysis.lifecycles`) needs a
``unique`` over the six key columns, multi-column sorts and five joins. The hash is
trusted only after each event's integer key and second hash of the key's strings
(:data:`~esper_analysis.seed_events.SEED_CHECK`) are compared with its seed's, so the
other events are read without their key's strings.

:func:`dense_tables` returns None whenever a precondition does not hold (a seed
without germination or with two, a repeated fossilization or prune, a repeated
episode, a null ``seq``); the caller then takes the general way. Both give the same
tables, row for row (tested).
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import numpy as np
import polars as pl

from esper.core.enums import SeedStage
from esper_analysis.loader import Run
from esper_analysis.seed_events import (
    EPISODE_KEY,
    INT_KEY,
    LIVE_STAGES,
    SEED_CHECK,
    SEED_EVENT_TYPES,
    SEED_HASH,
    SEED_KEY,
    TIMELINE_STAGES,
    derived_seed_columns,
    duration_column,
    order_key,
)

#: The dense seed id column: the seed's row in the seed table.
SEED_ID: Final = "_seed"
#: Seed table order; seed_id last breaks every tie, so the order is deterministic.
SEED_ORDER: Final = ["run_id", "rank", "round", "env", "step", "slot", "seed_id"]
_GERMINATED, _CHANGED, _FOSSILIZED, _PRUNED = SEED_EVENT_TYPES


def dense_tables(
    run: Run, frames: dict[str, pl.DataFrame]
) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """The seed table and the timeline segments, or None where the preconditions fail."""
    germ = frames[_GERMINATED]
    if not germ.height or germ[SEED_HASH].n_unique() != germ.height:
        return None
    for name in (_FOSSILIZED, _PRUNED):
        if frames[name][SEED_HASH].n_unique() != frames[name].height:
            return None
    if any(f["seq"].null_count() for f in frames.values()):
        return None
    germ = _in_seed_order(germ).with_row_index(SEED_ID)
    dense = _with_seed_ids(frames, germ)
    if dense is None:
        return None
    starts = _Starts.of(germ, dense[_CHANGED])
    # The pieces of the timeline on a second thread while the seed table is built
    # (both mostly polars and numpy work, which release the GIL).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="esper-lifecycles") as pool:
        pieces = pool.submit(_Pieces.of, germ, dense[_CHANGED], starts)
        seeds = _seed_table(run, germ, dense, starts).collect()
        if seeds.height != germ.height:  # an episode finished twice: seeds repeated
            return None
        return seeds.drop(SEED_ID), _segments(pieces.result(), seeds)


def _in_seed_order(germ: pl.DataFrame) -> pl.DataFrame:
    """The germinations in :data:`SEED_ORDER`. With one run id and no nulls, where
    (rank, round, env, step, slot) already tells every seed apart, one sort on those
    packed into one integer gives that order (the slot as its rank among the sorted
    slot names; seed_id is never consulted)."""
    ints, slot = SEED_ORDER[1:5], SEED_ORDER[5]
    if germ["run_id"].n_unique() == 1 and not any(germ[c].null_count() for c in [*ints, slot]):
        names = germ[slot].unique().sort().to_list()
        digits = germ.select(*ints, pl.col(slot).cast(pl.Enum(names)).to_physical())
        (packed, *rest) = order_key(digits, [*ints, slot])
        if not rest:
            key = digits.select(packed).to_series()
            if key.n_unique() == germ.height:
                return germ[_sorting(key.to_numpy())]
    return germ.sort(SEED_ORDER, nulls_last=True)


def _with_seed_ids(
    frames: dict[str, pl.DataFrame], germ: pl.DataFrame
) -> dict[str, pl.DataFrame] | None:
    """The non-germination frames with their seed's dense id, or None when an event has
    no germinated seed or its integer key or check hash differs from its seed's (a hash
    collision)."""
    ids = germ.select(SEED_HASH, SEED_ID)
    out = {}
    for name in (_CHANGED, _FOSSILIZED, _PRUNED):
        frame = frames[name]
        found = frame.select(SEED_HASH).join(ids, on=SEED_HASH, how="left", maintain_order="left")
        if found[SEED_ID].null_count():
            return None
        seed = found[SEED_ID].to_numpy()
        for k in (*INT_KEY, SEED_CHECK):
            if not np.array_equal(frame[k].to_numpy(), germ[k].to_numpy()[seed]):
                return None
        out[name] = frame.with_columns(found[SEED_ID])
    return out


@dataclasses.dataclass(frozen=True)
class _Starts:
    """Germinations then stage changes ("starts": rows ``0..germinations-1`` are the
    germinations), put in (seed, ``seq``) order by one argsort of integers: durations,
    last changes and timeline pieces are read in that order, and strings are gathered
    only for what is kept."""

    frame: pl.DataFrame  # seed id, seq, step; germinations first
    order: np.ndarray  # rows of ``frame`` in (seed, seq) order
    seed: np.ndarray  # the seed of each row, in that order
    germinations: int

    @classmethod
    def of(cls, germ: pl.DataFrame, changes: pl.DataFrame) -> _Starts:
        cols = [SEED_ID, "seq", "step"]
        frame = pl.concat([germ.select(cols), changes.select(cols)])
        order = _argsort(frame, [SEED_ID, "seq"])
        return cls(frame, order, frame[SEED_ID].to_numpy()[order], germ.height)

    def last_of_seed(self, rows: np.ndarray) -> np.ndarray:
        """Of ``rows`` (a mask over the ordered starts), the last of each seed."""
        kept = np.flatnonzero(rows)
        seed = self.seed[kept]
        return kept[np.r_[seed[1:] != seed[:-1], True]] if len(kept) else kept


def _argsort(frame: pl.DataFrame, columns: list[str]) -> np.ndarray:
    """Row order by ``columns`` (integers, telling the rows apart), from one argsort of
    their packed key where they pack into one integer."""
    key = order_key(frame, columns)
    if len(key) == 1:
        return _sorting(frame.select(key).to_series().to_numpy())
    return frame.select(pl.arg_sort_by(key)).to_series().to_numpy()


def _sorting(key: np.ndarray) -> np.ndarray:
    """The order of distinct integers: numpy's stable sort, which merges the runs
    already in order (events arrive nearly in time order: several times faster than a
    general sort here)."""
    return np.argsort(key, kind="stable")


def _by_seed(frame: pl.DataFrame, seed: np.ndarray, seeds: int) -> pl.DataFrame:
    """``frame``'s rows moved to their seed's row (``seed`` ids are distinct); null rows
    for the seeds without one."""
    where = np.full(seeds, -1, dtype=np.int64)
    where[seed] = np.arange(len(seed))
    index = pl.Series(where).scatter(np.flatnonzero(where < 0), None)
    return frame.select(pl.all().gather(index))


def _stage_columns(changes: pl.DataFrame, starts: _Starts, seeds: int) -> pl.DataFrame:
    """Per seed: recorded epochs per live stage (integer sums in ``np.bincount``, exact
    below 2**53, in any row order) and the stage and step of its last change."""
    live = len(LIVE_STAGES)  # the stage left as a digit: a live one's index, else this
    left = changes["from_stage"].replace_strict(
        LIVE_STAGES, range(live), default=live, return_dtype=pl.Int64
    )
    code = changes[SEED_ID].cast(pl.Int64).to_numpy() * (live + 1) + left.to_numpy()
    epochs = changes["epochs_in_prev_stage"].fill_null(0).to_numpy()
    sums = np.bincount(code, weights=epochs, minlength=seeds * (live + 1))
    by_stage = sums.reshape(seeds, live + 1).astype(np.int64)
    durations = {
        duration_column(stage): pl.Series(by_stage[:, i].copy())
        for i, stage in enumerate(LIVE_STAGES)
    }
    changed = np.zeros(len(starts.order), dtype=bool)
    changed[starts.germinations :] = changes["from_stage"].is_not_null().to_numpy()
    last = starts.last_of_seed(changed[starts.order])
    rows = starts.order[last] - starts.germinations  # rows of ``changes``
    last_change = changes.select(last_stage="to_stage", last_change_step="step")[rows]
    return pl.DataFrame(durations).hstack(_by_seed(last_change, starts.seed[last], seeds))


def _seed_table(
    run: Run, germ: pl.DataFrame, dense: dict[str, pl.DataFrame], starts: _Starts
) -> pl.LazyFrame:
    """One row per seed, in germination (= seed table) order."""
    n = germ.height
    fossil, pruned = dense[_FOSSILIZED], dense[_PRUNED]
    per_seed = [
        germ.select(*SEED_KEY, SEED_ID, "blueprint", "params", germinated_step="step"),
        _stage_columns(dense[_CHANGED], starts, n),
        _by_seed(
            fossil.select(fossil_step="step", fossil_contribution="contribution"),
            fossil[SEED_ID].to_numpy(),
            n,
        ),
        _by_seed(
            pruned.select(
                "reason",
                "initiator",
                "stage_at_prune",
                prune_step="step",
                prune_contribution="contribution",
            ),
            pruned[SEED_ID].to_numpy(),
            n,
        ),
    ]
    episodes = run.scan("episode_finished").select(*EPISODE_KEY, episode_end_step="step")
    joined = (
        pl.concat(per_seed, how="horizontal")
        .lazy()
        .join(episodes, on=EPISODE_KEY, how="left", maintain_order="left")
    )
    return derived_seed_columns(joined, SEED_ID)


@dataclasses.dataclass(frozen=True)
class _Pieces:
    """The timeline pieces in their final order, all but their ends (which need the
    seed table): built while the seed table is."""

    keys: pl.DataFrame  # the seed key and stage of each piece, in order
    own: np.ndarray  # each piece's seed, in order
    step: pl.Series  # start step, in order
    next_step: pl.Series  # the seed's next transition (null for its last piece)

    @classmethod
    def of(cls, germ: pl.DataFrame, changes: pl.DataFrame, starts: _Starts) -> _Pieces:
        order, seed = starts.order, starts.seed
        step = starts.frame["step"].gather(order)
        last = np.flatnonzero(np.r_[seed[1:] != seed[:-1], True])
        next_step = step.shift(-1).scatter(last, None)
        on_timeline = np.concatenate(
            [
                np.full(germ.height, SeedStage.GERMINATED.value in TIMELINE_STAGES),
                changes["to_stage"].is_in(TIMELINE_STAGES).fill_null(False).to_numpy(),
            ]
        )
        keep = on_timeline[order]
        start, own = order[keep], seed[keep]  # each piece's row in the starts, its seed
        step, next_step = step.filter(keep), next_step.filter(keep)
        by = [*INT_KEY, "step", "seq"]
        sort_keys = germ.select(*INT_KEY)[own].with_columns(
            step=step, seq=starts.frame["seq"].gather(start)
        )
        if germ["run_id"].n_unique() > 1:
            sort_keys = sort_keys.with_columns(germ["run_id"].gather(own))
            piece_order = sort_keys.select(pl.arg_sort_by("run_id", *by)).to_series().to_numpy()
        else:  # one run id sorts like none
            piece_order = _argsort(sort_keys, by)
        stages = pl.concat(  # one chunk: a gather from many chunks of strings costs more
            [pl.repeat(SeedStage.GERMINATED.value, germ.height, eager=True), changes["to_stage"]],
            rechunk=True,
        )
        own = own[piece_order]
        keys = germ.select(SEED_KEY)[own].with_columns(stage=stages.gather(start[piece_order]))
        return cls(keys, own, step.gather(piece_order), next_step.gather(piece_order))


def _segments(pieces: _Pieces, seeds: pl.DataFrame) -> pl.DataFrame:
    """Timeline pieces ``(seed, stage, start_step, end_step)`` of live and fossilized
    stages: a piece ends at the seed's next transition, the last one at the episode's
    end. Sorted by run, rank, round, env, start step and ``seq`` (a total order)."""
    ends = seeds.select("episode_end_step", "ended_step")[pieces.own]
    end_step = pl.coalesce("next_step", "episode_end_step", "ended_step", "start_step")
    steps = ends.with_columns(start_step=pieces.step, next_step=pieces.next_step)
    return pieces.keys.hstack(steps.select("start_step", end_step=end_step))
