"""The analyses' streamed and native ways give the plain ways' tables.

Rewards read one row group at a time (``reward_stream``) against the table read whole;
the row checks' native pass against polars; event counts taken from the pages'
dictionary indices (``dict_counts``) against the columns read; and the native passes
on malformed input.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from _analysis_support import emit_run
from conftest import Crashed, copy_run
from esper_analysis import counts as counts_module
from esper_analysis import dict_counts, load_run, reward_partials
from esper_analysis.counts import _nested
from esper_analysis.reward_checks import RowChecks
from esper_analysis.reward_stream import stream_partials
from esper_analysis.rewards import RewardBreakdown, reward_breakdown

TABLES = ("by_component", "by_env", "by_episode", "by_op", "by_round", "flagged")
needs_rle = pytest.mark.skipif(dict_counts._native is None, reason="_rle was not built here")


def _assert_same(a: RewardBreakdown, b: RewardBreakdown) -> None:
    for name in TABLES:
        x, y = getattr(a, name), getattr(b, name)
        assert x.schema == y.schema, name
        assert x.equals(y, null_equal=True), name
    assert (a.rows, a.flagged_rows, a.missing_components) == (
        b.rows,
        b.flagged_rows,
        b.missing_components,
    )


def _reward_part(run_dir: Path) -> Path:
    (part,) = (run_dir / "events").glob("type=reward_computed/**/*.parquet")
    return part


def _rewrite(part: Path, transform: Callable[[pa.Table], pa.Table], **options: object) -> None:
    table = transform(pq.read_table(part))
    pq.write_table(table, part, **{"compression": "zstd", **options})  # type: ignore[arg-type]


def _set(table: pa.Table, column: str, rows: dict[int, float | None]) -> pa.Table:
    values = table.column(column).to_pylist()
    for row, value in rows.items():
        values[row] = value
    i = table.schema.get_field_index(column)
    return table.set_column(i, column, pa.array(values, pa.float64()))


def test_streamed_rewards_equal_the_table_read_whole(scripted_run: Path) -> None:
    run = load_run(scripted_run)
    assert stream_partials(run, RowChecks()) is not None  # this run streams
    _assert_same(reward_breakdown(run), reward_breakdown(run, stream=False))


@pytest.mark.parametrize("native", [True, False])
def test_streamed_rewards_of_awkward_rows_in_small_row_groups(
    scripted_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """NaNs, a null, signed zeros, rows off by more and by less than the tolerance, in
    row groups of seven rows (ops first met in later row groups): the same tables
    read either way, natively or not, and exactly the unbalanced rows flagged."""
    if not native:
        monkeypatch.setattr(reward_partials, "_native", None)
    run_dir = copy_run(scripted_run, tmp_path / "awkward")

    def awkward(table: pa.Table) -> pa.Table:
        total = table.column("total").to_pylist()
        zeros = [i for i, v in enumerate(table.column("alpha_shock").to_pylist()) if v == 0]
        table = _set(table, "attribution", {3: math.nan})
        table = _set(table, "alpha_shock", dict.fromkeys(zeros, -0.0))  # sums unchanged
        table = _set(table, "alpha_shock", {zeros[-1]: None})  # a null: polars checks it
        return _set(table, "total", {7: total[7] + 2e-6, 9: total[9] + 0.5e-6})

    _rewrite(_reward_part(run_dir), awkward, row_group_size=7)
    run = load_run(run_dir)
    assert stream_partials(run, RowChecks(native=native)) is not None
    streamed, whole = reward_breakdown(run), reward_breakdown(run, stream=False)
    _assert_same(streamed, whole)
    already = reward_breakdown(load_run(scripted_run)).flagged_rows  # the script's own
    assert streamed.flagged_rows == already + 2  # and the NaN row and the one 2e-6 off
    shock = streamed.by_component.filter(pl.col("component") == "alpha_shock")
    assert all(math.copysign(1.0, v) == 1.0 for v in (shock["min"][0], shock["max"][0]) if v == 0)


def test_rewards_not_streamed_where_the_files_do_not_allow_it(
    scripted_run: Path, older_run: Path, crashed: Crashed, tmp_path: Path
) -> None:
    """A missing component (older schema), footers without statistics, a null key and
    journal parts: the whole table is read, with the same tables."""
    no_stats = copy_run(scripted_run, tmp_path / "no_stats")
    _rewrite(_reward_part(no_stats), lambda t: t, write_statistics=False)
    null_env = copy_run(scripted_run, tmp_path / "null_env")
    _rewrite(
        _reward_part(null_env),
        lambda t: t.set_column(
            t.schema.get_field_index("env"),
            "env",
            pc.if_else(pc.equal(t.column("step"), 0), pa.scalar(None, pa.int64()), t["env"]),
        ),
    )
    for run_dir in (older_run, no_stats, null_env, crashed.path):
        run = load_run(run_dir)
        assert stream_partials(run, RowChecks()) is None, run_dir.name
        _assert_same(reward_breakdown(run), reward_breakdown(run, stream=False))


def test_streamed_rewards_and_page_counts_of_two_ranks(tmp_path: Path) -> None:
    """Two ranks' files, read in rank order either way."""
    emit_run(tmp_path, "multi", rank=1)  # written first: the read order is the ranks'
    emit_run(tmp_path, "multi", rank=0)
    run = load_run(tmp_path / "multi")
    assert stream_partials(run, RowChecks()) is not None
    streamed = reward_breakdown(run)
    _assert_same(streamed, reward_breakdown(run, stream=False))
    assert streamed.by_episode["rank"].unique().sort().to_list() == [0, 1]
    _assert_same_counts(run)


