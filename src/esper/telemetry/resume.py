"""Preparing a run directory for a new run, or for resuming an existing one.

A resumed run restarts ``seq`` at the checkpoint's position (``start_seq``). Nothing is
changed before the run is checked: the manifest is this run's and schema version's,
the checkpoint was written by one of its sessions' configs, every file of the rank is
a readable part of this run (run id in the data, not the name) and ``seq`` is
contiguous from the run's first event to ``start_seq``
(:func:`_check_run_files`); any failure is a :class:`ResumeRefusedError` (exit 2) naming
the file or the gap. Events the dead session wrote from ``start_seq`` on are re-emitted
by the resumed one, so they are cut, and ``seq`` continues without gaps or duplicates
across both sessions; the files kept stay as they are until the close merges each type
into one. The cut is crash-safe by the superseded-part rule
(:func:`esper.telemetry.paths.list_parts`): it writes a part inside its input's range
(if the input survives a crash, it wins and the next resume cuts again).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from esper.core.enums import RunStatus
from esper.errors import UserError
from esper.telemetry.arrow_schema import event_schema
from esper.telemetry.events import EVENT_TYPES, SCHEMA_VERSION
from esper.telemetry.lock import RunLockedError, run_lock_owner
from esper.telemetry.manifest import (
    Manifest,
    ManifestError,
    ResumeRecord,
    effective_status,
    read_manifest,
    write_manifest,
)
from esper.telemetry.paths import (
    TMP_PREFIX,
    TMP_SUFFIX,
    Listing,
    Part,
    list_parts,
    manifest_path,
    part_name,
    type_rank_dir,
)
from esper.telemetry.sink import PartSink


def check_new_run_dir(
    run_dir: Path,
    *,
    run_id: str,
    rank: int = 0,
    checkpoint: Path | None = None,
    config_hash: str = "",
) -> bool:
    """Refuse, before any expensive work, a run directory a new run cannot use.

    Called by the trainer before it loads data, so a reused run id or an unwritable
    telemetry directory is reported in a second rather than after the dataset is read.
    A run another live process writes is refused naming that process. Returns True
    when the id holds a run that stopped without a ``checkpoint`` file (nothing can
    continue it) and that either completed no round or was written with this
    ``config_hash`` (the same command: the restart writes the same events again): the
    new run replaces it (``open_run(..., replace=True)``).
    """
    owner = run_lock_owner(run_dir, rank=rank)
    if owner is not None:
        raise RunLockedError(
            f"run {run_id!r} (rank {rank}) in {run_dir} is being written by {owner}; "
            "choose another run id"
        )
    if checkpoint is not None and has_telemetry(run_dir, rank):
        if checkpoint.exists():
            raise UserError(
                f"run {run_id!r} already has telemetry for rank {rank} in {run_dir}; choose "
                f"another run id (--run-id), or continue it with --resume {checkpoint} "
                "--continue-run"
            )
        restart = _restartable(run_dir, rank, config_hash)
        if restart is None:
            raise UserError(
                f"run {run_id!r} already has telemetry for rank {rank} in {run_dir}, of "
                f"another configuration, and no checkpoint to continue from ({checkpoint}); "
                f"choose another run id (--run-id), or delete {run_dir} to start it again"
            )
        if restart:
            return True
    _check_unused(run_dir, run_id=run_id, rank=rank)
    return False


def _restartable(run_dir: Path, rank: int, config_hash: str) -> bool | None:
    """For a rank with telemetry and no checkpoint: True when a new run may replace it
    (it stopped, and completed no round or had this config), None when only its config
    differs, False otherwise (finished, live, or its manifest unreadable)."""
    try:
        manifest = read_manifest(manifest_path(run_dir, rank))
    except ManifestError:
        return False
    if effective_status(manifest) in (RunStatus.FINISHED, RunStatus.RUNNING):
        return False
    if manifest.counts.get("episode_finished", 0) == 0 or config_hash in session_hashes(manifest):
        return True
    return None


def session_hashes(manifest: Manifest) -> list[str]:
    """The config hashes of the run's sessions: the first one's and each resume's."""
    return [manifest.config_hash, *(r.config_hash for r in manifest.resumes)]


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
    """Whether ``rank`` of the run already wrote a manifest or a Parquet file."""
    return manifest_path(run_dir, rank).exists() or any(
        any(list_parts(type_rank_dir(run_dir, tag, rank))) for tag in EVENT_TYPES
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
            live, superseded, strays = list_parts(type_rank_dir(run_dir, tag, manifest.rank))
            for path in [*(p.path for p in live + superseded), *strays]:
                path.unlink()
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
    checkpoint_hash: str = "",
) -> Manifest:
    """Check the run (:func:`_check_run_files`), then settle what a crash left and cut
    at ``start_seq``. ``checkpoint_hash``: the config hash the checkpoint was
    written with, which must be one of the run's sessions' (empty: not checked).

    The caller holds the run's writer lock (:func:`esper.telemetry.hub.open_run`).
    """
    path = manifest_path(run_dir, rank)
    manifest = _resumable_manifest(run_dir, run_id=run_id, rank=rank)
    listings = {tag: list_parts(type_rank_dir(run_dir, tag, rank)) for tag in EVENT_TYPES}
    try:
        if checkpoint_hash and checkpoint_hash not in session_hashes(manifest):
            raise _Refusal(
                f"the checkpoint was written with config {checkpoint_hash}, this run's sessions "
                f"with {', '.join(dict.fromkeys(session_hashes(manifest)))} (another run of "
                "this id)"
            )
        counts, truncated = _check_run_files(run_dir, manifest, listings, start_seq)
    except _Refusal as exc:
        raise ResumeRefusedError(
            f"cannot continue run {run_id!r} (rank {rank}) in {run_dir}: {exc}; nothing was "
            "changed (drop --continue-run to start a new run linked to the checkpoint)"
        ) from None
    # Owned by this process from here on: a crash while the tail is cut (its counts
    # are stale until it is done) reads as a crashed run, not as a closed one.
    manifest.status = RunStatus.RUNNING.value
    manifest.pid = os.getpid()
    manifest.hostname = socket.gethostname()
    write_manifest(path, manifest)
    kept: list[Path] = []
    for tag, listing in listings.items():
        kept += _cut(type_rank_dir(run_dir, tag, rank), listing, tag, start_seq, sink)
    manifest.counts = {tag: n for tag, n in counts.items() if n}
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


