"""Preparing a run directory for a new run, or for resuming an existing one.

A resumed run restarts ``seq`` at the checkpoint's position (``start_seq``). Events the
dead process wrote after that position are re-emitted by the resumed run, so they are
cut from the old tail first (with the crash-safe rewrite of
:mod:`esper.telemetry.compaction`); ``seq`` then stays strictly increasing without
duplicates across both sessions. Part numbers continue after the highest existing one.

A dead writer's journal (:mod:`esper.telemetry.journal`) is converted first: its events
that no typed part holds and that precede ``start_seq`` become typed parts, then the
journal parts are deleted. A crash in between is repaired by the next resume the same
way (the events already converted are recognised by their ``seq``).
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
from esper.telemetry.arrow_schema import event_schema, events_to_table
from esper.telemetry.compaction import (
    live_parts,
    recover_pending,
    remove_stale_tmp,
    truncate_from_seq,
)
from esper.telemetry.events import EVENT_TYPES, SCHEMA_VERSION
from esper.telemetry.journal import (
    journal_parts,
    journal_rank_dir,
    read_journal,
    unconverted,
)
from esper.telemetry.lock import RunLockedError, run_lock_owner
from esper.telemetry.manifest import Manifest, ResumeRecord, read_manifest, write_manifest
from esper.telemetry.paths import (
    event_type_of,
    list_parts,
    manifest_path,
    part_name,
    type_rank_dir,
)
from esper.telemetry.sink import PartSink


def check_new_run_dir(run_dir: Path, *, run_id: str, rank: int = 0) -> None:
    """Refuse, before any expensive work, a run directory a new run cannot use.

    Called by the trainer before it loads data, so a reused run id or an unwritable
    telemetry directory is reported in a second rather than after the dataset is read.
    A run another live process writes is refused naming that process.
    """
    owner = run_lock_owner(run_dir, rank=rank)
    if owner is not None:
        raise RunLockedError(
            f"run {run_id!r} (rank {rank}) in {run_dir} is being written by {owner}; "
            "choose another run id"
        )
    _check_unused(run_dir, run_id=run_id, rank=rank)


def _check_unused(run_dir: Path, *, run_id: str, rank: int) -> None:
    """No telemetry of this rank yet, and the directory can be created."""
    if (
        manifest_path(run_dir, rank).exists()
        or any(list_parts(type_rank_dir(run_dir, tag, rank)) for tag in EVENT_TYPES)
        or journal_parts(run_dir, rank)
    ):
        raise UserError(
            f"run {run_id!r} already has telemetry for rank {rank} in "
            f"{run_dir}; choose another run id, or resume it"
        )
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())  # "/" exists
    if not existing.is_dir():
        raise UserError(f"cannot create the run directory {run_dir}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot create the run directory {run_dir}: {existing} is not writable")


def prepare_new(run_dir: Path, manifest: Manifest) -> None:
    """Create the run directory; refuse to mix a new run into an existing one.

    The caller holds the run's writer lock (:func:`esper.telemetry.hub.open_run`).
    """
    _check_unused(run_dir, run_id=manifest.run_id, rank=manifest.rank)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_manifest(manifest_path(run_dir, manifest.rank), manifest)
    except OSError as exc:
        raise UserError(f"cannot create the run directory {run_dir}: {exc}") from None


def prepare_resume(
    run_dir: Path,
    *,
    rank: int,
    start_seq: int,
    level: str,
    flush_interval_s: float,
    config_hash: str,
    sink: PartSink,
) -> Manifest:
    """Load the run's manifest, repair what a crash left, cut the tail at ``start_seq``."""
    path = manifest_path(run_dir, rank)
    if not path.is_file():
        raise UserError(f"cannot resume: no telemetry manifest at {path}")
    manifest = read_manifest(path)
    if manifest.schema_version != SCHEMA_VERSION:
        raise UserError(
            f"cannot resume {run_dir}: it was written with telemetry schema "
            f"v{manifest.schema_version}, this build writes v{SCHEMA_VERSION}"
        )

    def save(m: Manifest) -> None:
        write_manifest(path, m)

    # Owned by this process from here on: a crash while the tail is cut (its counts
    # are stale until it is done) reads as a crashed run, not as a closed one.
    manifest.status = RunStatus.RUNNING.value
    manifest.pid = os.getpid()
    manifest.hostname = socket.gethostname()
    recover_pending(run_dir, manifest, sink, save)
    # Only this rank's directories: another rank of the same run may be writing a part
    # under its dot tmp name right now (ranks resume at their own pace).
    for tag in EVENT_TYPES:
        remove_stale_tmp(type_rank_dir(run_dir, tag, rank))
    remove_stale_tmp(journal_rank_dir(run_dir, rank))
    truncated = _convert_journal(run_dir, rank=rank, start_seq=start_seq, sink=sink)
    for tag, cls in EVENT_TYPES.items():
        truncated += truncate_from_seq(
            sink=sink,
            manifest=manifest,
            save=save,
            event_type=tag,
            directory=type_rank_dir(run_dir, tag, rank),
            start_seq=start_seq,
            schema=event_schema(cls),
        )
    manifest.counts = _count_rows(run_dir, manifest)
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
    save(manifest)
    return manifest


def _convert_journal(run_dir: Path, *, rank: int, start_seq: int, sink: PartSink) -> int:
    """Turn a dead writer's journal into typed parts; return the events cut at the tail."""
    parts = journal_parts(run_dir, rank)
    if not parts:
        return 0
    events = [event for path in parts for event in read_journal(path)]
    cut = 0
    fresh = unconverted(events, lambda tag: _max_seq(type_rank_dir(run_dir, tag, rank)))
    for tag, found in fresh.items():
        kept = [e for e in found if e.seq < start_seq]
        cut += len(found) - len(kept)
        if kept:
            directory = type_rank_dir(run_dir, tag, rank)
            existing = list_parts(directory)
            path = directory / part_name(existing[-1][0] + 1 if existing else 0)
            sink.write_table(events_to_table(EVENT_TYPES[tag], kept), path)
    for path in parts:
        sink.remove(path)
    return cut


def _max_seq(directory: Path) -> int:
    """The largest ``seq`` in one ``<type>/rank=<r>`` directory's parts (-1: none)."""
    highest = -1
    for _, path in list_parts(directory):
        seq = pq.read_table(path, columns=["seq"], page_checksum_verification=True)["seq"]
        if len(seq):
            highest = max(highest, int(pc.max(seq).as_py()))
    return highest


def _count_rows(run_dir: Path, manifest: Manifest) -> dict[str, int]:
    """Per-type event counts of this rank, read from the Parquet footers on disk."""
    counts: dict[str, int] = {}
    rank_dir = f"rank={manifest.rank}"
    for part in live_parts(run_dir, [manifest]):
        if part.parent.name != rank_dir:
            continue
        tag = event_type_of(part.parent.parent.name)
        counts[tag] = counts.get(tag, 0) + pq.read_metadata(part).num_rows
    return dict(sorted(counts.items()))
