"""The fast paths of the analyses give the same answers as the plain ones.

Counts histogram the envelope columns; lifecycles work on dense seed ids when every seed
has one germination, else join on a 64-bit hash of the seed key when it is
collision-free. Each is compared with a direct computation.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from _analysis_support import emit_run
from conftest import Crashed, copy_run, rewrite_part
from esper_analysis import counts as counts_module
from esper_analysis import dense_lifecycles as dense
from esper_analysis import event_counts, load_run
from esper_analysis import lifecycles as lc
from esper_analysis import loader as loader_module
from esper_analysis import reward_partials as rp
from esper_analysis.loader import Run
from esper_analysis.rewards import reward_breakdown
from esper_analysis.seed_events import seed_hashes


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


def test_counts_read_in_small_batches_equal_one_batch_and_the_pages(scripted_run: Path) -> None:
    """Columns read in one batch, in one batch per type, or counted from the pages'
    dictionary indices (where the native counter is built): the same tables."""
    run = load_run(scripted_run)
    batches = counts_module._batches(run, list(run.event_types), 1)
    assert len(batches) == len(run.event_types)  # every type alone
    one, totals_one = counts_module._breakdowns(run, pages=False)
    many, totals_many = counts_module._breakdowns(run, 1, pages=False)
    pages, totals_pages = counts_module._breakdowns(run)
    assert totals_one == totals_many == totals_pages
    for dim in one:
        assert one[dim].equals(many[dim]) and one[dim].equals(pages[dim]), dim


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns, nulls_last=True)


def test_lifecycles_on_the_hash_equal_the_six_column_key(scripted_run: Path) -> None:
    run = load_run(scripted_run)
    read = lc.read_seed_events(run)
    keys = lc._seed_keys(read)
    assert lc._join_key(keys) == [lc.SEED_HASH]
    assert keys.height > 0
    for key in ([lc.SEED_HASH], list(lc.SEED_KEY)):
        frames = lc._narrow(read, key)
        starts = lc._starts(frames, key)
        durations = lc._stage_durations(starts, key)
        seeds = lc._seed_table(run, frames, keys, key, durations).collect()
        segments = lc._segments(starts, seeds, keys, key)
        if key == [lc.SEED_HASH]:
            fast = (seeds, segments)
    assert fast[0].equals(seeds, null_equal=True)  # same rows in the same order
    assert fast[1].equals(segments, null_equal=True)
    assert fast[1].height > keys.height  # several stages per seed: the shift is exercised


def test_lifecycles_are_bit_identical_from_call_to_call(scripted_run: Path) -> None:
    """Row order (every sort has a total order) and the per-blueprint means (summed in
    numpy over a fixed row order, not by a parallel group-by) do not vary."""
    run = load_run(scripted_run)
    first, second = lc.seed_lifecycles(run), lc.seed_lifecycles(run)
    for name in ("seeds", "by_blueprint", "segments"):
        assert getattr(first, name).equals(getattr(second, name), null_equal=True), name
    plain = (
        first.seeds.group_by("blueprint")
        .agg(germinated=pl.len(), mean_lifetime_epochs=pl.col("lifetime_epochs").mean())
        .sort("blueprint")
    )
    ours = first.by_blueprint.sort("blueprint").select(plain.columns)
    assert ours["germinated"].cast(pl.UInt32).equals(plain["germinated"].cast(pl.UInt32))
    diff = (ours["mean_lifetime_epochs"] - plain["mean_lifetime_epochs"]).abs().max()
    assert diff is not None and float(diff) < 1e-9  # type: ignore[arg-type]


def test_a_hash_collision_falls_back_to_the_key_columns() -> None:
    keys = pl.DataFrame(
        {
            **{k: ["r", "r"] if k in ("run_id", "slot") else [0, 0] for k in lc.SEED_KEY},
            "seed_id": ["a", "b"],
            lc.SEED_HASH: pl.Series([7, 7], dtype=pl.UInt64),
        }
    )
    assert lc._join_key(keys) == list(lc.SEED_KEY)


def _both_ways(
    run: Run,
) -> tuple[tuple[pl.DataFrame, pl.DataFrame] | None, tuple[pl.DataFrame, pl.DataFrame]]:
    frames = lc.read_seed_events(run)
    return dense.dense_tables(run, frames), lc._keyed_tables(run, frames)


def _assert_same_tables(
    ours: tuple[pl.DataFrame, pl.DataFrame] | None, keyed: tuple[pl.DataFrame, pl.DataFrame]
) -> None:
    assert ours is not None
    for a, b in zip(ours, keyed, strict=True):
        assert a.schema == b.schema
        assert a.equals(b, null_equal=True)  # same rows in the same order


def test_dense_seed_ids_give_the_keyed_tables(scripted_run: Path) -> None:
    ours, keyed = _both_ways(load_run(scripted_run))
    _assert_same_tables(ours, keyed)
    assert keyed[0]["outcome"].n_unique() == 3  # fossilized, pruned and alive all covered
    assert keyed[1].height > keyed[0].height  # several stages per seed


def test_dense_seed_ids_on_synthetic_runs_of_several_sizes(tmp_path: Path) -> None:
    from esper_analysis.synth import synthesize_run

    for n, seed in ((3_000, 1), (40_000, 2)):
        synthesize_run(tmp_path / f"s{n}", n, seed=seed)
        ours, keyed = _both_ways(load_run(tmp_path / f"s{n}"))
        _assert_same_tables(ours, keyed)
        assert keyed[0]["outcome"].n_unique() == 3


def _with_frame(
    frames: dict[str, pl.DataFrame], name: str, frame: pl.DataFrame
) -> dict[str, pl.DataFrame]:
    return {**frames, name: frame}


def test_dense_seed_ids_decline_what_they_cannot_represent(scripted_run: Path) -> None:
    """Each precondition, broken alone, sends the analysis the general way; that way's
    tables are then what seed_lifecycles returns."""
    run = load_run(scripted_run)
    frames = lc.read_seed_events(run)
    germ, fossil = frames["seed_germinated"], frames["seed_fossilized"]
    assert dense.dense_tables(run, frames) is not None
    broken = {
        "a seed without germination": _with_frame(frames, "seed_germinated", germ.slice(1)),
        "a seed germinated twice": _with_frame(
            frames, "seed_germinated", pl.concat([germ, germ.head(1)])
        ),
        "a repeated fossilization": _with_frame(
            frames, "seed_fossilized", pl.concat([fossil, fossil.head(1)])
        ),
        "a null seq": _with_frame(
            frames, "seed_fossilized", fossil.with_columns(seq=pl.lit(None, dtype=pl.Int64))
        ),
        # an event whose hash names a seed whose key it does not have: a collision
        "a hash collision": _with_frame(
            frames,
            "seed_fossilized",
            fossil.with_columns(seed_id=pl.lit("someone-else")).with_columns(
                seed_hashes()[1]  # its own check hash, the seed hash of the one it names
            ),
        ),
        "no germinations": _with_frame(frames, "seed_germinated", germ.head(0)),
    }
    for why, frames_ in broken.items():
        assert dense.dense_tables(run, frames_) is None, why


@pytest.mark.parametrize("same_slot", [False, True])
def test_seeds_germinated_in_the_same_step_sort_by_slot_then_seed_id(
    scripted_run: Path, same_slot: bool
) -> None:
    """A second germination in the same step: in another slot, the packed (rank, round,
    env, step, slot) order still tells them apart; in the same slot only seed_id does,
    and the seed table takes the full order. Both ways agree either way."""
    run = load_run(scripted_run)
    frames = lc.read_seed_events(run)
    germ = frames["seed_germinated"]
    slot = pl.col("slot") if same_slot else pl.lit("a-slot")
    # a seq of its own: events of one rank never share one (the timeline sorts on it)
    twins = germ.head(1).with_columns(
        slot=slot, seed_id=pl.lit("a-twin"), seq=pl.col("seq") + germ["seq"].max()
    )
    twins = twins.with_columns(seed_hashes())
    germ = pl.concat([germ, twins])
    frames = _with_frame(frames, "seed_germinated", germ)
    ours = dense.dense_tables(run, frames)
    _assert_same_tables(ours, lc._keyed_tables(run, frames))
    assert ours is not None and "a-twin" in ours[0]["seed_id"].to_list()
    full = germ.sort(dense.SEED_ORDER, nulls_last=True)
    assert dense._in_seed_order(germ).equals(full)


def test_seeds_of_several_run_ids_give_the_keyed_tables(scripted_run: Path) -> None:
    """Two run ids in one read (the seeds of env 1 renamed): both ways sort on run_id
    first and agree."""
    run = load_run(scripted_run)
    renamed = pl.when(pl.col("env") == 1).then(pl.lit("a-other-run")).otherwise("run_id")
    frames = {
        name: frame.with_columns(run_id=renamed).with_columns(seed_hashes())
        for name, frame in lc.read_seed_events(run).items()
    }
    assert frames["seed_germinated"]["run_id"].n_unique() == 2
    ours = dense.dense_tables(run, frames)
    _assert_same_tables(ours, lc._keyed_tables(run, frames))
    assert ours is not None and ours[1]["run_id"][0] == "a-other-run"


class _EpisodeTwice(Run):
    """A run whose first episode_finished event reads twice (the files cannot hold
    that: the manifest check refuses them), to reach the join's guard."""

    def scan(self, event_type: str) -> pl.LazyFrame:
        lf = super().scan(event_type)
        return pl.concat([lf, lf.head(1)]) if event_type == "episode_finished" else lf


