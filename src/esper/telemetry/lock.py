"""One writer per run and rank: an exclusive OS file lock held for the writer's lifetime.

A pid in the manifest cannot keep a second process out (it is only read after the fact,
and a stale one must be ignored after ``kill -9``). ``flock`` can: the kernel holds the
lock for as long as the writing process has the file open and drops it when the
process exits, however it dies, so crash recovery and ``--continue-run`` keep working
while a live writer is never truncated or rewritten by another process.

The lock file (``.writer.lock``, ``.writer-rank<r>.lock`` for other ranks) also holds
the owner's pid and host, so the refusal can name them. POSIX only (``fcntl``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
import warnings
from pathlib import Path
from typing import Final

from esper.errors import UserError

LOCK_NAME: Final = ".writer.lock"
#: Bytes read from a lock file to name its owner (a few dozen are written).
_MAX_OWNER_BYTES: Final = 4096
#: ``flock`` errors that mean "no locks on this filesystem", not "locked".
_NO_LOCKS: Final = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})


class RunLockedError(UserError):
    """Another live process writes this run (exit 2); the message names its pid and host."""


def lock_path(run_dir: Path, rank: int) -> Path:
    """Rank 0 locks ``.writer.lock``; other ranks their own file beside it."""
    return run_dir / (LOCK_NAME if rank == 0 else f".writer-rank{rank}.lock")


def _describe_owner(raw: bytes) -> str:
    try:
        owner = json.loads(raw.decode("utf-8"))
        return f"pid {int(owner['pid'])} on host {owner['host']}"
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return "another process (owner not yet recorded)"


class RunLock:
    """An acquired lock; :meth:`release` (or process exit) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlock and close (idempotent). The file stays: deleting it would race."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _open_lock_file(path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        raise UserError(f"cannot open the run lock {path}: {exc.strerror or exc}") from None


def acquire_run_lock(run_dir: Path, *, rank: int, run_id: str) -> RunLock:
    """Take the run's writer lock, or raise :class:`RunLockedError` naming the owner.

    Creates ``run_dir`` if needed; nothing else in it is touched before the lock is held.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the run directory {run_dir}: {exc}") from None
    path = lock_path(run_dir, rank)
    fd = _open_lock_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, _MAX_OWNER_BYTES, 0)
        os.close(fd)
        raise RunLockedError(
            f"run {run_id!r} (rank {rank}) in {run_dir} is being written by "
            f"{_describe_owner(owner)}; wait for it to finish or stop it first "
            f"(lock {path.name})"
        ) from None
    except OSError as exc:
        if exc.errno not in _NO_LOCKS:
            os.close(fd)
            raise UserError(f"cannot lock {path}: {exc.strerror or exc}") from None
        warnings.warn(  # e.g. some network filesystems: run, but say what is not guarded
            f"{path}: the filesystem does not support file locks ({exc.strerror}); a second "
            "process writing this run at the same time cannot be refused",
            stacklevel=2,
        )
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since_ns": time.time_ns()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode("utf-8"), 0)
    return RunLock(path, fd)


def run_lock_owner(run_dir: Path, *, rank: int = 0) -> str | None:
    """Who holds the writer lock of ``run_dir`` now ("pid N on host H"), or None if free.

    A probe (take and drop at once), for tools that must tell a live run from a dead one.
    """
    path = lock_path(run_dir, rank)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe_owner(os.pread(fd, _MAX_OWNER_BYTES, 0))
        except OSError:  # no locks on this filesystem: nobody can be seen holding one
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