def test_native_and_polars_row_checks_agree_on_every_row_group(scripted_run: Path) -> None:
    run = load_run(scripted_run)
    native, plain = RowChecks(), RowChecks(native=False)
    assert stream_partials(run, native) is not None
    assert stream_partials(run, plain) is not None
    for a, b in zip(native.results(), plain.results(), strict=True):
        assert a.equals(b, null_equal=True)


@needs_rle
def test_counts_from_the_pages_on_a_synthetic_run(synthetic_run: Path) -> None:
    run = load_run(synthetic_run)
    assert all(dict_counts.dictionary_histograms(run, t, ["round"]) for t in run.event_types)
    _assert_same_counts(run)


def _assert_same_counts(run: object) -> None:
    pages, totals_pages = counts_module._breakdowns(run)  # type: ignore[arg-type]
    read, totals_read = counts_module._breakdowns(run, pages=False)  # type: ignore[arg-type]
    assert totals_pages == totals_read
    for dim, table in read.items():
        assert table.equals(pages[dim]), dim


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from esper_analysis.synth import synthesize_run

    path = tmp_path_factory.mktemp("synthetic") / "run"
    synthesize_run(path, 30_000, seed=3)
    return path


@needs_rle
@pytest.mark.parametrize(
    ("options", "counted"),
    [
        ({"data_page_version": "2.0"}, True),
        ({"compression": "none"}, True),
        ({"compression": "snappy"}, True),
        ({"compression": "gzip"}, True),
        ({"compression": "lz4"}, False),  # Parquet's framed LZ4: read instead
        ({"use_dictionary": False}, False),  # plain pages: read instead
        # steps all distinct: the dictionary overflows and later pages are plain
        (
            {
                "dictionary_pagesize_limit": 64,
                "write_batch_size": 64,
                "distinct_steps": True,
            },
            False,
        ),
    ],
)
def test_counts_from_the_pages_of_files_written_otherwise(
    synthetic_run: Path, tmp_path: Path, options: dict[str, object], counted: bool
) -> None:
    """Other page versions and codecs are counted from their pages; what cannot be
    (plain pages, a codec not read here) is read. Nulls in ``env`` (some rows') are
    left out either way."""
    run_dir = copy_run(synthetic_run, tmp_path / "other")
    part = _reward_part(run_dir)

    distinct = options.pop("distinct_steps", False)

    def nulls(t: pa.Table) -> pa.Table:
        env = pc.if_else(pc.equal(t.column("step"), 1), pa.scalar(None, pa.int64()), t["env"])
        t = t.set_column(t.schema.get_field_index("env"), "env", env)
        if distinct:
            steps = pa.array(np.arange(t.num_rows, dtype=np.int64))
            t = t.set_column(t.schema.get_field_index("step"), "step", steps)
        return t

    _rewrite(part, nulls, row_group_size=1000, **options)
    run = load_run(run_dir)
    found = dict_counts.dictionary_histograms(run, "reward_computed", ["round", "env", "step"])
    assert (found is not None) is counted
    if found is not None:
        env = pq.read_table(part, columns=["env"]).column("env").drop_null().to_numpy()
        values, counts = np.unique(env, return_counts=True)
        assert np.array_equal(found[0]["env"][0], values)
        assert np.array_equal(found[0]["env"][1], counts)
    _assert_same_counts(run)