def test_an_episode_finished_twice_sends_lifecycles_the_general_way(scripted_run: Path) -> None:
    run = load_run(scripted_run)
    twice = _EpisodeTwice(**{f.name: getattr(run, f.name) for f in dataclasses.fields(Run)})
    frames = lc.read_seed_events(twice)
    assert dense.dense_tables(twice, frames) is None
    seeds = lc.seed_lifecycles(twice).seeds
    assert seeds.equals(lc._keyed_tables(twice, frames)[0], null_equal=True)
    assert seeds.height > lc.seed_lifecycles(run).seeds.height


def test_a_crashed_run_gives_the_same_lifecycles_either_way(crashed: Crashed) -> None:
    run = load_run(crashed.path)
    ours, keyed = _both_ways(run)
    if ours is not None:
        _assert_same_tables(ours, keyed)
    assert sorted(lc.seed_lifecycles(run).seeds["seed_id"]) == sorted(keyed[0]["seed_id"])


def test_reward_breakdown_is_bit_identical_and_equals_a_plain_group_by(
    scripted_run: Path,
) -> None:
    """Grouped reward sums come from numpy in row order: the same bits on every call,
    and the same numbers (to rounding) as polars' parallel group-by."""
    run = load_run(scripted_run)
    first, second = reward_breakdown(run), reward_breakdown(run)
    for name in ("by_component", "by_env", "by_episode", "by_op", "by_round"):
        assert getattr(first, name).equals(getattr(second, name), null_equal=True), name
    plain = (
        run.scan("reward_computed")
        .group_by("round")
        .agg(pl.len().alias("rows"), pl.col("total").mean(), pl.col("germinate_cost").mean())
        .sort("round")
        .collect()
    )
    ours = first.by_round.select(plain.columns)
    assert ours["rows"].equals(plain["rows"].cast(pl.UInt32))
    for col in ("total", "germinate_cost"):
        assert float((ours[col] - plain[col]).abs().max()) < 1e-9  # type: ignore[arg-type]
    by_env = run.scan("reward_computed").group_by("env").agg(pl.col("total").sum()).collect()
    assert abs(float(first.by_env["total"].sum()) - float(by_env["total"].sum())) < 1e-9


