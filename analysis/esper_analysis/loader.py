"""Load run directories as lazy polars frames per event type: the one reader of runs.

A run directory is read with the writer's own rules: the manifests by
:func:`esper.telemetry.manifest.read_manifests`, the status by
:func:`esper.telemetry.manifest.effective_status`, the files by
:func:`esper.telemetry.paths.list_parts` (``events/type=<t>/rank=<r>/``, superseded
parts skipped). Footers are read up front (rows, columns, run ids, schema version), each
once while its file is unchanged (:func:`_footer` caches them by path, size and mtime:
``esper watch`` reloads a live run every second and reads only its new files). Data is
scanned lazily by polars' own Parquet reader, typed by the catalogue.

Damage is never read silently. A file whose footer cannot be read, whose columns are
not its type's (a file of the current schema version lacking a column is damaged, not
older), a stray ``*.parquet`` that is no part, or parts with overlapping ``seq`` ranges:
in a run whose writer closed cleanly (manifest finished, failed or interrupted) an
error naming the file; in a run that did not close (killed, or live) skipped with a
warning and listed in :attr:`Run.recovery`, since reading what a crash left is the
point there. The files are checked against the manifests
(:mod:`esper_analysis.manifest_check`). Page checksums are verified where the data is
merged (the writer's close) and by ``esper analyze verify``
(:func:`esper_analysis.integrity.verify_run`); a scan that fails on damaged pages names
the file (:func:`~esper_analysis.integrity.corrupt_data_errors`).

A live run's writer merges parts as it runs: a file listed here may be gone when a
scan opens it. The scan then fails naming the run as changed; read again.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Final

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from esper.core.enums import RunStatus
from esper.telemetry.arrow_schema import META_SCHEMA_VERSION, event_schema
from esper.telemetry.events import EVENT_TYPES, SCHEMA_VERSION
from esper.telemetry.manifest import Manifest, ManifestError, effective_status, read_manifests
from esper.telemetry.paths import (
    EVENTS_DIR,
    MANIFEST_NAME,
    Part,
    list_parts,
    manifest_path,
    type_rank_dirs,
)
from esper_analysis.errors import CorruptFileError, NewerSchemaError, RunNotFoundError
from esper_analysis.integrity import corrupt_data_errors
from esper_analysis.manifest_check import check_run_integrity
from esper_analysis.recovery import Recovery, SkippedFile, recovery_of
from esper_analysis.schema import ENVELOPE, empty_frame, polars_schema

#: The oldest schema version read: 3 named parts by their seq range.
OLDEST_SCHEMA_VERSION: Final = 3
_CLOSED: Final = frozenset({RunStatus.FINISHED, RunStatus.FAILED, RunStatus.INTERRUPTED})
#: Footers kept by :func:`_footer` (a day-long live run has about 2,000 files).
FOOTER_CACHE: Final = 8192
#: Listings of a directory tried when a listed file is merged away before its footer
#: is read (a live run).
LIST_ATTEMPTS: Final = 5


@dataclass(frozen=True)
class PartFile:
    """One part file of a run, from its name and footer (no data read)."""

    path: Path
    event_type: str
    rank: int
    rows: int
    #: Its ``seq`` range (from the name).
    first: int
    last: int
    #: The run ids its rows carry.
    run_ids: frozenset[str]
    columns: tuple[str, ...] = field(default=(), compare=False)

    def name_in(self, run_dir: Path) -> str:
        """How messages name this part: relative to the run directory."""
        try:
            return self.path.relative_to(run_dir).as_posix()
        except ValueError:
            return str(self.path)


@dataclass(frozen=True)
class _Footer:
    rows: int
    version: int | None
    run_ids: frozenset[str]
    columns: tuple[str, ...]
    #: Why the file is not a table of its type (None: it is one).
    problem: str | None


@dataclass
class Run:
    """One run directory: manifests, part files per event type, lazy scans."""

    path: Path
    manifests: dict[int, Manifest]
    files: dict[str, list[PartFile]]
    skipped: list[SkippedFile] = field(default_factory=list)
    unknown_types: list[str] = field(default_factory=list)
    #: Why the read is degraded (files disagree with the manifest of an unclosed rank).
    degraded: list[str] = field(default_factory=list)

    @property
    def manifest(self) -> Manifest | None:
        """Rank 0's manifest (the run's own), or the lowest rank's when rank 0 has none."""
        return self.manifests[min(self.manifests)] if self.manifests else None

    @property
    def run_id(self) -> str:
        return self.manifest.run_id if self.manifest else self.path.name

    @property
    def config_hash(self) -> str:
        return self.manifest.config_hash if self.manifest else ""

    @property
    def schema_version(self) -> int | None:
        """The newest schema version of the manifests (None without one)."""
        return max((m.schema_version for m in self.manifests.values()), default=None)

    @property
    def event_types(self) -> tuple[str, ...]:
        """Event types with at least one row on disk, in catalogue order."""
        return tuple(t for t in EVENT_TYPES if self.rows_on_disk(t) > 0)

    def rows_on_disk(self, event_type: str) -> int:
        """Events of a type (footer row counts: no data read)."""
        return sum(f.rows for f in self.files.get(event_type, ()))

    def scan(self, event_type: str, *, since: Mapping[int, int] | None = None) -> pl.LazyFrame:
        """All ranks of one event type, typed by the current catalogue (empty if none);
        columns an older schema version lacks are null. ``since`` (rank -> seq): files
        that end before it are not read (a live view reads the newest files only)."""
        files = [
            f for f in self.files.get(event_type, ()) if since is None or f.last >= since[f.rank]
        ]
        if not files:
            return empty_frame(event_type)
        return pl.scan_parquet(
            [f.path for f in sorted(files, key=lambda f: (f.rank, f.first))],
            schema=polars_schema(event_type),
            missing_columns="insert",
            extra_columns="ignore",
            hive_partitioning=False,
            glob=False,
        )

    def scan_envelopes(self, columns: Sequence[str]) -> pl.LazyFrame:
        """Envelope ``columns`` of every event of every type, with the ``type`` column of
        the hive layout: one scan for queries across types (counts, recovery)."""
        paths = [f.path for files in self.files.values() for f in files]
        schema = pl.Schema({c: ENVELOPE[c] for c in columns})
        if not paths:
            return pl.LazyFrame(schema={**schema, "type": pl.String})
        return pl.scan_parquet(
            paths,
            schema=schema,
            extra_columns="ignore",
            hive_partitioning=True,
            hive_schema={"type": pl.String, "rank": pl.Int64},
            glob=False,
        ).select(*columns, "type")

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
        statuses = [effective_status(m) for m in self.manifests.values()]
        if RunStatus.CRASHED in statuses:
            return RunStatus.CRASHED
        if self.rows_on_disk("run_finished"):
            with corrupt_data_errors(self):
                last = self.scan("run_finished").select(pl.col("status").last()).collect().item()
            parsed = next((s for s in _CLOSED if s.value == str(last).lower()), None)
            if parsed is RunStatus.FINISHED and RunStatus.FAILED in statuses:
                return RunStatus.FAILED
            if parsed is not None:
                return parsed
        if not statuses:
            return RunStatus.CRASHED
        if RunStatus.RUNNING in statuses:
            return RunStatus.RUNNING
        return next(
            (s for s in (RunStatus.FAILED, RunStatus.INTERRUPTED) if s in statuses),
            RunStatus.FINISHED,
        )

    @cached_property
    def recovery(self) -> Recovery | None:
        """For a crashed (or still running) run: files read, events, last seq per rank."""
        if self.status in _CLOSED:
            return None
        with corrupt_data_errors(self):
            return recovery_of(self)


