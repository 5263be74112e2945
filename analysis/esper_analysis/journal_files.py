"""A crashed (or live) run's journal, presented to the loader as ordinary typed parts.

The writer journals each flush into one file under ``journal/rank=<r>/`` and converts
the journalled events into typed parts later (:mod:`esper.telemetry.journal`). A
cleanly closed run has no journal; a run killed between conversions does, and its
newest events are only there. The loader reads those events (page checksums verified),
keeps the ones no typed part holds yet, and writes them as one Parquet file per type
and rank into a scratch directory owned by the :class:`~esper_analysis.loader.Run`.
Scans, counts, run-id and manifest checks then treat them like any part file, and
messages name the journal directory they came from.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.parquet as pq

from esper.telemetry.arrow_schema import events_to_table
from esper.telemetry.events import EVENT_TYPES, Event, event_tag
from esper.telemetry.journal import (
    JOURNAL_DIR,
    JournalError,
    journal_parts,
    journal_ranks,
    read_journal,
    unconverted,
)
from esper.telemetry.paths import type_dir_name
from esper_analysis.errors import CorruptFileError

#: Name of the materialised file in ``<scratch>/type=<t>/rank=<r>/``.
MATERIALISED_NAME: Final = "part-journal.parquet"
#: What reading a journal part can raise when the file is damaged or foreign.
_UNREADABLE: Final = (JournalError, OSError, pa.ArrowException, UnicodeDecodeError)

#: ``typed_max(event_type, rank)``: the largest ``seq`` of that type's typed parts (-1).
TypedMax = Callable[[str, int], int]


@dataclass(frozen=True)
class JournalFile:
    """One materialised file: a type's unconverted journal events of one rank."""

    event_type: str
    rank: int
    path: Path
    #: Where the events came from, relative to the run directory (for messages).
    source: str


@dataclass
class JournalEvents:
    """The journalled events of every rank, read before the typed parts are listed: a
    live writer that converts in between then leaves its events in the typed parts,
    where :func:`materialise` recognises them, instead of in neither place."""

    by_rank: dict[int, list[Event]]
    #: (path relative to the run directory, reason) of journal parts that did not read.
    skipped: list[tuple[str, str]]


def read_journals(run_dir: Path, *, tolerant: bool) -> JournalEvents:
    """Every rank's journal events (none when the run has no journal).

    A damaged journal part is skipped with a warning when ``tolerant`` (a run that did
    not close cleanly), and an error naming the file otherwise.
    """
    skipped: list[tuple[str, str]] = []
    by_rank = {
        rank: _read_rank(run_dir, rank, tolerant, skipped) for rank in journal_ranks(run_dir)
    }
    return JournalEvents({r: e for r, e in by_rank.items() if e}, skipped)


def materialise(
    journals: JournalEvents, typed_max: TypedMax
) -> tuple[list[JournalFile], tempfile.TemporaryDirectory[str] | None]:
    """One Parquet file per type and rank of the events no typed part holds yet, in a
    scratch directory (returned: it lives as long as the caller keeps it)."""
    found: list[JournalFile] = []
    scratch: tempfile.TemporaryDirectory[str] | None = None
    for rank, events in sorted(journals.by_rank.items()):
        floors = {tag: typed_max(tag, rank) for tag in {event_tag(type(e)) for e in events}}
        for tag, kept in sorted(unconverted(events, floors).items()):
            if scratch is None:
                scratch = tempfile.TemporaryDirectory(prefix="esper-journal-")
            path = Path(scratch.name) / type_dir_name(tag) / f"rank={rank}" / MATERIALISED_NAME
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(events_to_table(EVENT_TYPES[tag], kept), path, write_page_checksum=True)
            found.append(JournalFile(tag, rank, path, f"{JOURNAL_DIR}/rank={rank}"))
    return found, scratch


def _read_rank(
    run_dir: Path, rank: int, tolerant: bool, skipped: list[tuple[str, str]]
) -> list[Event]:
    events: list[Event] = []
    for path in journal_parts(run_dir, rank):
        try:
            events.extend(read_journal(path))
        except FileNotFoundError:
            continue  # converted and deleted by a live writer since the listing
        except _UNREADABLE as exc:
            if not tolerant:
                raise CorruptFileError(f"corrupt journal part {path}: {exc}") from None
            reason = f"damaged journal part ({exc})"
            warnings.warn(f"skipping {path}: {reason}", stacklevel=4)
            skipped.append((path.relative_to(run_dir).as_posix(), reason))
    return events
