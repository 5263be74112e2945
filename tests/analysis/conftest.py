"""Run directories with known answers, built once per session through the real writer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _analysis_support import Script, emit_run

PRODUCER = Path(__file__).with_name("_analysis_producer.py")
OLD_SCHEMA_VERSION = 3
#: Columns an "older schema" lacks, per event type (see the older_run fixture).
OLD_SCHEMA_DROPS = {
    "reward_computed": ["alpha_shock"],
    "episode_finished": ["rollback_penalty"],
    "ppo_update": ["ratio_max"],
}


@dataclass(frozen=True)
class Crashed:
    path: Path
    durable_events: int


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def scripted(runs_root: Path) -> tuple[Path, Script]:
    return emit_run(runs_root, "scripted")


@pytest.fixture(scope="session")
def scripted_run(scripted: tuple[Path, Script]) -> Path:
    return scripted[0]


@pytest.fixture(scope="session")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Crashed:
    root = tmp_path_factory.mktemp("crash")
    proc = subprocess.run(
        [sys.executable, str(PRODUCER), str(root), "crashed"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr
    return Crashed(root / "crashed", int(proc.stdout.strip()))


def rewrite_part(path: Path, *, drop: list[str] = (), version: int | None = None) -> None:  # type: ignore[assignment]
    """Rewrite one Parquet part without some columns and/or with another schema version."""
    table = pq.read_table(path)
    table = table.drop_columns([c for c in drop if c in table.column_names])
    meta = dict(table.schema.metadata or {})
    if version is not None:
        meta[b"esper.schema_version"] = str(version).encode()
    pq.write_table(table.replace_schema_metadata(meta), path, compression="zstd")


def copy_run(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


@pytest.fixture(scope="session")
def older_run(scripted_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripted run as an older schema version would have written it."""
    run = copy_run(scripted_run, tmp_path_factory.mktemp("older") / "older")
    for part in (run / "events").rglob("*.parquet"):
        event_type = part.parent.parent.name.removeprefix("type=")
        rewrite_part(part, drop=OLD_SCHEMA_DROPS.get(event_type, []), version=OLD_SCHEMA_VERSION)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["schema_version"] = OLD_SCHEMA_VERSION
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run
