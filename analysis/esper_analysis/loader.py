"""Load run directories as lazy polars frames per event type, tolerant of crashes.

A run directory is ``<run_id>/manifest.json`` plus
``<run_id>/events/type=<event_type>/rank=<r>/part-<n>.parquet`` (schema 1: ``<event_type>/``,
also read). Only Parquet *footers* are
read up front (row counts, schema version, ``seq`` statistics); data is scanned lazily.

Corrupt files: every footer is read at load time; every page a scan reads is read with
pyarrow's page checksum verification (:mod:`esper_analysis.parts`; files written
before page checksums are decoded only), and a damaged page is an error naming the file
(:func:`~esper_analysis.integrity.corrupt_data_errors`). In a run whose writer closed
cleanly (manifest status finished, failed or interrupted) an unreadable Parquet file is
an error that names the file, because silently analysing part of a finished run would
give wrong answers. In a run whose manifest still says ``running`` (killed, or still
live) unreadable files are skipped with a warning and listed in :attr:`Run.recovery`,
because reading what a crash left is the point there.

Foreign or missing events: the files are checked against the manifest (``run_id`` of
every file, per-type counts; :mod:`esper_analysis.manifest_check`): an error for a
cleanly closed run, a degraded read with a warning (:attr:`Run.degraded`) otherwise.

Parts a merge superseded (a crash between its rename and its deletes) are skipped by
the writer's own rule (:func:`esper.telemetry.liveness.superseded`). Events are unique
on ``(rank, seq)``: when the files of one type and rank still have overlapping ``seq``
ranges (files copied in by hand) or unknown ones, the scan deduplicates.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Final

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from esper.core.enums import RunStatus
from esper.telemetry.events import SCHEMA_VERSION
from esper.telemetry.liveness import manifest_status, superseded
from esper.telemetry.paths import event_type_of, list_parts, parse_part
from esper_analysis.errors import CorruptFileError, NewerSchemaError, RunNotFoundError
from esper_analysis.integrity import (
    DamagedPagesError,
    ForeignTableError,
    check_columns,
    corrupt_data_errors,
    footer_run_id,
    verify_pages,
)
from esper_analysis.manifest_check import check_run_integrity
from esper_analysis.parts import PartFile, scan_parts
from esper_analysis.recovery import Recovery, SkippedFile, as_int, recovery_of
from esper_analysis.schema import empty_frame, event_schema, known_event_types

MANIFEST_NAME: Final = "manifest.json"
#: Ranks other than 0 write ``manifest-rank<r>.json`` beside rank 0's manifest.
_RANK_MANIFEST = re.compile(r"^manifest-rank(\d+)\.json$")
EVENTS_DIR: Final = "events"
_RANK_DIR = re.compile(r"^rank=(\d+)$")
#: Parquet key-value metadata key of the schema version (written by the telemetry writer).
SCHEMA_VERSION_KEY: Final = b"esper.schema_version"
_CLOSED_STATUSES: Final = frozenset({RunStatus.FINISHED, RunStatus.FAILED, RunStatus.INTERRUPTED})
_DEDUP_KEY: Final = ("rank", "seq")
_INT_PHYSICAL: Final = frozenset({"INT32", "INT64"})
_KNOWN_TYPES: Final = frozenset(known_event_types())


@dataclass
class Run:
    """One run directory: manifest, part files per event type, lazy scans."""

    path: Path
    manifests: dict[int, dict[str, Any]]
    files: dict[str, list[PartFile]]
    skipped: list[SkippedFile] = field(default_factory=list)
    unknown_types: list[str] = field(default_factory=list)
    #: Why the read is degraded (files disagree with the manifest of an unclosed rank).
    degraded: list[str] = field(default_factory=list)
    #: Whether scans verify the page checksums of what they read.
    verify: bool = True

    @property
    def manifest(self) -> dict[str, Any]:
        """Rank 0's manifest (the run's own), or the lowest rank's when rank 0 has none."""
        if not self.manifests:
            return {}
        return self.manifests.get(0) or self.manifests[min(self.manifests)]

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.path.name)

    @property
    def config_hash(self) -> str:
        return str(self.manifest.get("config_hash") or "")

    @property
    def schema_version(self) -> int | None:
        """The newest schema version among the manifests and files (None if unrecorded)."""
        versions = [f.schema_version for fs in self.files.values() for f in fs]
        versions += [as_int(m.get("schema_version")) for m in self.manifests.values()]
        known = [v for v in versions if v is not None]
        return max(known) if known else None

    @property
    def event_types(self) -> tuple[str, ...]:
        """Event types with at least one row on disk, in catalogue order."""
        return tuple(t for t in known_event_types() if self.rows_on_disk(t) > 0)

    def rows_on_disk(self, event_type: str) -> int:
        """Rows in the footers (before deduplication); cheap, no data read."""
        return sum(f.rows for f in self.files.get(event_type, ()))

    def needs_dedup(self, event_type: str) -> bool:
        """Whether some files of this type may hold the same ``(rank, seq)``."""
        by_rank: dict[int, list[PartFile]] = {}
        for f in self.files.get(event_type, ()):
            by_rank.setdefault(f.rank, []).append(f)
        for parts in by_rank.values():
            if len(parts) < 2:
                continue
            if any(p.seq_min is None or p.seq_max is None for p in parts):
                return True
            spans = sorted((int(p.seq_min or 0), int(p.seq_max or 0)) for p in parts)
            if any(b[0] <= a[1] for a, b in itertools.pairwise(spans)):
                return True
        return False

    def scan(self, event_type: str) -> pl.LazyFrame:
        """All ranks of one event type, typed by the current catalogue (empty if none);
        its reads verify every page they touch (unless the run was loaded without)."""
        files = sorted(self.files.get(event_type, []), key=lambda f: f.rank)  # stable
        if not files:
            return empty_frame(event_type)
        lf = scan_parts(files, event_schema(event_type), verify=self.verify)
        if self.needs_dedup(event_type):
            lf = lf.unique(subset=list(_DEDUP_KEY), keep="first", maintain_order=True)
        return lf

    def count(self, event_type: str) -> int:
        """Number of distinct events of a type (footer sum unless dedup is needed)."""
        if not self.needs_dedup(event_type):
            return self.rows_on_disk(event_type)
        return int(self.scan(event_type).select(pl.len()).collect().item())

    def find_corrupt_files(self) -> list[SkippedFile]:
        """Files whose data pages fail to decode (footers were checked at load time).

        Reads every file in full, so it is only called after a scan failed, to name
        the culprit.
        """
        bad = []
        for parts in self.files.values():
            for part in parts:
                try:
                    verify_pages(part.path)
                except DamagedPagesError as exc:
                    bad.append(SkippedFile(str(part.path), str(exc)))
        return bad

    @cached_property
    def status(self) -> RunStatus:
        """finished / failed / interrupted / crashed (or running, while the producer lives).

        A rank whose manifest still says ``running`` with a dead producer makes the run
        crashed, even after its ``run_finished`` event (killed during its close: it can
        be closed by ``--continue-run``). Otherwise the ``run_finished`` event wins when
        present, except that a ``finished`` run whose writer then failed (at close: a
        manifest says ``failed``) is failed. Otherwise the manifests decide, the worst
        rank first; no manifest at all is a crash.
        """
        statuses = [manifest_status(m) for m in self.manifests.values()]
        if RunStatus.CRASHED in statuses:
            return RunStatus.CRASHED
        if self.rows_on_disk("run_finished"):
            with corrupt_data_errors(self):
                last = self.scan("run_finished").select(pl.col("status").last()).collect().item()
            parsed = _parse_status(last)
            if parsed is RunStatus.FINISHED and RunStatus.FAILED in statuses:
                return RunStatus.FAILED
            if parsed in _CLOSED_STATUSES:
                return parsed
        if not statuses or any(s in (None, RunStatus.CRASHED) for s in statuses):
            return RunStatus.CRASHED
        if RunStatus.RUNNING in statuses:
            return RunStatus.RUNNING
        for worst in (RunStatus.FAILED, RunStatus.INTERRUPTED):
            if worst in statuses:
                return worst
        return RunStatus.FINISHED

    @cached_property
    def recovery(self) -> Recovery | None:
        """For a crashed (or still running) run: files read, events, last seq per rank."""
        if self.status in _CLOSED_STATUSES:
            return None
        with corrupt_data_errors(self):
            return recovery_of(self)


