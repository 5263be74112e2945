"""Loading runs: all ranks, crashed runs, older and newer schemas, corrupt files, dedup."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from _analysis_support import CONFIG_HASH, Script, emit_run, run_started
from conftest import OLD_SCHEMA_DROPS, OLD_SCHEMA_VERSION, Crashed, copy_run, rewrite_part
from esper_analysis.counts import event_counts
from esper_analysis.errors import CorruptFileError, NewerSchemaError, RunNotFoundError
from esper_analysis.loader import load_run, load_runs, scan_runs
from esper_analysis.schema import polars_schema as event_schema

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry.events import SCHEMA_VERSION
from esper.telemetry.hub import open_run


def _first_part(run: Path, event_type: str) -> Path:
    return sorted((run / "events" / f"type={event_type}").rglob("*.parquet"))[0]


def test_finished_run_reads_every_type_with_catalogue_dtypes(
    scripted: tuple[Path, Script],
) -> None:
    path, script = scripted
    run = load_run(path)
    assert run.run_id == "scripted"
    assert run.status is RunStatus.FINISHED
    assert run.recovery is None
    assert run.config_hash == CONFIG_HASH
    assert run.schema_version == SCHEMA_VERSION
    assert set(run.event_types) == set(script.expected_counts())
    for event_type, n in script.expected_counts().items():
        frame = run.scan(event_type).collect()
        assert frame.height == n, event_type
        assert frame.schema == event_schema(event_type)
    seqs = pl.concat([run.scan(t).select("seq") for t in run.event_types]).collect()["seq"]
    assert seqs.sort().to_list() == list(range(sum(script.expected_counts().values())))


def test_type_never_written_scans_as_an_empty_typed_frame(scripted_run: Path) -> None:
    frame = load_run(scripted_run).scan("layer_grad_stats").collect()
    assert frame.height == 0
    assert frame.schema == event_schema("layer_grad_stats")


def test_all_ranks_are_one_dataset_and_a_directory_of_runs_loads(tmp_path: Path) -> None:
    _, script = emit_run(tmp_path, "multi", rank=0)
    emit_run(tmp_path, "multi", rank=1)
    emit_run(tmp_path, "other")
    run = load_run(tmp_path / "multi")
    assert sorted(run.manifests) == [0, 1]
    steps = run.scan("env_step").group_by("rank").len().sort("rank").collect()
    assert steps["len"].to_list() == [script.counts["env_step"]] * 2
    assert event_counts(run).of("env_step") == 2 * script.counts["env_step"]
    runs = load_runs(tmp_path)
    assert [r.run_id for r in runs] == ["multi", "other"]
    fleet = scan_runs(runs, "episode_finished").group_by("run_id").len().sort("run_id").collect()
    assert fleet["len"].to_list() == [
        2 * script.counts["episode_finished"],
        script.counts["episode_finished"],
    ]
    assert [r.run_id for r in load_runs(tmp_path / "other")] == ["other"]


def test_crashed_run_reports_what_was_recovered(crashed: Crashed) -> None:
    run = load_run(crashed.path)
    assert json.loads((crashed.path / "manifest.json").read_text())["status"] == "running"
    assert run.status is RunStatus.CRASHED
    rec = run.recovery
    assert rec is not None
    assert rec.events == crashed.durable_events
    assert rec.last_seq == {0: crashed.durable_events - 1}
    assert rec.seq_gaps == {0: 0}
    assert rec.files_read and all(f.startswith("events/") for f in rec.files_read)
    assert rec.files_skipped == ()
    assert f"recovered {crashed.durable_events} events" in rec.message
    assert "crashed" in rec.message
    assert run.rows_on_disk("run_finished") == 0
    assert event_counts(run).total == crashed.durable_events


def test_corrupt_file_in_a_crashed_run_is_skipped_with_a_warning(
    crashed: Crashed, tmp_path: Path
) -> None:
    run_dir = copy_run(crashed.path, tmp_path / "crashed")
    victim = _first_part(run_dir, "env_step")
    lost = load_run(run_dir).rows_on_disk("env_step")
    victim.write_bytes(victim.read_bytes()[:40])
    with pytest.warns(UserWarning) as caught:
        run = load_run(run_dir)
    # Two warnings: the file skipped, and the type's rows short of the manifest's count.
    messages = [str(w.message) for w in caught]
    assert any("skipping" in m and "env_step" in m for m in messages), messages
    assert any("degraded read" in m and "env_step: manifest counts" in m for m in messages)
    assert run.recovery is not None
    assert [s.path for s in run.recovery.files_skipped] == [str(victim.relative_to(run_dir))]
    assert run.recovery.events == crashed.durable_events - lost


def test_corrupt_file_in_a_finished_run_is_an_error_naming_it(
    scripted_run: Path, tmp_path: Path
) -> None:
    run_dir = copy_run(scripted_run, tmp_path / "corrupt")
    victim = _first_part(run_dir, "reward_computed")
    victim.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(CorruptFileError, match=str(victim)):
        load_run(run_dir)


def test_older_schema_reads_missing_columns_as_null(older_run: Path) -> None:
    run = load_run(older_run)
    assert run.schema_version == OLD_SCHEMA_VERSION
    for event_type, columns in OLD_SCHEMA_DROPS.items():
        frame = run.scan(event_type).collect()
        assert frame.schema == event_schema(event_type)
        for column in columns:
            assert frame[column].null_count() == frame.height, (event_type, column)


def test_newer_schema_is_a_clear_error(scripted_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(scripted_run, tmp_path / "newer_manifest")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["schema_version"] = SCHEMA_VERSION + 1
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(NewerSchemaError, match="newer"):
        load_run(run_dir)
    run_dir = copy_run(scripted_run, tmp_path / "newer_file")
    victim = _first_part(run_dir, "env_step")
    rewrite_part(victim, version=SCHEMA_VERSION + 1)
    with pytest.raises(NewerSchemaError, match=str(victim)):
        load_run(run_dir)


def test_missing_or_non_run_directories_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(RunNotFoundError, match="does not exist"):
        load_run(tmp_path / "nope")
    with pytest.raises(RunNotFoundError, match="not a run directory"):
        load_run(tmp_path)
    with pytest.raises(RunNotFoundError, match="no run directories"):
        load_runs(tmp_path)


def test_a_live_run_reads_as_running_with_what_is_flushed(tmp_path: Path) -> None:
    hub = open_run(tmp_path, "live", level=TelemetryLevel.NORMAL, flush_interval_s=60.0)
    try:
        hub.emit(run_started())
        hub.flush()
        run = load_run(tmp_path / "live")
        assert run.status is RunStatus.RUNNING
        assert run.recovery is not None and run.recovery.events == 1
        assert "is running" in run.recovery.message
    finally:
        hub.close()
    assert load_run(tmp_path / "live").status is RunStatus.FINISHED


def test_a_rank_without_a_manifest_is_not_said_to_be_missing_from_the_totals(
    tmp_path: Path,
) -> None:
    """Issue 48: with a rank's manifest missing, the warning said its events were
    missing from totals that include them."""
    emit_run(tmp_path, "multi", rank=0)
    emit_run(tmp_path, "multi", rank=1)
    (tmp_path / "multi" / "manifest-rank1.json").unlink()
    manifest = json.loads((tmp_path / "multi" / "manifest.json").read_text())
    manifest["world_size"] = 3
    (tmp_path / "multi" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match="degraded read"):
        run = load_run(tmp_path / "multi")
    assert event_counts(run).by_rank["rank"].unique().sort().to_list() == [0, 1]
    (no_manifest,) = [n for n in run.degraded if "[1]" in n]
    assert "have events but no manifest" in no_manifest
    (missing,) = [n for n in run.degraded if "[2]" in n]
    assert "have no manifest and no events" in missing