@functools.lru_cache(maxsize=FOOTER_CACHE)
def _footer(path: Path, stamp: tuple[int, int, int], event_type: str, run_version: int) -> _Footer:
    """A part's footer facts, checked against its type (``stamp``: the file's inode, size
    and mtime, so a file replaced under the same name is read again). The run ids come
    from the statistics where the writer kept them (merged files), else from the
    ``run_id`` column; the version from the file's metadata, else its run's."""
    meta = pq.read_metadata(path)
    raw = (meta.metadata or {}).get(META_SCHEMA_VERSION)
    version = int(raw) if raw is not None and raw.isdigit() else run_version
    _check_version(version, path)
    schema = meta.schema.to_arrow_schema()
    problem = _columns_problem(schema, event_type, version >= SCHEMA_VERSION)
    ids = _statistics_run_id(meta)
    if ids is None and meta.num_rows and problem is None:
        column = pq.read_table(path, columns=["run_id"]).column("run_id")
        ids = frozenset(str(v) for v in pc.unique(column).to_pylist())
    return _Footer(meta.num_rows, version, ids or frozenset(), tuple(schema.names), problem)


def _statistics_run_id(meta: pq.FileMetaData) -> frozenset[str] | None:
    """The one run id every row group's statistics prove (no nulls), else None."""
    names = meta.schema.names
    if "run_id" not in names or meta.num_row_groups == 0:
        return None
    col = names.index("run_id")
    found: set[object] = set()
    for group in range(meta.num_row_groups):
        stats = meta.row_group(group).column(col).statistics
        if stats is None or not stats.has_min_max or stats.null_count != 0:
            return None
        found.update((stats.min, stats.max))
    only = found.pop() if len(found) == 1 else None
    return frozenset({only}) if isinstance(only, str) else None