def test_grouped_reward_sums_of_nothing_and_of_nulls() -> None:
    schema = {
        **dict.fromkeys(["rank", "round", "env"], pl.Int64),
        "op": pl.String,
        **dict.fromkeys(rp.SUMMED, pl.Float64),
    }
    empty = pl.DataFrame(schema=schema)
    assert rp.group_sums(rp.Partials.of(empty), ["env"]).height == 0
    keys = {"rank": [0, 0, 0], "round": [0, 1, 0], "env": [0, 0, 1], "op": ["wait"] * 3}
    rows = pl.DataFrame({**keys, **{c: [1.0, 2.0, None] for c in rp.SUMMED}}, schema=schema)
    partials = rp.Partials.of(rows)
    means = rp.group_sums(partials, ["env"], mean=True)
    assert means.sort("env")["total"].to_list() == [1.5, None]
    sums = rp.group_sums(partials, ["env"]).sort("env")
    assert sums["total"].to_list() == [3.0, 0.0]  # as polars' sum
    assert sums["rows"].to_list() == [2, 1]


def test_group_codes_partition_rows_like_a_group_by() -> None:
    """Small-range and wide-range integers and strings, alone and combined: same groups
    as polars' dense rank of the key struct (the code numbering itself may differ)."""
    rng = np.random.default_rng(0)
    n = 5000
    df = pl.DataFrame(
        {
            "round": rng.integers(0, 40, n),
            "wide": rng.integers(-(2**40), 2**40, n) // 2**35,
            "op": rng.choice(["wait", "germinate", "prune", "advance"], n),
            "rank": rng.integers(0, 3, n),
        }
    )
    for keys in (["round"], ["wide"], ["op"], ["rank", "round", "op"], ["wide", "round"]):
        codes, n_groups = rp._group_codes(df, keys)
        reference = df.select(pl.struct(keys).rank("dense")).to_series().to_numpy() - 1
        assert n_groups == int(reference.max()) + 1
        pairs = set(zip(codes.tolist(), reference.tolist(), strict=True))
        assert len(pairs) == n_groups  # a bijection between our codes and the reference


