"""Preparing a run directory for a new run, or for resuming an existing one.

A resumed run restarts ``seq`` at the checkpoint's position (``start_seq``). Events the
dead session wrote from that position on are re-emitted by the resumed one, so they are
cut first; then each type's parts become one merged (zstd) file, and ``seq`` continues
without gaps or duplicates across both sessions. Both steps are crash-safe by the
superseded-part rule (:mod:`esper.telemetry.liveness`): a cut writes a part inside its
input's range (if the input survives a crash, it wins and the next resume cuts again),
a merge writes a part around its inputs' ranges (if they survive, it wins).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from esper.core.enums import RunStatus
from esper.errors import UserError
from esper.telemetry.arrow_schema import event_schema
from esper.telemetry.events import EVENT_TYPES, SCHEMA_VERSION
from esper.telemetry.liveness import superseded
from esper.telemetry.lock import RunLockedError, run_lock_owner
from esper.telemetry.manifest import (
    Manifest,
    ResumeRecord,
    effective_status,
    read_manifest,
    write_manifest,
)
from esper.telemetry.paths import (
    TMP_PREFIX,
    TMP_SUFFIX,
    Part,
    list_parts,
    manifest_path,
    part_name,
    type_rank_dir,
)
from esper.telemetry.sink import PartSink, read_verified


def check_new_run_dir(
    run_dir: Path, *, run_id: str, rank: int = 0, checkpoint: Path | None = None
) -> bool:
    """Refuse, before any expensive work, a run directory a new run cannot use.

    Called by the trainer before it loads data, so a reused run id or an unwritable
    telemetry directory is reported in a second rather than after the dataset is read.
    A run another live process writes is refused naming that process. Returns True
    when the id holds a run that stopped before it completed a round (no ``checkpoint``
    file, no finished episode, not finished): the new run replaces it, since nothing
    complete is lost (``open_run(..., replace=True)``).
    """
    owner = run_lock_owner(run_dir, rank=rank)
    if owner is not None:
        raise RunLockedError(
            f"run {run_id!r} (rank {rank}) in {run_dir} is being written by {owner}; "
            "choose another run id"
        )
    if checkpoint is not None and has_telemetry(run_dir, rank):
        if not checkpoint.exists() and _never_completed(run_dir, rank):
            return True
        if checkpoint.exists():
            raise UserError(
                f"run {run_id!r} already has telemetry for rank {rank} in {run_dir}; choose "
                f"another run id (--run-id), or continue it with --resume {checkpoint} "
                "--continue-run"
            )
    _check_unused(run_dir, run_id=run_id, rank=rank)
    return False


def _never_completed(run_dir: Path, rank: int) -> bool:
    """Whether the rank's telemetry shows a run that completed no round and did not
    finish (its manifest readable)."""
    try:
        manifest = read_manifest(manifest_path(run_dir, rank))
    except (OSError, ValueError):
        return False
    return (
        effective_status(manifest) is not RunStatus.FINISHED
        and manifest.counts.get("episode_finished", 0) == 0
    )


def check_resumable(run_dir: Path, *, run_id: str, rank: int) -> RunStatus:
    """The status of the run a resume would continue, or a :class:`UserError` saying why
    it cannot be (no manifest, another schema version, another run's manifest, a live
    writer); nothing is changed."""
    manifest = _resumable_manifest(run_dir, run_id=run_id, rank=rank)
    owner = run_lock_owner(run_dir, rank=rank)
    if owner is not None:
        raise RunLockedError(
            f"run {run_id!r} (rank {rank}) in {run_dir} is being written by {owner}; wait "
            "for it to finish or stop it first"
        )
    return effective_status(manifest)


def _resumable_manifest(run_dir: Path, *, run_id: str, rank: int) -> Manifest:
    path = manifest_path(run_dir, rank)
    if not path.is_file():
        raise UserError(f"cannot resume: no telemetry manifest at {path}")
    manifest = read_manifest(path)
    if manifest.schema_version != SCHEMA_VERSION:
        raise UserError(
            f"cannot resume {run_dir}: it was written with telemetry schema "
            f"v{manifest.schema_version}, this build writes v{SCHEMA_VERSION}"
        )
    if manifest.run_id != run_id:
        raise UserError(
            f"cannot resume {run_dir}: its manifest {path.name} belongs to run "
            f"{manifest.run_id!r}, not {run_id!r} (the checkpoint's run); nothing was changed"
        )
    return manifest


def has_telemetry(run_dir: Path, rank: int) -> bool:
    """Whether ``rank`` of the run already wrote a manifest or a part."""
    return manifest_path(run_dir, rank).exists() or any(
        list_parts(type_rank_dir(run_dir, tag, rank)) for tag in EVENT_TYPES
    )


def _check_unused(run_dir: Path, *, run_id: str, rank: int) -> None:
    """No telemetry of this rank yet, and the directory can be created."""
    if has_telemetry(run_dir, rank):
        raise UserError(
            f"run {run_id!r} already has telemetry for rank {rank} in {run_dir}; choose "
            "another run id (--run-id)"
        )
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())  # "/" exists
    if not existing.is_dir():
        raise UserError(f"cannot create the run directory {run_dir}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot create the run directory {run_dir}: {existing} is not writable")


def prepare_new(run_dir: Path, manifest: Manifest, *, replace: bool = False) -> None:
    """Create the run directory; refuse to mix a new run into an existing one.

    ``replace``: first discard this rank's telemetry (a restart of a run that never
    completed a round: the caller checked that nothing complete is lost). The caller
    holds the run's writer lock (:func:`esper.telemetry.hub.open_run`).
    """
    if replace:
        for tag in EVENT_TYPES:
            for part in list_parts(type_rank_dir(run_dir, tag, manifest.rank)):
                part.path.unlink()
        manifest_path(run_dir, manifest.rank).unlink(missing_ok=True)
    _check_unused(run_dir, run_id=manifest.run_id, rank=manifest.rank)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_manifest(manifest_path(run_dir, manifest.rank), manifest)
    except OSError as exc:
        raise UserError(f"cannot create the run directory {run_dir}: {exc}") from None


def prepare_resume(
    run_dir: Path,
    *,
    run_id: str,
    rank: int,
    start_seq: int,
    level: str,
    flush_interval_s: float,
    config_hash: str,
    sink: PartSink,
) -> Manifest:
    """Load the run's manifest, settle what a crash left, cut at ``start_seq``, merge.

    The caller holds the run's writer lock (:func:`esper.telemetry.hub.open_run`).
    """
    path = manifest_path(run_dir, rank)
    manifest = _resumable_manifest(run_dir, run_id=run_id, rank=rank)
    # Owned by this process from here on: a crash while the tail is cut (its counts
    # are stale until it is done) reads as a crashed run, not as a closed one.
    manifest.status = RunStatus.RUNNING.value
    manifest.pid = os.getpid()
    manifest.hostname = socket.gethostname()
    write_manifest(path, manifest)
    truncated = 0
    counts: dict[str, int] = {}
    kept: list[Path] = []
    for tag in EVENT_TYPES:
        cut, rows, files = _resume_type(type_rank_dir(run_dir, tag, rank), tag, start_seq, sink)
        truncated += cut
        kept += files
        if rows:
            counts[tag] = rows
    manifest.counts = counts
    manifest.resumes.append(
        ResumeRecord(
            start_seq=start_seq,
            at_ns=time.time_ns(),
            pid=os.getpid(),
            events_truncated=truncated,
            config_hash=config_hash,
        )
    )
    manifest.error = ""
    manifest.finished_ns = 0
    manifest.level = level
    manifest.flush_interval_s = flush_interval_s
    manifest.last_seq = start_seq - 1
    write_manifest(path, manifest)
    sink.sync([*kept, path], ())  # the checkpoint resumed from points into these files
    return manifest


def _resume_type(
    directory: Path, tag: str, start_seq: int, sink: PartSink
) -> tuple[int, int, list[Path]]:
    """One type of one rank: drop leftovers, cut at ``start_seq``, merge into one file.
    Returns (events cut, events kept, the files that keep them)."""
    if directory.is_dir():
        for stale in directory.glob(f"{TMP_PREFIX}*{TMP_SUFFIX}"):  # a killed write's
            stale.unlink(missing_ok=True)
    parts = list_parts(directory)
    gone = superseded(parts)
    for part in parts:
        if part.path in gone:
            sink.remove(part.path)
    parts = [p for p in parts if p.path not in gone and p.first is not None]
    schema = event_schema(EVENT_TYPES[tag])
    kept: list[Part] = []
    cut = 0
    for part in parts:
        assert part.first is not None and part.last is not None
        if part.last < start_seq:
            kept.append(part)
            continue
        table = pq.read_table(part.path, schema=schema, page_checksum_verification=True)
        rest = table.filter(pc.less(table.column("seq"), start_seq))
        cut += table.num_rows - rest.num_rows
        if rest.num_rows:
            end = int(pc.max(rest.column("seq")).as_py())
            output = directory / part_name(part.first, end)
            sink.write_merged([rest], schema, output)
            kept.append(Part(output, part.first, end))
        sink.remove(part.path)
    if len(kept) > 1 or (kept and not _is_merged(kept[0].path)):
        first, last = kept[0].first, kept[-1].last
        assert first is not None and last is not None
        output = directory / part_name(first, last)
        tables = (t for p in kept for t in read_verified(p.path, schema))
        sink.write_merged(tables, schema, output)
        for part in kept:
            if part.path != output:
                sink.remove(part.path)
        kept = [Part(output, first, last)]
    return cut, sum(pq.read_metadata(p.path).num_rows for p in kept), [p.path for p in kept]


def _is_merged(path: Path) -> bool:
    """Whether a file is a merged one (zstd), not a flush's part."""
    meta = pq.read_metadata(path)
    return meta.num_row_groups > 0 and str(meta.row_group(0).column(0).compression) == "ZSTD"