class ResumeRefusedError(UserError):
    """The run cannot be continued from the checkpoint; nothing was changed (exit 2)."""


class _Refusal(Exception):
    """Why :func:`_check_run_files` refuses (the caller names the run)."""


def _check_run_files(
    run_dir: Path, manifest: Manifest, listings: dict[str, Listing], start_seq: int
) -> tuple[dict[str, int], int]:
    """Raise :class:`_Refusal` unless every Parquet file of the rank is a part of this
    run, read in full with every page's checksum verified (its columns its type's, the
    run id in its data the manifest's, its ``seq`` the range its name states), and the
    live parts hold every ``seq`` from the run's first event up to ``start_seq`` once.
    Returns the events before ``start_seq`` per type, and the number from it on."""
    first = manifest.first_seq
    if start_seq < first:
        raise _Refusal(f"the checkpoint's seq {start_seq} lies before the run's first, {first}")
    seen = np.zeros(start_seq - first, dtype=np.bool_)
    counts = dict.fromkeys(listings, 0)
    after = 0
    for tag, (live, superseded, strays) in listings.items():
        if strays:
            raise _Refusal(f"{strays[0].relative_to(run_dir)} is not a part file")
        for part in superseded:  # deleted next, so checked first
            _checked_seq(run_dir, manifest.run_id, part, tag)
        for part in live:
            seq = _checked_seq(run_dir, manifest.run_id, part, tag)
            offsets = seq[seq < start_seq] - first
            counts[tag] += offsets.size
            after += seq.size - offsets.size
            where = part.path.relative_to(run_dir)
            if offsets.size and int(offsets[0]) < 0:
                raise _Refusal(f"{where} holds events before the run's first seq, {first}")
            if not bool(np.all(np.diff(offsets) > 0)) or bool(seen[offsets].any()):
                raise _Refusal(f"{where} repeats events")
            seen[offsets] = True
    missing = np.flatnonzero(~seen)
    if missing.size:
        lo = int(missing[0])
        hi = lo + int(np.argmax(seen[lo:])) - 1 if seen[lo:].any() else seen.size - 1
        raise _Refusal(
            f"{missing.size} of the {seen.size} events before the checkpoint's seq {start_seq} "
            f"are missing (the first: seq {first + lo}..{first + hi})"
        )
    return counts, after


def _checked_seq(run_dir: Path, run_id: str, part: Part, tag: str) -> np.ndarray:
    """The ``seq`` column of a part read in full, or :class:`_Refusal` saying why not."""
    where = part.path.relative_to(run_dir)
    schema = event_schema(EVENT_TYPES[tag])
    chunks: list[np.ndarray] = []
    try:
        with pq.ParquetFile(part.path, page_checksum_verification=True) as parquet:
            if not parquet.schema_arrow.equals(schema, check_metadata=False):
                raise _Refusal(f"{where} does not have the columns of {tag}")
            for group in range(parquet.num_row_groups):
                table = parquet.read_row_group(group)
                others = set(pc.unique(table.column("run_id")).to_pylist()) - {run_id}
                if others:
                    raise _Refusal(f"{where} holds events of run {sorted(others)[0]!r}")
                chunks.append(table.column("seq").to_numpy())
    except (OSError, pa.ArrowException) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise _Refusal(f"{where} is unreadable ({reason})") from None
    seq = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
    if not seq.size or int(seq.min()) != part.first or int(seq.max()) != part.last:
        raise _Refusal(f"{where} does not hold the seq range its name states")
    return seq


def _cut(directory: Path, listing: Listing, tag: str, start_seq: int, sink: PartSink) -> list[Path]:
    """One type of one rank: drop a crash's leftovers and cut at ``start_seq`` (parts
    that straddle it are rewritten without their tail). Returns the files kept."""
    if directory.is_dir():
        for stale in directory.glob(f"{TMP_PREFIX}*{TMP_SUFFIX}"):  # a killed write's
            stale.unlink(missing_ok=True)
    for part in listing.superseded:
        sink.remove(part.path)
    schema = event_schema(EVENT_TYPES[tag])
    kept: list[Path] = []
    for part in listing.live:
        if part.last < start_seq:
            kept.append(part.path)
            continue
        if part.first < start_seq:
            table = pq.read_table(part.path, schema=schema, page_checksum_verification=True)
            rest = table.filter(pc.less(table.column("seq"), start_seq))
            end = int(pc.max(rest.column("seq")).as_py())
            output = directory / part_name(part.first, end)
            sink.write_merged([rest], schema, output)
            kept.append(output)
        sink.remove(part.path)
    return kept