@needs_rle
def test_the_run_counter_refuses_malformed_streams() -> None:
    rle = dict_counts._native
    assert rle is not None
    counts = np.zeros(4, dtype=np.int64)
    assert rle.count_runs(bytes([10, 2]), 2, 5, counts) == 2  # RLE: 5 times value 2
    assert counts.tolist() == [0, 0, 5, 0]
    counts[:] = 0  # bit-packed, one group of 8 two-bit values: 0 1 2 3 0 1 2 3
    assert rle.count_runs(bytes([3, 0b11100100, 0b11100100]), 2, 6, counts) == 3
    assert counts.tolist() == [2, 2, 1, 1]  # the last two values pad the group
    bad = {
        "runs past the page": (bytes([3, 0b11100100]), 2, 6),
        "outside the dictionary": (bytes([10, 7]), 3, 5),
        "header": (bytes([0x80, 0x80]), 2, 1),
        "bit width": (bytes([10, 2]), 40, 5),
    }
    for why, (data, width, n) in bad.items():
        with pytest.raises(ValueError, match=why):
            rle.count_runs(data, width, n, counts)


def test_nested_counts_of_an_unsorted_table() -> None:
    frame = pl.DataFrame({"type": ["b", "a", "b"], "round": [1, 2, 3], "events": [5, 6, 7]})
    assert _nested(frame, "round") == {"a": {"2": 6}, "b": {"1": 5, "3": 7}}


def test_lifecycles_the_same_where_footers_do_not_prove_the_run_id(
    scripted_run: Path, tmp_path: Path
) -> None:
    """One run_id proven by the footers is added as a constant (not read, not hashed);
    without statistics it is read and hashed: the same tables either way."""
    from esper_analysis import lifecycles, seed_events

    plain = copy_run(scripted_run, tmp_path / "plain")
    for part in (plain / "events").glob("type=seed_*/**/*.parquet"):
        _rewrite(part, lambda t: t, write_statistics=False)
    proven, unproven = load_run(scripted_run), load_run(plain)
    assert seed_events._one_run_id(proven) == proven.run_id
    assert seed_events._one_run_id(unproven) is None
    a, b = lifecycles.seed_lifecycles(proven), lifecycles.seed_lifecycles(unproven)
    for name in ("seeds", "by_blueprint", "segments"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.schema == y.schema and x.equals(y, null_equal=True), name


def test_decimal_strings_of_small_wide_negative_and_null_ranges() -> None:
    from esper_analysis.counts import _decimal_strings

    for values in ([3, 1, 3, 2], [-2, 0, -2], [5, 10**12], [7, None, 7], [], [None]):
        series = pl.Series(values, dtype=pl.Int64)
        assert _decimal_strings(series) == series.cast(pl.String).to_list(), values


def test_a_footer_proves_a_run_id_only_without_nulls(tmp_path: Path) -> None:
    from esper_analysis.integrity import footer_run_id

    for values, proven in ((["r", "r"], "r"), (["r", None], None), (["r", "s"], None)):
        path = tmp_path / "part.parquet"
        pq.write_table(pa.table({"run_id": pa.array(values, pa.string())}), path)
        assert footer_run_id(pq.read_metadata(path)) == proven, values
