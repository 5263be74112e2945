"""Corrupted or foreign data is an error (or a flagged degraded read), never silent.

Issue 13, item 3: 100 random bytes inside a reward part read back with rc 0 and changed
totals; a part copied in from another run read back with rc 0, mixed run ids and more
events than the manifest states.
"""

from __future__ import annotations

import io
import json
import random
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _analysis_support import emit_run, run_started
from conftest import Crashed, copy_run, rewrite_part
from esper_analysis import load_run
from esper_analysis.cli import main
from esper_analysis.counts import event_counts

from esper.core.enums import TelemetryLevel
from esper.telemetry.hub import open_run
from esper.telemetry.paths import part_name

#: Bytes overwritten per trial, and trials (each a different offset and content).
SCRIBBLE_BYTES = 100
SCRIBBLE_TRIALS = 12
#: Parquet trailer: 4-byte footer length + "PAR1".
TRAILER = 8


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _only_part(run_dir: Path, event_type: str) -> Path:
    parts = sorted((run_dir / "events" / f"type={event_type}" / "rank=0").glob("part-*.parquet"))
    assert len(parts) == 1, parts
    return parts[0]


def _scribble(path: Path, rng: random.Random) -> None:
    """Overwrite ``SCRIBBLE_BYTES`` random bytes somewhere in the data pages."""
    data = bytearray(path.read_bytes())
    footer = pq.read_metadata(path).serialized_size + TRAILER
    start = rng.randrange(4, len(data) - footer - SCRIBBLE_BYTES)
    data[start : start + SCRIBBLE_BYTES] = rng.randbytes(SCRIBBLE_BYTES)
    path.write_bytes(bytes(data))


def test_random_bytes_in_a_reward_part_are_an_error_never_changed_totals(
    scripted_run: Path, tmp_path: Path
) -> None:
    """Damage in a closed run's (zstd) pages fails polars' decoder: exit 2 naming the
    file; where it does not, the totals are unchanged (and ``verify`` finds it)."""
    code, clean, _ = _cli("rewards", "--json", str(scripted_run))
    assert code == 0
    errors = 0
    for trial in range(SCRIBBLE_TRIALS):
        run_dir = copy_run(scripted_run, tmp_path / f"scribbled{trial}")
        victim = _only_part(run_dir, "reward_computed")
        _scribble(victim, random.Random(trial))
        code, out, err = _cli("rewards", "--json", str(run_dir))
        if code == 0:
            assert out == clean, f"trial {trial}: totals changed"
            continue
        errors += 1
        assert code == 2, f"trial {trial}: rc {code}"
        assert err.startswith(f"error: corrupt Parquet data in {victim}"), err
        assert out == ""
    assert errors >= SCRIBBLE_TRIALS // 2