def _columns_problem(schema: pa.Schema, event_type: str, current: bool) -> str | None:
    """Why a file is not a table of ``event_type`` (None if it is): every column of the
    type with its type, none other; an older schema version's file may lack some."""
    expected = event_schema(EVENT_TYPES[event_type])
    if current and not schema.equals(expected, check_metadata=False):
        missing = [n for n in expected.names if n not in schema.names]
        if missing:
            return f"it lacks column(s) {', '.join(missing)} of {event_type}"
    for f in schema:
        index = expected.get_field_index(f.name)
        if index < 0 and current:
            return f"column {f.name} is not one of {event_type}"
        if index >= 0 and not f.type.equals(expected.field(index).type):
            return f"column {f.name} is {f.type}, not {expected.field(index).type}"
    if "seq" not in schema.names:
        return f"no seq column: not a {event_type} table"
    return None


class _Damage(Exception):
    """A file the reader will not read; the message says why."""


def _describe(part: Part, event_type: str, rank: int, run_version: int) -> PartFile:
    """A live part from its footer; :class:`_Damage` if it is none. FileNotFoundError
    (merged away since the listing) propagates: the directory is listed again."""
    try:
        st = os.stat(part.path)
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        footer = _footer(part.path, stamp, event_type, run_version)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException, UnicodeDecodeError, ValueError) as exc:
        raise _Damage(f"unreadable Parquet ({exc})") from None
    if footer.problem:
        raise _Damage(footer.problem)
    return PartFile(
        path=part.path,
        event_type=event_type,
        rank=rank,
        rows=footer.rows,
        first=part.first,
        last=part.last,
        run_ids=footer.run_ids,
        columns=footer.columns,
    )


def _read_dir(
    directory: Path, event_type: str, rank: int, version: int
) -> tuple[list[PartFile], list[tuple[Path, str]]]:
    """One ``type=<t>/rank=<r>`` directory's parts, and its damaged files with why."""
    for _ in range(LIST_ATTEMPTS):
        live, _, strays = list_parts(directory)
        damage = [(p, "not a part file (part-<first seq>-<last seq>.parquet)") for p in strays]
        files: list[PartFile] = []
        try:
            for part in live:
                if files and part.first <= files[-1].last:
                    damage.append((part.path, f"its seq range overlaps {files[-1].path.name}"))
                    continue
                try:
                    files.append(_describe(part, event_type, rank, version))
                except _Damage as exc:
                    damage.append((part.path, str(exc)))
        except FileNotFoundError:
            continue  # merged away since the listing: list again
        return files, damage
    raise CorruptFileError(f"{directory} changed on every read (a live run's merges): read again")