def test_per_blueprint_rates_equal_a_plain_group_by() -> None:
    """The bincount roll-up of the per-blueprint table against polars' own group-by, on
    seeds with missing blueprints, missing and NaN contributions and missing lifetimes."""
    rng = np.random.default_rng(1)
    n = 400
    seeds = pl.DataFrame(
        {
            "blueprint": pl.Series(rng.choice(["a", "b", "c", None], n).tolist(), dtype=pl.String),
            "outcome": rng.choice(["fossilized", "pruned", "alive"], n).tolist(),
            "contribution": [
                None if x < 0.1 else (float("nan") if x < 0.2 else x) for x in rng.random(n)
            ],
            "lifetime_epochs": [None if x < 0.1 else int(x * 10) for x in rng.random(n)],
        }
    )
    ours = lc._by_blueprint(seeds)
    finite = pl.col("contribution").is_finite().fill_null(False)
    ended = pl.col("outcome").is_in(["fossilized", "pruned"])
    plain = (
        seeds.group_by("blueprint")
        .agg(
            germinated=pl.len(),
            fossilized=(pl.col("outcome") == "fossilized").sum(),
            mean_contribution=pl.col("contribution").filter(finite & ended).mean(),
            mean_lifetime_epochs=pl.col("lifetime_epochs").mean(),
        )
        .sort("blueprint", nulls_last=True)
    )
    ours = ours.sort("blueprint", nulls_last=True)
    assert ours["blueprint"].to_list() == plain["blueprint"].to_list()
    assert ours["blueprint"].null_count() == 1  # seeds without a germination event
    for col in ("germinated", "fossilized"):
        assert ours[col].cast(pl.Int64).to_list() == plain[col].cast(pl.Int64).to_list()
    for col in ("mean_contribution", "mean_lifetime_epochs"):
        diff = (ours[col] - plain[col]).abs().max()
        assert diff is not None and float(diff) < 1e-12  # type: ignore[arg-type]
    assert lc._by_blueprint(seeds.head(0)).height == 0


def test_grouped_keys_match_their_rows_on_both_paths() -> None:
    """The mixed-radix path (small ranges, strings) and the per-key fallback (a range
    too wide to code directly) both partition rows like a group-by and give each group
    the key values of its rows."""
    rng = np.random.default_rng(4)
    n = 4000
    df = pl.DataFrame(
        {
            "rank": rng.integers(0, 2, n),
            "round": rng.integers(5, 45, n),
            "op": rng.choice(["wait", "germinate", "prune"], n).tolist(),
            "wide": rng.integers(0, 2, n) * 10**15,
        }
    )
    for keys, direct in ((["rank", "round", "op"], True), (["round", "wide"], False)):
        assert (rp.mixed_radix(df, keys) is not None) is direct
        group, n_groups, key_values = rp._grouped(df, keys)
        reference = df.select(pl.struct(keys).rank("dense")).to_series().to_numpy() - 1
        assert n_groups == int(reference.max()) + 1 == key_values.height
        assert len(set(zip(group.tolist(), reference.tolist(), strict=True))) == n_groups
        assert key_values[group].equals(df.select(keys))  # every row's keys, via its group


