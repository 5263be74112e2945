"""Where a run's telemetry lives on disk, how its files are named, and which are live.

Layout (hive-style, so polars, DuckDB and Spark read a fleet of runs unchanged)::

    <telemetry_dir>/<run_id>/manifest.json                 rank 0's manifest
    <telemetry_dir>/<run_id>/manifest-rank<r>.json         other ranks' manifests
    <telemetry_dir>/<run_id>/events/type=<t>/rank=<r>/part-<first seq>-<last seq>.parquet

A part is named by the first and last ``seq`` it holds. Parts of one type and rank hold
disjoint ``seq`` ranges, except for a moment during a merge: its output is renamed into
place before its inputs are deleted, so a crash in between leaves the output beside
inputs whose ranges lie inside it; one rule settles that case, for the writer (at
resume) and every reader alike (:func:`list_parts`). Any other ``*.parquet`` file there
is damage (runs before schema version 3, which named parts ``part-<n>.parquet``, are
no longer read).

A run id becomes a directory name, so it is validated before anything touches the disk:
no separators, no ``..``, no absolute paths, and the resolved directory (symlinks
followed) must stay inside the telemetry directory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NamedTuple

from esper.errors import UserError

RUN_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
EVENTS_DIR: Final = "events"
#: Prefix of the event-type directories (hive partitioning).
TYPE_DIR_PREFIX: Final = "type="
RANK_DIR_PREFIX: Final = "rank="
MANIFEST_NAME: Final = "manifest.json"
#: Zero padding of the seq numbers in part names, so lexical order is seq order.
SEQ_DIGITS: Final = 12
#: In-progress files start with a dot: hive readers (and our own globs) skip them.
TMP_PREFIX: Final = "."
TMP_SUFFIX: Final = ".tmp"
_PART_RE: Final = re.compile(r"part-(\d+)-(\d+)\.parquet")
_RANK_MANIFEST_RE: Final = re.compile(r"manifest-rank(\d+)\.json")


def validate_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is a safe directory name, else raise :class:`UserError`."""
    if not isinstance(run_id, str) or RUN_ID_PATTERN.fullmatch(run_id) is None:
        raise UserError(
            f"invalid run id {run_id!r}: use 1-128 characters from [A-Za-z0-9._-], "
            "starting with a letter or digit"
        )
    return run_id


def resolve_run_dir(telemetry_dir: str | os.PathLike[str], run_id: str) -> Path:
    """The run directory for ``run_id``, guaranteed to lie inside ``telemetry_dir``.

    A pre-existing symlink named like the run that points elsewhere is rejected, so a
    writer can never be tricked into writing outside the telemetry directory.
    """
    validate_run_id(run_id)
    root = Path(telemetry_dir).resolve()
    candidate = root / run_id
    resolved = candidate.resolve()
    if resolved.parent != root and root not in resolved.parents:
        raise UserError(
            f"run directory {candidate} resolves to {resolved}, outside the telemetry "
            f"directory {root}"
        )
    return candidate


def manifest_path(run_dir: Path, rank: int) -> Path:
    """Rank 0 owns ``manifest.json``; other ranks write their own, side by side."""
    if rank == 0:
        return run_dir / MANIFEST_NAME
    return run_dir / f"manifest-rank{rank}.json"


def manifest_paths(run_dir: Path) -> dict[int, Path]:
    """Manifests of every rank present in ``run_dir``, by rank (from the file name)."""
    found = {0: run_dir / MANIFEST_NAME} if (run_dir / MANIFEST_NAME).is_file() else {}
    for path in run_dir.glob("manifest-rank*.json"):
        match = _RANK_MANIFEST_RE.fullmatch(path.name)
        if match is not None:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def type_dir_name(event_type: str) -> str:
    """``type=<event type>``: hive-style, so readers of ``events/**`` get a ``type`` column."""
    return f"{TYPE_DIR_PREFIX}{event_type}"


def type_rank_dir(run_dir: Path, event_type: str, rank: int) -> Path:
    return run_dir / EVENTS_DIR / type_dir_name(event_type) / f"{RANK_DIR_PREFIX}{rank}"


def type_rank_dirs(run_dir: Path) -> list[tuple[str, int, Path]]:
    """Every ``events/type=<t>/rank=<r>`` directory of a run, as (type, rank, path)."""
    events = run_dir / EVENTS_DIR
    found = []
    for type_dir in sorted(events.glob(f"{TYPE_DIR_PREFIX}*")):
        for rank_dir in sorted(type_dir.glob(f"{RANK_DIR_PREFIX}*")):
            rank = rank_dir.name.removeprefix(RANK_DIR_PREFIX)
            if rank.isdigit() and rank_dir.is_dir():
                found.append((type_dir.name.removeprefix(TYPE_DIR_PREFIX), int(rank), rank_dir))
    return found


def part_name(first_seq: int, last_seq: int) -> str:
    """``part-<first>-<last>.parquet``: the part holds events of ``seq`` in that range."""
    return f"part-{first_seq:0{SEQ_DIGITS}d}-{last_seq:0{SEQ_DIGITS}d}.parquet"


@dataclass(frozen=True)
class Part:
    """A closed part file and the ``seq`` range its name states."""

    path: Path
    first: int
    last: int


class Listing(NamedTuple):
    """What one ``type=<t>/rank=<r>`` directory holds, for the writer and every reader."""

    #: The parts to read, in ``seq`` order (disjoint ranges in an undamaged run).
    live: list[Part]
    #: Parts whose range lies inside a live part's: a merge's inputs a crash left behind.
    superseded: list[Part]
    #: Other ``*.parquet`` files a hive reader would read (not part names): damage.
    strays: list[Path]


def parse_part(path: Path) -> Part | None:
    """The part a file name describes (``part-<first>-<last>.parquet``), else None."""
    match = _PART_RE.fullmatch(path.name)
    if match is None:
        return None
    first, last = int(match.group(1)), int(match.group(2))
    return Part(path, first, last) if first <= last else None


def tmp_path_for(path: Path) -> Path:
    """Sibling temporary name used while ``path`` is being written."""
    return path.with_name(f"{TMP_PREFIX}{path.name}{TMP_SUFFIX}")


def list_parts(directory: Path) -> Listing:
    """One directory's files, the superseded-part rule applied: a part whose range lies
    inside another part's range is not live (a merge renames its output into place
    before it deletes its inputs; a resume's cut writes inside its input's range)."""
    if not directory.is_dir():
        return Listing([], [], [])
    parts: list[Part] = []
    strays: list[Path] = []
    for entry in directory.iterdir():
        if entry.name.endswith(".parquet") and not entry.name.startswith((TMP_PREFIX, "_")):
            part = parse_part(entry)
            if part is None:
                strays.append(entry)
            else:
                parts.append(part)
    live: list[Part] = []
    superseded: list[Part] = []
    # By first seq; of equal firsts, the largest range first.
    for part in sorted(parts, key=lambda p: (p.first, -p.last)):
        if live and part.last <= live[-1].last:
            superseded.append(part)
        else:
            live.append(part)
    return Listing(live, superseded, sorted(strays))
