"""Hive-style ``events/type=<type>/rank=<r>/``, read by polars, DuckDB and esper's own
reader alike; runs of schema versions 1-2 (before parts were named by seq range) are a
clear error."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from conftest import copy_run, rewrite_part
from esper_analysis.errors import CorruptFileError
from esper_analysis.loader import load_run
from esper_analysis.watch import snapshot

from esper.core.enums import RunStatus, TelemetryLevel
from esper.errors import UserError
from esper.telemetry import events as ev
from esper.telemetry.events import SCHEMA_VERSION
from esper.telemetry.hub import open_run

README = Path(__file__).resolve().parents[2] / "README.md"


def _as_version_1(source: Path, target: Path) -> Path:
    """The run as schema version 1 wrote it: ``events/<type>/rank=<r>/``, version 1."""
    run = copy_run(source, target)
    for type_dir in sorted((run / "events").iterdir()):
        old = type_dir.with_name(type_dir.name.removeprefix("type="))
        type_dir.rename(old)
        for part in old.rglob("*.parquet"):
            rewrite_part(part, version=1)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["schema_version"] = 1
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_new_runs_are_hive_partitioned_on_type_and_rank(scripted_run: Path) -> None:
    assert SCHEMA_VERSION == 4
    dirs = sorted(p.name for p in (scripted_run / "events").iterdir())
    assert dirs and all(d.startswith("type=") for d in dirs)
    # the README's polars one-liner: `type` comes from the path
    lf = pl.scan_parquet(
        scripted_run.parent / "*" / "events" / "**" / "*.parquet",
        hive_partitioning=True,
        missing_columns="insert",
        extra_columns="ignore",
    )
    got = dict(
        lf.filter(pl.col("run_id") == "scripted").group_by("type").len().collect().iter_rows()
    )
    manifest = load_run(scripted_run).manifest
    assert manifest is not None and got == manifest.counts
    assert "hive_partitioning=True" in README.read_text()


def test_duckdb_reads_type_as_a_column(scripted_run: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    rows = duckdb.sql(
        "SELECT type, count(*), sum(seq), max(ts_ns) "
        f"FROM read_parquet('{scripted_run}/events/**/*.parquet', "
        "hive_partitioning = true, union_by_name = true) GROUP BY type"
    ).fetchall()
    manifest = load_run(scripted_run).manifest
    assert manifest is not None and {t: n for t, n, _, _ in rows} == manifest.counts
    # seq and ts_ns are delta-encoded in compacted files: DuckDB decodes the same values.
    both = pl.scan_parquet(
        f"{scripted_run}/events/**/*.parquet",
        hive_partitioning=True,
        missing_columns="insert",
        extra_columns="ignore",
    )
    expected = both.group_by("type").agg(pl.col("seq").sum(), pl.col("ts_ns").max()).collect()
    assert {t: (int(s), m) for t, _, s, m in rows} == {
        t: (s, m) for t, s, m in expected.iter_rows()
    }


def test_version_1_runs_are_a_clear_error(scripted_run: Path, tmp_path: Path) -> None:
    old = _as_version_1(scripted_run, tmp_path / "v1")
    assert not any(p.name.startswith("type=") for p in (old / "events").iterdir())
    with pytest.raises(CorruptFileError, match="schema version 1; this version reads 3-4"):
        load_run(old)
    assert snapshot(scripted_run).rounds_done == 2


def _killed(run: Path) -> Path:
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["status"] = RunStatus.RUNNING.value  # as a kill -9 leaves it
    manifest["pid"] = 0
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_resuming_cuts_the_tail_and_counts_by_event_type(
    scripted_run: Path, tmp_path: Path
) -> None:
    run_dir = _killed(copy_run(scripted_run, tmp_path / "root" / "scripted"))
    start = 50
    hub = open_run(
        run_dir.parent, "scripted", level=TelemetryLevel.NORMAL, resume=True, start_seq=start
    )
    hub.emit(ev.RoundStarted(round=9, n_envs=1, episode_length=1, entropy_coef=0, lr=0))
    hub.close(RunStatus.FINISHED)
    run = load_run(run_dir)
    seqs = pl.concat([run.scan(t).select("seq") for t in run.event_types]).collect()["seq"]
    assert sorted(seqs.to_list()) == list(range(start + 2))  # 0..49, round_started, writer_stats
    assert run.manifest is not None
    counts = run.manifest.counts
    assert not [t for t in counts if t.startswith("type=")]
    assert sum(counts.values()) == start + 2


def test_continuing_a_version_1_run_is_refused_clearly(scripted_run: Path, tmp_path: Path) -> None:
    old = _killed(_as_version_1(scripted_run, tmp_path / "root" / "scripted"))
    with pytest.raises(UserError, match=f"schema v1, this build writes v{SCHEMA_VERSION}"):
        open_run(old.parent, "scripted", level=TelemetryLevel.NORMAL, resume=True, start_seq=5)
