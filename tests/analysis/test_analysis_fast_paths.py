"""The fast paths of the analyses give the same answers as the plain ones.

Counts histogram the envelope columns; lifecycles join on a 64-bit hash of the seed
key when it is collision-free. Each is compared with a direct computation.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
from esper_analysis import counts as counts_module
from esper_analysis import event_counts, load_run
from esper_analysis import lifecycles as lc


def test_counts_match_a_plain_group_by(scripted_run: Path) -> None:
    run = load_run(scripted_run)
    counts = event_counts(run)
    for dim, table in (
        ("round", counts.by_round),
        ("env", counts.by_env),
        ("step", counts.by_step),
    ):
        plain = pl.concat(
            [
                run.scan(t)
                .group_by(dim)
                .agg(events=pl.len())
                .with_columns(type=pl.lit(t))
                .select("type", dim, "events")
                .collect()
                for t in run.event_types
            ]
        ).sort("type", dim)
        assert table.equals(plain), dim
    assert counts.total == sum(run.count(t) for t in run.event_types)


def test_counts_read_in_small_batches_equal_one_batch(scripted_run: Path) -> None:
    run = load_run(scripted_run)
    batches = counts_module._batches(run, 1)
    assert len(batches) == len(run.event_types)  # every type alone
    one, totals_one = counts_module._breakdowns(run)
    many, totals_many = counts_module._breakdowns(run, 1)
    assert totals_one == totals_many
    assert all(one[dim].equals(many[dim]) for dim in one)


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns, nulls_last=True)


def test_lifecycles_on_the_hash_equal_the_six_column_key(scripted_run: Path) -> None:
    run = load_run(scripted_run)
    scans = lc._scans(run)
    keys = lc._seed_keys(scans)
    assert lc._join_key(keys) == [lc.SEED_HASH]
    assert keys.height > 0
    for key in ([lc.SEED_HASH], list(lc.SEED_KEY)):
        seeds = lc._seed_table(run, scans, keys, key).collect()
        segments = lc._segments(scans, seeds.lazy(), key).collect()
        if key == [lc.SEED_HASH]:
            fast = (seeds, segments)
    assert _sorted(fast[0]).equals(_sorted(seeds), null_equal=True)
    assert _sorted(fast[1]).equals(_sorted(segments), null_equal=True)
    assert fast[1].height > keys.height  # several stages per seed: the shift is exercised


def test_a_hash_collision_falls_back_to_the_key_columns() -> None:
    keys = pl.DataFrame(
        {
            **{k: ["r", "r"] if k in ("run_id", "slot") else [0, 0] for k in lc.SEED_KEY},
            "seed_id": ["a", "b"],
            lc.SEED_HASH: pl.Series([7, 7], dtype=pl.UInt64),
        }
    )
    assert lc._join_key(keys) == list(lc.SEED_KEY)