def test_rolled_up_groups_match_a_group_by_of_the_finest_keys() -> None:
    """Every roll-up of the finest partials (digits of the mixed-radix code, or a second
    grouping on the fallback path) gives each row of the key frame the group its keys
    name, with those key values."""
    rng = np.random.default_rng(5)
    n = 3000
    rows = pl.DataFrame(
        {
            "rank": rng.integers(0, 2, n),
            "round": rng.integers(3, 30, n),
            "env": rng.integers(0, 4, n),
            "op": rng.choice(["wait", "germinate", "prune"], n).tolist(),
            **{c: rng.random(n) for c in rp.SUMMED},
        }
    )
    wide = rows.with_columns(pl.col("round") * 10**15)  # too wide to code: the fallback
    for frame, direct in ((rows, True), (wide, False)):
        partials = rp.Partials.of(frame)
        assert (partials.radix is not None) is direct
        for keys in (["env"], ["op"], ["round"], ["rank", "round", "env"], ["env", "op"]):
            group, n_groups, key_values = partials.rolled_up(keys)
            assert key_values.height == n_groups == partials.keys.select(keys).n_unique()
            assert key_values[group].equals(partials.keys.select(keys)), keys
            total = rp.group_sums(partials, keys)["total"].sum()
            assert abs(total - float(frame["total"].sum())) < 1e-9


def test_histograms_of_constant_negative_sparse_empty_and_null_columns() -> None:
    cases = ([3, 3, 3], [-2, 5, -2, 7], [0, 10**6, 10**6], [], [None, 4, None, 4, 1])
    for values in cases:
        one = pl.Series("v", values, dtype=pl.Int64)
        # The same values in several chunks (as a scan returns them), an empty one too.
        pieces = [one.slice(0, 1), one.slice(1, 0), one.slice(1, 2), one.slice(3)]
        chunked = pl.concat(pieces, rechunk=False)
        for series in (one, chunked):
            keys, counts = counts_module._histogram(series)
            plain = series.drop_nulls().value_counts().sort("v")
            assert keys.tolist() == plain["v"].to_list()
            assert counts.tolist() == plain["count"].to_list()


def _rank_counts_read(run: Run) -> dict[str, list[tuple[int, int]]]:
    """Rows per rank of every type, read from the data (the plain way)."""
    out = {}
    for t in run.event_types:
        frame = run.scan(t).group_by("rank").agg(n=pl.len()).sort("rank").collect()
        out[t] = list(zip(frame["rank"].to_list(), frame["n"].to_list(), strict=True))
    return out


def _rank_counts_counted(run: Run) -> dict[str, list[tuple[int, int]]]:
    table = event_counts(run).by_rank
    return {
        t: list(zip(part["rank"].to_list(), part["events"].to_list(), strict=True))
        for (t,), part in table.partition_by("type", as_dict=True).items()
    }


def test_ranks_proven_by_footers_count_like_the_column(tmp_path: Path) -> None:
    emit_run(tmp_path, "multi", rank=0)
    emit_run(tmp_path, "multi", rank=2)
    run = load_run(tmp_path / "multi")
    # A closed run's compacted files carry statistics: no type's rank is read.
    assert all(counts_module._footer_ranks(run, t) is not None for t in run.event_types)
    assert _rank_counts_counted(run) == _rank_counts_read(run)
    assert {part.rank_value for parts in run.files.values() for part in parts} == {0, 2}


