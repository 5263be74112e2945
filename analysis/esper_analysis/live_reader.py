"""Incremental reader of a run directory for pollers (``esper watch``).

:func:`esper_analysis.loader.load_run` describes every part file on each call, which a
view refreshed every second cannot afford on a live run (dozens of parts per event
type between the writer's merges). This reader keeps, per part file, the few columns
the live view needs, and on each :meth:`RunReader.refresh` reads only the parts that
appeared since the last one. Parts are immutable once the writer renames them into
place, so a cached part never goes stale; a part that vanishes (merged) is forgotten,
and its rows come back with the merged file. While both are on disk the rows are
deduplicated on ``(rank, seq)``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Final

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from esper.core.enums import RunStatus
from esper.telemetry.paths import list_parts
from esper_analysis.errors import CorruptFileError, RunNotFoundError
from esper_analysis.loader import EVENTS_DIR, MANIFEST_NAME, Run, is_run_dir

#: Columns kept per event type: only what the live view shows.
COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "run_started": ("task", "policy_kind", "n_envs", "episode_length", "rounds"),
    "run_finished": ("status", "env_steps", "error"),
    "round_started": ("round",),
    "round_finished": ("round", "eps", "mean_episode_reward", "mean_final_accuracy"),
    "env_step": ("round", "step", "ts_ns"),
    "seed_germinated": ("round", "env", "seed_id"),
    "seed_stage_changed": ("round", "env", "seed_id", "to_stage"),
    "seed_fossilized": ("round", "env", "seed_id"),
    "seed_pruned": ("round", "env", "seed_id"),
    "governor_rollback": ("round", "env", "step", "reason", "loss", "threshold"),
    "anomaly_detected": ("round", "env", "kind", "detail"),
}
_KEY: Final = ("rank", "seq")
_RANK_DIR: Final = re.compile(r"^rank=(\d+)$")
_RANK_MANIFEST: Final = re.compile(r"^manifest(-rank\d+)?\.json$")
#: Directory names of the event types: ``<type>`` (schema 1) or ``type=<type>`` (hive).
_TYPE_PREFIX: Final = "type="
_CLOSED: Final = frozenset({RunStatus.FINISHED, RunStatus.FAILED, RunStatus.INTERRUPTED})


@dataclasses.dataclass(frozen=True)
class _Part:
    #: The view's rows of the part's event type.
    frames: dict[str, pl.DataFrame]


def _frame(table: pa.Table) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def _read_part(path: Path, event_type: str) -> dict[str, pl.DataFrame]:
    with pq.ParquetFile(path) as parquet:
        names = set(parquet.schema_arrow.names)
        columns = [c for c in (*_KEY, *COLUMNS[event_type]) if c in names]
        table = parquet.read(columns=columns)
    return {event_type: _frame(table)}


class RunReader:
    """The live view's columns of one run directory, read incrementally."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._parts: dict[Path, _Part] = {}
        #: Part files that could not be read (relative path, reason).
        self.skipped: dict[str, str] = {}

    def _listing(self) -> dict[Path, str]:
        listed: dict[Path, str] = {}
        events = self.path / EVENTS_DIR
        type_dirs = sorted(events.iterdir()) if events.is_dir() else []
        for type_dir in type_dirs:
            event_type = type_dir.name.removeprefix(_TYPE_PREFIX)
            if event_type not in COLUMNS or not type_dir.is_dir():
                continue
            for rank_dir in sorted(type_dir.iterdir()):
                if _RANK_DIR.match(rank_dir.name) is None or not rank_dir.is_dir():
                    continue
                for part in list_parts(rank_dir):
                    listed[part.path] = event_type
        return listed

    def refresh(self) -> None:
        """Read the parts that appeared since the last call; forget the ones that vanished."""
        if not self.path.is_dir() or not is_run_dir(self.path):
            raise RunNotFoundError(f"{self.path} is not a run directory")
        listed = self._listing()
        for gone in set(self._parts) - set(listed):
            del self._parts[gone]
        for path, event_type in listed.items():
            if path in self._parts:
                continue
            try:
                frames = _read_part(path, event_type)
            except FileNotFoundError:
                continue  # merged since the listing; its rows are in the merged file
            except (OSError, pa.ArrowException) as exc:
                self.skipped[str(path.relative_to(self.path))] = str(exc)
                frames = {}
            self._parts[path] = _Part(frames)

    def frame(self, event_type: str) -> pl.DataFrame:
        """All rows of one type read so far, unique on ``(rank, seq)``, in ``seq`` order."""
        frames = [
            frame
            for p in self._parts.values()
            if (frame := p.frames.get(event_type)) is not None and frame.height
        ]
        if not frames:
            return pl.DataFrame(schema={c: pl.Int64 for c in _KEY})
        out = pl.concat(frames, how="diagonal_relaxed")
        return out.unique(subset=list(_KEY), keep="first").sort(*_KEY)

    def manifests(self) -> dict[int, dict[str, Any]]:
        """Every rank's manifest (written atomically by the writer, so never half-read)."""
        out: dict[int, dict[str, Any]] = {}
        for path in sorted(self.path.glob("manifest*.json")):
            match = _RANK_MANIFEST.match(path.name)
            if match is None:
                continue
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise CorruptFileError(f"cannot read manifest {path}: {exc}") from None
            rank = 0 if path.name == MANIFEST_NAME else int(match.group(1)[len("-rank") :])
            if isinstance(data, dict):
                out[rank] = data
        return out

    def status(self, manifests: dict[int, dict[str, Any]]) -> RunStatus:
        """``run_finished`` decides when present; else the manifests, as the loader does."""
        finished = self.frame("run_finished")
        if "status" in finished.columns and finished.height:
            try:
                status = RunStatus(str(finished["status"][-1]).lower())
            except ValueError:
                status = None
            if status in _CLOSED:
                return status
        return Run(path=self.path, manifests=manifests, files={}).status
