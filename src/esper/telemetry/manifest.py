"""The run manifest: one small JSON file per run and rank, rewritten atomically.

The writer rewrites it after every write of parts (tmp file + ``os.replace``), so a
reader always sees a complete manifest whose counts describe parts already on disk (the
parts may hold newer events: ``seq > last_seq``). Its ``heartbeat_ns`` advances while the
producer lives; a ``running`` manifest with a stale heartbeat or a dead pid belongs to a
killed run (:func:`effective_status`, the one status rule of the writer and the readers).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Final

import msgspec

from esper.core.enums import RunStatus
from esper.errors import UserError
from esper.telemetry.paths import manifest_paths, tmp_path_for

#: A ``running`` manifest whose heartbeat is older than this many flush intervals
#: (and at least :data:`MIN_STALE_S`) belongs to a dead producer.
STALE_INTERVALS: Final = 10
MIN_STALE_S: Final = 5.0
NS_PER_S: Final = 1_000_000_000


class ManifestError(UserError):
    """A manifest that cannot be read or decoded; the message names the file."""


class WriterCounters(msgspec.Struct, kw_only=True):
    """Cumulative writer statistics (also emitted as the final ``writer_stats`` event)."""

    events_written: int = 0
    #: Bytes of every part and merged file written.
    bytes_written: int = 0
    flushes: int = 0
    max_queue_depth: int = 0
    blocked_ns: int = 0
    blocked_emits: int = 0
    dropped: int = 0
    compactions: int = 0
    #: CPU time of the writing itself (Arrow conversion, Parquet encoding, merges,
    #: manifests), measured per thread: the writer thread's, plus the final merge that
    #: ``close`` runs. Manifest only (the ``writer_stats`` event's schema is unchanged).
    cpu_ns: int = 0


class ResumeRecord(msgspec.Struct, kw_only=True):
    """A resume of this run: where seq restarted and what was cut from the old tail."""

    start_seq: int
    at_ns: int
    pid: int
    events_truncated: int
    #: Config fingerprint of the resumed session (the run keeps its original one).
    config_hash: str


class Manifest(msgspec.Struct, kw_only=True):
    run_id: str
    rank: int
    #: Ranks (processes) of the run; each writes its own manifest and partitions.
    world_size: int = 1
    schema_version: int
    config_hash: str
    parent_run_id: str
    status: str
    error: str = ""
    level: str
    pid: int
    hostname: str
    flush_interval_s: float
    started_ns: int
    heartbeat_ns: int
    finished_ns: int = 0
    first_seq: int = 0
    last_seq: int = -1
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    writer: WriterCounters = msgspec.field(default_factory=WriterCounters)
    resumes: list[ResumeRecord] = msgspec.field(default_factory=list)


def new_manifest(
    *,
    run_id: str,
    rank: int,
    schema_version: int,
    config_hash: str,
    parent_run_id: str,
    level: str,
    flush_interval_s: float,
    first_seq: int,
    world_size: int = 1,
) -> Manifest:
    now = time.time_ns()
    return Manifest(
        run_id=run_id,
        rank=rank,
        world_size=world_size,
        schema_version=schema_version,
        config_hash=config_hash,
        parent_run_id=parent_run_id,
        status=RunStatus.RUNNING.value,
        level=level,
        pid=os.getpid(),
        hostname=socket.gethostname(),
        flush_interval_s=flush_interval_s,
        started_ns=now,
        heartbeat_ns=now,
        first_seq=first_seq,
        last_seq=first_seq - 1,
    )


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(Manifest)


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Atomically replace ``path`` with ``manifest`` (readers never see half a file)."""
    tmp = tmp_path_for(path)
    tmp.write_bytes(msgspec.json.format(_encoder.encode(manifest), indent=2) + b"\n")
    os.replace(tmp, path)


def read_manifest(path: Path) -> Manifest:
    try:
        return _decoder.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError) as exc:  # ValidationError is a DecodeError
        raise ManifestError(f"cannot read manifest {path}: {exc}") from None


def read_manifests(run_dir: Path) -> dict[int, Manifest]:
    """The manifests of all ranks of a run, by rank (empty if none was written yet)."""
    return {rank: read_manifest(path) for rank, path in manifest_paths(run_dir).items()}


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (signal 0 probes only)."""
    if pid <= 0:  # 0 and negative numbers name process groups, not a process
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone; a number no pid can be
        return False
    except PermissionError:  # another user's
        return True
    return True


def effective_status(manifest: Manifest, *, now_ns: int | None = None) -> RunStatus:
    """The manifest's status, with a ``running`` one of a dead producer as ``crashed``:
    its pid is gone (same host), or its heartbeat is older than
    ``max(MIN_STALE_S, STALE_INTERVALS * flush_interval_s)``. A status that is none
    (a damaged manifest) reads as ``crashed`` too."""
    try:
        status = RunStatus(manifest.status.lower())
    except ValueError:
        return RunStatus.CRASHED
    if status is not RunStatus.RUNNING:
        return status
    if manifest.hostname == socket.gethostname() and not pid_alive(manifest.pid):
        return RunStatus.CRASHED
    flush_s = manifest.flush_interval_s if manifest.flush_interval_s > 0 else 1.0
    stale_ns = max(MIN_STALE_S, STALE_INTERVALS * flush_s) * NS_PER_S
    now = time.time_ns() if now_ns is None else now_ns
    return RunStatus.CRASHED if now - manifest.heartbeat_ns > stale_ns else RunStatus.RUNNING