def test_ranks_are_read_where_footers_do_not_prove_them(
    scripted_run: Path, crashed: Crashed, tmp_path: Path
) -> None:
    # No rank column: the directory's rank, as the scan fills it in.
    dropped = copy_run(scripted_run, tmp_path / "dropped")
    part = next((dropped / "events" / "type=env_step").rglob("*.parquet"))
    rewrite_part(part, drop=["rank"])
    run = load_run(dropped)
    assert counts_module._footer_ranks(run, "env_step") is not None
    assert _rank_counts_counted(run) == _rank_counts_read(run)
    # No statistics: the column is read.
    nostats = copy_run(scripted_run, tmp_path / "nostats")
    part = next((nostats / "events" / "type=env_step").rglob("*.parquet"))
    pq.write_table(pq.read_table(part), part, write_statistics=False)
    run = load_run(nostats)
    assert counts_module._footer_ranks(run, "env_step") is None
    assert _rank_counts_counted(run) == _rank_counts_read(run)
    # A crashed run: journalled events (in memory, nothing proven) and lz4 parts.
    run = load_run(crashed.path)
    assert any(counts_module._footer_ranks(run, t) is None for t in run.event_types)
    assert _rank_counts_counted(run) == _rank_counts_read(run)


def test_a_footer_rank_needs_one_value_and_no_nulls(tmp_path: Path) -> None:
    import pyarrow as pa

    cases = {
        "one": (pa.array([3, 3, 3], pa.int64()), 3),
        "two": (pa.array([3, 4, 3], pa.int64()), None),
        "nulls": (pa.array([3, None, 3], pa.int64()), None),
    }
    for name, (ranks, expected) in cases.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"rank": ranks}), path, row_group_size=2)
        assert loader_module._rank_value(pq.read_metadata(path), 7) == expected, name
    path = tmp_path / "absent.parquet"
    pq.write_table(pa.table({"seq": pa.array([1, 2], pa.int64())}), path)
    assert loader_module._rank_value(pq.read_metadata(path), 7) == 7


@pytest.mark.parametrize("native", [True, False])
def test_grouped_sums_do_not_depend_on_chunking(native: bool) -> None:
    """One chunk, a few chunks read in place, or more chunks than are read in place
    (copied first), natively or in numpy: the same bits as one ``np.bincount`` over
    the whole column, and the same row counts."""
    rng = np.random.default_rng(11)
    values = rng.normal(size=5_000) * 10.0 ** rng.integers(-8, 8, 5_000)
    group = rng.integers(0, 300, 5_000)
    expected = np.bincount(group, weights=values, minlength=300)
    for pieces in (1, 7, rp._MAX_CHUNKS_IN_PLACE + 5):
        edges = np.linspace(0, len(values), pieces + 1).astype(int)
        chunks = [pl.Series(values[a:b]) for a, b in itertools.pairwise(edges)]
        series = pl.concat(chunks, rechunk=False)
        assert series.n_chunks() == pieces
        other = series * -3.0  # one chunk: unlike ``series``, so both are made contiguous
        rows, table = rp._grouped_sums([series, other], group, 300, native=native)
        sums, thrice = table
        assert np.array_equal(sums, expected), pieces
        assert np.array_equal(thrice, np.bincount(group, weights=values * -3.0, minlength=300))
        assert np.array_equal(rows, np.bincount(group, minlength=300))


@pytest.mark.skipif(rp._native is None, reason="the native grouped sums were not built here")
def test_native_grouped_sums_check_their_inputs() -> None:
    sums, rows = np.zeros((2, 4)), np.zeros(4, dtype=np.int64)
    values = [np.ones(3), np.ones(3)]
    with pytest.raises(ValueError, match="outside"):
        rp.add_grouped(sums, rows, np.array([0, 4, 1]), values)
    with pytest.raises(ValueError, match="columns"):
        rp.add_grouped(sums, rows, np.array([0, 1, 1]), values[:1])
    with pytest.raises(TypeError, match="codes"):
        rp.add_grouped(sums, rows, np.array([0, 1, 1], dtype=np.int32), values)
    with pytest.raises(ValueError, match="column 1"):
        rp.add_grouped(sums, rows, np.array([0, 1, 1]), [np.ones(3), np.ones(2)])
    sums, rows = np.zeros((2, 4)), np.zeros(4, dtype=np.int64)  # a failed call adds some
    rp.add_grouped(sums, rows, np.array([3, 3, 0]), [np.array([1.0, 2.0, 4.0])] * 2)
    assert rows.tolist() == [1, 0, 0, 2] and sums[1].tolist() == [4.0, 0.0, 0.0, 3.0]