def _check_version(version: int | None, where: Path) -> None:
    if version is not None and version > SCHEMA_VERSION:
        raise NewerSchemaError(
            f"{where} was written with telemetry schema version {version}, newer than the "
            f"version this code reads ({SCHEMA_VERSION}); upgrade esper to analyse it"
        )
    if version is not None and version < OLDEST_SCHEMA_VERSION:
        raise CorruptFileError(
            f"{where} was written with telemetry schema version {version}; this version "
            f"reads {OLDEST_SCHEMA_VERSION}-{SCHEMA_VERSION} (parts named by seq range)"
        )


@dataclass
class _Discovery:
    files: dict[str, list[PartFile]] = field(default_factory=dict)
    skipped: list[SkippedFile] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def _discover(run_dir: Path, manifests: dict[int, Manifest], tolerant: bool) -> _Discovery:
    found = _Discovery()
    for event_type, rank, directory in type_rank_dirs(run_dir):
        if event_type not in EVENT_TYPES:
            if event_type not in found.unknown:
                found.unknown.append(event_type)
            continue
        manifest = manifests.get(rank)
        version = manifest.schema_version if manifest else SCHEMA_VERSION
        files, damage = _read_dir(directory, event_type, rank, version)
        for path, reason in damage:
            if not tolerant:
                raise CorruptFileError(f"corrupt Parquet file {path}: {reason}")
            warnings.warn(f"skipping {path}: {reason}", stacklevel=3)
            found.skipped.append(SkippedFile(path.relative_to(run_dir).as_posix(), reason))
        if files:
            found.files.setdefault(event_type, []).extend(files)
    return found


def is_run_dir(path: Path) -> bool:
    return (path / MANIFEST_NAME).is_file() or (path / EVENTS_DIR).is_dir()


def load_run(path: str | os.PathLike[str]) -> Run:
    """Open one run directory (all ranks); raises a one-line error for user mistakes.

    Manifests, footers and the files' agreement with the manifests are checked here;
    data pages when a scan reads them.
    """
    run_dir = Path(path)
    if not run_dir.exists():
        raise RunNotFoundError(f"run directory {run_dir} does not exist")
    if not run_dir.is_dir() or not is_run_dir(run_dir):
        raise RunNotFoundError(
            f"{run_dir} is not a run directory (expected {MANIFEST_NAME} and {EVENTS_DIR}/)"
        )
    try:
        manifests = read_manifests(run_dir)
    except ManifestError as exc:
        raise CorruptFileError(str(exc)) from None
    for rank, manifest in manifests.items():
        _check_version(manifest.schema_version, manifest_path(run_dir, rank))
    tolerant = not manifests or any(effective_status(m) not in _CLOSED for m in manifests.values())
    found = _discover(run_dir, manifests, tolerant)
    if found.unknown:
        warnings.warn(
            f"{run_dir}: ignoring event types unknown to this catalogue: "
            f"{', '.join(found.unknown)}",
            stacklevel=2,
        )
    run = Run(run_dir, manifests, found.files, found.skipped, found.unknown)
    run.degraded = check_run_integrity(run)
    for note in run.degraded:
        warnings.warn(note, stacklevel=2)
    return run


def load_runs(path: str | os.PathLike[str]) -> list[Run]:
    """Open every run directory directly under ``path`` (or ``path`` itself if it is one)."""
    root = Path(path)
    if not root.is_dir():
        raise RunNotFoundError(f"directory {root} does not exist")
    if is_run_dir(root):
        return [load_run(root)]
    runs = [load_run(p) for p in sorted(root.iterdir()) if p.is_dir() and is_run_dir(p)]
    if not runs:
        raise RunNotFoundError(f"no run directories under {root}")
    return runs


def scan_runs(runs: Sequence[Run], event_type: str) -> pl.LazyFrame:
    """One event type across many runs (rows keep their ``run_id``), for fleet queries."""
    if not runs:
        return empty_frame(event_type)
    return pl.concat([run.scan(event_type) for run in runs], how="vertical")