def test_verify_finds_random_bytes_in_any_page(scripted_run: Path, tmp_path: Path) -> None:
    """``esper analyze verify``: every page of every file read, checksums verified."""
    code, out, err = _cli("verify", str(scripted_run))
    assert code == 0, err
    for trial in range(SCRIBBLE_TRIALS // 3):
        run_dir = copy_run(scripted_run, tmp_path / f"scribbled{trial}")
        victim = _only_part(run_dir, random.Random(trial).choice(["env_step", "ppo_update"]))
        _scribble(victim, random.Random(trial))
        code, out, err = _cli("verify", "--json", str(run_dir))
        assert code == 2, f"trial {trial}: rc {code}"
        assert err.startswith(f"error: damaged pages in {victim}"), err
        damaged = [f for f in json.loads(out)["files"] if f["damage"]]
        assert [f["file"] for f in damaged] == [str(victim.relative_to(run_dir))]


def test_a_part_copied_from_another_run_is_an_error_naming_file_and_run(
    scripted_run: Path, tmp_path: Path
) -> None:
    other, _ = emit_run(tmp_path / "elsewhere", "other")
    run_dir = copy_run(scripted_run, tmp_path / "mixed")
    name = part_name(500, 600)
    shutil.copy(_only_part(other, "env_step"), run_dir / "events/type=env_step/rank=0" / name)
    code, out, err = _cli("counts", str(run_dir))
    assert code == 2 and out == ""
    assert f"events/type=env_step/rank=0/{name}" in err
    assert "holds run_id other" in err and "another run" in err


def test_a_part_copied_from_a_same_named_run_is_a_count_mismatch(
    scripted_run: Path, tmp_path: Path
) -> None:
    """Same run id, other events: caught by the manifest's per-type counts."""
    twin, _ = emit_run(tmp_path / "twin", "scripted", extra=(run_started(),))
    run_dir = copy_run(scripted_run, tmp_path / "scripted")
    name = part_name(500, 500)
    shutil.copy(_only_part(twin, "run_started"), run_dir / "events/type=run_started/rank=0" / name)
    code, _, err = _cli("counts", str(run_dir))
    assert code == 2
    assert "run_started: manifest counts 1, files hold" in err
    assert name in err


@pytest.mark.parametrize(
    ("name", "reason"),
    [("part-000500.parquet", "not a part file"), (part_name(10, 200), "seq range overlaps")],
    ids=["unranged-name", "overlapping-range"],
)
def test_a_stray_or_overlapping_part_is_an_error_naming_it(
    scripted_run: Path, tmp_path: Path, name: str, reason: str
) -> None:
    """A closed run's type directory holds its parts only; anything else a hive reader
    would read (a copy, an older layout's name) is damage, never deduplicated."""
    run_dir = copy_run(scripted_run, tmp_path / "dup")
    part = _only_part(run_dir, "action_taken")
    shutil.copy(part, part.with_name(name))
    code, out, err = _cli("counts", str(run_dir))
    assert code == 2 and out == ""
    assert name in err and reason in err


def test_a_deleted_part_of_a_finished_run_is_an_error(scripted_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(scripted_run, tmp_path / "lossy")
    expected = json.loads((run_dir / "manifest.json").read_text())["counts"]["ppo_update"]
    _only_part(run_dir, "ppo_update").unlink()
    code, _, err = _cli("ppo", str(run_dir))
    assert code == 2
    assert f"ppo_update: manifest counts {expected}, files hold 0" in err


def test_files_without_page_checksums_are_still_read(scripted_run: Path, tmp_path: Path) -> None:
    """Runs written before page checksums (rewritten here without them) read as before."""
    run_dir = copy_run(scripted_run, tmp_path / "old")
    for part in (run_dir / "events").rglob("*.parquet"):
        rewrite_part(part)  # pyarrow's default: no page checksums
    assert (
        event_counts(load_run(run_dir)).to_json() == event_counts(load_run(scripted_run)).to_json()
    )


def test_a_crashed_runs_unrecorded_tail_is_not_flagged(crashed: Crashed) -> None:
    """Events flushed after the manifest's last rewrite are what a crash leaves: no alarm."""
    run = load_run(crashed.path)
    assert run.degraded == []
    assert run.recovery is not None and run.recovery.events >= crashed.durable_events


def test_a_crashed_run_missing_events_is_a_flagged_degraded_read(
    crashed: Crashed, tmp_path: Path
) -> None:
    run_dir = copy_run(crashed.path, tmp_path / "crashed")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["counts"]["env_step"] += 1000
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match="degraded read .*env_step: manifest counts"):
        run = load_run(run_dir)
    assert run.degraded
    code, out, err = _cli("counts", "--json", str(run_dir))
    assert code == 0
    assert "warning: degraded read" in err
    assert json.loads(out)["run"]["degraded"] == run.degraded


def test_a_live_run_reads_clean_while_it_writes(tmp_path: Path) -> None:
    hub = open_run(tmp_path, "live", level=TelemetryLevel.NORMAL, flush_interval_s=60.0)
    try:
        hub.emit(run_started())
        hub.flush()
        assert load_run(tmp_path / "live").degraded == []
    finally:
        hub.close()
    assert load_run(tmp_path / "live").degraded == []


def _rename_in_footer(path: Path, old: bytes, new: bytes) -> None:
    """Flip footer bytes so that a column's name changes (the pages stay intact)."""
    data = bytearray(path.read_bytes())
    footer = len(data) - pq.read_metadata(path).serialized_size - TRAILER
    at = data.index(old, footer)
    data[at : at + len(old)] = new
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("event_type", "column", "command"),
    [("round_finished", b"wall_s", "throughput"), ("ppo_update", b"clip_frac", "ppo")],
)
def test_a_flipped_footer_byte_that_renames_a_column_is_an_error(
    scripted_run: Path, tmp_path: Path, event_type: str, column: bytes, command: str
) -> None:
    """Issue 48, case 6: the renamed column read as nulls (``—``) with exit 0."""
    run_dir = copy_run(scripted_run, tmp_path / "flipped")
    victim = _only_part(run_dir, event_type)
    _rename_in_footer(victim, column, column[:-1] + b"#")
    code, out, err = _cli(command, str(run_dir))
    assert code == 2 and out == "", err
    assert str(victim) in err and column.decode() in err
