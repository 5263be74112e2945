"""Run ids are safe directory names and runs stay inside the telemetry directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from esper.core.enums import TelemetryLevel
from esper.errors import UserError
from esper.telemetry.hub import open_run
from esper.telemetry.paths import parse_part, part_name, resolve_run_dir, validate_run_id

BAD_IDS = [
    "",
    ".",
    "..",
    "../escape",
    "a/../../b",
    "/etc",
    "a/b",
    "a\\b",
    ".hidden",
    "-dash-first",
    "sp ace",
    "x" * 129,
    "naïve",
    "nul\x00",
]


@pytest.mark.parametrize("run_id", BAD_IDS)
def test_bad_run_ids_are_rejected_naming_the_value(run_id: str, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="invalid run id") as info:
        validate_run_id(run_id)
    assert repr(run_id) in str(info.value)
    with pytest.raises(UserError):
        open_run(tmp_path, run_id, level=TelemetryLevel.NORMAL)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("run_id", ["a", "run-1", "2024.01.01_x", "A" * 128])
def test_good_run_ids(run_id: str, tmp_path: Path) -> None:
    assert validate_run_id(run_id) == run_id
    assert resolve_run_dir(tmp_path, run_id) == tmp_path.resolve() / run_id


def test_symlink_escape_is_rejected(tmp_path: Path) -> None:
    root, outside = tmp_path / "runs", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "evil")
    with pytest.raises(UserError, match="outside the telemetry directory"):
        open_run(root, "evil", level=TelemetryLevel.NORMAL)
    assert list(outside.iterdir()) == []


def test_part_names_round_trip() -> None:
    name = part_name(7, 1234567)
    assert name == "part-000000000007-000001234567.parquet"
    part = parse_part(Path(name))
    assert part is not None and (part.first, part.last) == (7, 1234567)
    assert parse_part(Path("part-000001.parquet")) is None  # schema 1-2 names: no range
    assert parse_part(Path(part_name(9, 8))) is None
    assert parse_part(Path(f".{name}.tmp")) is None
    assert parse_part(Path("part-1.parquet.bak")) is None