def _parse_status(value: Any) -> RunStatus | None:
    try:
        return RunStatus(str(value).lower())
    except ValueError:
        return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(f"cannot read manifest {path}: {exc}") from None
    if not isinstance(data, dict):
        raise CorruptFileError(f"manifest {path} is not a JSON object")
    return data


def _read_manifests(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Every rank's manifest: ``manifest.json`` (rank 0) and ``manifest-rank<r>.json``."""
    manifests: dict[int, dict[str, Any]] = {}
    for path in sorted(run_dir.glob("manifest*.json")):
        match = _RANK_MANIFEST.match(path.name)
        if path.name != MANIFEST_NAME and match is None:
            continue
        data = _read_json(path)
        _check_version(as_int(data.get("schema_version")), path)
        rank = as_int(data.get("rank"))
        if rank is None:
            rank = int(match.group(1)) if match else 0
        manifests[rank] = data
    return manifests


def _file_version(meta: pq.FileMetaData) -> int | None:
    raw = (meta.metadata or {}).get(SCHEMA_VERSION_KEY)
    return None if raw is None else as_int(raw.decode("utf-8", "replace"))


def _seq_range(meta: pq.FileMetaData) -> tuple[int | None, int | None]:
    names = meta.schema.names
    if "seq" not in names or meta.num_row_groups == 0:
        return None, None
    col = names.index("seq")
    if meta.schema.column(col).physical_type not in _INT_PHYSICAL:
        return None, None  # a foreign file; its statistics are not sequence numbers
    lo: int | None = None
    hi: int | None = None
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(col).statistics
        if stats is None or not stats.has_min_max:
            return None, None
        lo = int(stats.min) if lo is None else min(lo, int(stats.min))
        hi = int(stats.max) if hi is None else max(hi, int(stats.max))
    return lo, hi


def _describe(path: Path, event_type: str, rank: int) -> PartFile:
    meta = pq.read_metadata(path)
    if event_type in _KNOWN_TYPES:
        check_columns(meta, event_type)
    part = parse_part(path)
    lo, hi = (part.first, part.last) if part and part.first is not None else _seq_range(meta)
    return PartFile(
        path=path,
        event_type=event_type,
        rank=rank,
        rows=meta.num_rows,
        schema_version=_file_version(meta),
        seq_min=lo,
        seq_max=hi,
        run_id=footer_run_id(meta),
        columns=tuple(meta.schema.to_arrow_schema().names),
    )


def _part_paths(type_dir: Path) -> Iterable[tuple[int, Path]]:
    """Every live part of one type directory, with its rank (a merge's superseded
    inputs skipped, :func:`esper.telemetry.liveness.superseded`)."""
    for rank_dir in sorted(p for p in type_dir.iterdir() if p.is_dir()):
        match = _RANK_DIR.match(rank_dir.name)
        if match is None:
            continue
        parts = list_parts(rank_dir)
        gone = superseded(parts)
        for part in parts:
            if part.path not in gone:
                yield int(match.group(1)), part.path


def _check_version(version: int | None, where: Path) -> None:
    if version is not None and version > SCHEMA_VERSION:
        raise NewerSchemaError(
            f"{where} was written with telemetry schema version {version}, newer than the "
            f"version this code reads ({SCHEMA_VERSION}); upgrade esper to analyse it"
        )


_Discovered = tuple[dict[str, list[PartFile]], list[SkippedFile], list[str]]


#: What describing one part file can raise that makes the file unreadable or foreign.
_UNREADABLE = (OSError, pa.ArrowException, ForeignTableError, UnicodeDecodeError)


def _discover(run_dir: Path, tolerant: bool) -> _Discovered:
    files: dict[str, list[PartFile]] = {}
    skipped: list[SkippedFile] = []
    unknown: list[str] = []
    events_dir = run_dir / EVENTS_DIR
    if not events_dir.is_dir():
        return files, skipped, unknown
    known = set(known_event_types())
    items = [
        (event_type_of(type_dir.name), rank, path)  # type=<t> (schema 2) or <t> (schema 1)
        for type_dir in sorted(p for p in events_dir.iterdir() if p.is_dir())
        for rank, path in _part_paths(type_dir)
    ]
    for event_type, rank, path in items:
        try:
            part = _describe(path, event_type, rank)
        except _UNREADABLE as exc:  # A scribbled footer can surface as bad UTF-8 too.
            if not tolerant:
                raise CorruptFileError(f"corrupt Parquet file {path}: {exc}") from None
            reason = f"unreadable Parquet ({exc})"
            warnings.warn(f"skipping {path}: {reason}", stacklevel=3)
            skipped.append(SkippedFile(str(path.relative_to(run_dir)), reason))
            continue
        _check_version(part.schema_version, path)
        if event_type not in known:
            if event_type not in unknown:
                unknown.append(event_type)
            continue
        files.setdefault(event_type, []).append(part)
    return files, skipped, unknown


def is_run_dir(path: Path) -> bool:
    return (path / MANIFEST_NAME).is_file() or (path / EVENTS_DIR).is_dir()


def load_run(path: str | os.PathLike[str], *, verify_pages: bool = True) -> Run:
    """Open one run directory (all ranks); raises a one-line error for user mistakes.

    Footers and manifests are checked here; pages when a scan reads them.
    ``verify_pages=False`` reads without checking page checksums (tools that poll a live
    run for a view: ``esper watch``, ``esper runs``).
    """
    run_dir = Path(path)
    if not run_dir.exists():
        raise RunNotFoundError(f"run directory {run_dir} does not exist")
    if not run_dir.is_dir() or not is_run_dir(run_dir):
        raise RunNotFoundError(
            f"{run_dir} is not a run directory (expected {MANIFEST_NAME} and {EVENTS_DIR}/)"
        )
    manifests = _read_manifests(run_dir)
    tolerant = not manifests or any(
        _parse_status(m.get("status")) not in _CLOSED_STATUSES for m in manifests.values()
    )
    files, skipped, unknown = _discover(run_dir, tolerant)
    if unknown:
        warnings.warn(
            f"{run_dir}: ignoring event types unknown to this catalogue: {', '.join(unknown)}",
            stacklevel=2,
        )
    run = Run(
        path=run_dir,
        manifests=manifests,
        files=files,
        skipped=skipped,
        unknown_types=unknown,
        verify=verify_pages,
    )
    run.degraded = check_run_integrity(run)
    for note in run.degraded:
        warnings.warn(note, stacklevel=2)
    return run


def load_runs(path: str | os.PathLike[str], *, verify_pages: bool = True) -> list[Run]:
    """Open every run directory directly under ``path`` (or ``path`` itself if it is one)."""
    root = Path(path)
    if not root.is_dir():
        raise RunNotFoundError(f"directory {root} does not exist")
    if is_run_dir(root):
        return [load_run(root, verify_pages=verify_pages)]
    runs = [
        load_run(p, verify_pages=verify_pages)
        for p in sorted(root.iterdir())
        if p.is_dir() and is_run_dir(p)
    ]
    if not runs:
        raise RunNotFoundError(f"no run directories under {root}")
    return runs


def scan_runs(runs: Sequence[Run], event_type: str) -> pl.LazyFrame:
    """One event type across many runs (rows keep their ``run_id``), for fleet queries."""
    if not runs:
        return empty_frame(event_type)
    return pl.concat([run.scan(event_type) for run in runs], how="vertical")
