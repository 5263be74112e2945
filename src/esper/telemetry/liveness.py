"""What on disk a reader may trust: which parts are live, and whether a run still runs.

Two rules, used alike by the writer (when it resumes a run) and by every reader (the
analysis loader, ``esper watch``, ``esper runs``):

- **Superseded parts.** Parts of one type and rank hold disjoint ``seq`` ranges (their
  names state them: :mod:`esper.telemetry.paths`), except that a merge renames its
  output into place before it deletes its inputs. A part whose range lies inside
  another part's range is therefore not live: the larger part holds all its events.
  (A resume's cut writes a part smaller than its input; if a crash leaves both, the
  larger one, the uncut input, is live, and the next resume cuts again.)
- **Stale manifests.** A manifest that says ``running`` belongs to a dead producer when
  that producer's pid is gone (same host) or its heartbeat is older than
  ``max(MIN_STALE_S, STALE_INTERVALS * flush_interval_s)``: the run then reads as
  ``crashed``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from esper.core.enums import RunStatus
from esper.telemetry.paths import Part, list_parts

#: A ``running`` manifest whose heartbeat is older than this many flush intervals
#: (and at least :data:`MIN_STALE_S`) belongs to a dead producer.
STALE_INTERVALS: Final = 10
MIN_STALE_S: Final = 5.0
#: Flush interval assumed when a manifest's is absent or damaged.
DEFAULT_FLUSH_S: Final = 1.0
NS_PER_S: Final = 1_000_000_000


def superseded(parts: list[Part]) -> set[Path]:
    """The parts of one type and rank whose ``seq`` range lies inside another's."""
    ranged = sorted(
        (p for p in parts if p.first is not None and p.last is not None),
        key=lambda p: (p.first, -(p.last or 0)),
    )
    out: set[Path] = set()
    cover = -1
    for part in ranged:  # by first seq; of equal firsts, the largest range first
        assert part.last is not None
        if part.last <= cover:
            out.add(part.path)
        else:
            cover = part.last
    return out


def live_parts(directory: Path) -> list[Part]:
    """The parts of one ``type=<t>/rank=<r>`` directory a reader should read."""
    parts = list_parts(directory)
    gone = superseded(parts)
    return [p for p in parts if p.path not in gone]


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (signal 0 probes only)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: inf in a damaged file
        return None


def manifest_status(manifest: Mapping[str, Any], *, now_ns: int | None = None) -> RunStatus | None:
    """The manifest's status, with a stale ``running`` (dead producer) as ``crashed``;
    None when the status is not one (a damaged manifest)."""
    try:
        status = RunStatus(str(manifest.get("status")).lower())
    except ValueError:
        return None
    if status is not RunStatus.RUNNING:
        return status
    pid = _as_int(manifest.get("pid"))
    if manifest.get("hostname") == socket.gethostname() and pid is not None and not pid_alive(pid):
        return RunStatus.CRASHED
    beat = _as_int(manifest.get("heartbeat_ns"))
    if beat is None:
        return RunStatus.CRASHED
    flush_s = manifest.get("flush_interval_s")
    if not isinstance(flush_s, int | float) or not flush_s > 0:
        flush_s = DEFAULT_FLUSH_S
    stale_s = max(MIN_STALE_S, STALE_INTERVALS * float(flush_s))
    now = time.time_ns() if now_ns is None else now_ns
    return RunStatus.CRASHED if now - beat > stale_s * NS_PER_S else RunStatus.RUNNING
