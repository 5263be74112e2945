"""A crashed (or live) run's journal, presented to the loader as in-memory parts.

The writer journals each flush into one file under ``journal/rank=<r>/`` and converts
the journalled events into typed parts later (:mod:`esper.telemetry.journal`). A
cleanly closed run has no journal; a run killed between conversions does, and its
newest events are only there. The loader reads those events (page checksums verified)
and keeps the ones no typed part holds yet as one Arrow table per type and rank
(:class:`~esper_analysis.parts.PartFile` with a ``table``): scans, counts, run-id and
manifest checks treat them like any part, and messages name the journal directory.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import pyarrow as pa

from esper.telemetry.arrow_schema import events_to_table
from esper.telemetry.events import EVENT_TYPES, SCHEMA_VERSION, Event
from esper.telemetry.journal import (
    JournalError,
    journal_parts,
    journal_rank_dir,
    journal_ranks,
    read_journal,
    unconverted,
)
from esper_analysis.errors import CorruptFileError
from esper_analysis.parts import PartFile

#: What reading a journal part can raise when the file is damaged or foreign.
_UNREADABLE: Final = (JournalError, OSError, pa.ArrowException, UnicodeDecodeError)


class TypedMax(Protocol):
    """The largest ``seq`` of a type's typed parts of one rank (-1: none)."""

    def __call__(self, event_type: str, rank: int) -> int: ...


@dataclass
class JournalEvents:
    """The journalled events of every rank, read before the typed parts are listed: a
    live writer that converts in between then leaves its events in the typed parts,
    where :func:`journal_parts_of` recognises them, instead of in neither place."""

    run_dir: Path
    by_rank: dict[int, list[Event]]
    #: The one ``run_id`` of each rank's journal.
    run_ids: dict[int, str]
    #: (path relative to the run directory, reason) of journal parts that did not read.
    skipped: list[tuple[str, str]]


def read_journals(run_dir: Path, *, tolerant: bool) -> JournalEvents:
    """Every rank's journal events (none when the run has no journal).

    A damaged journal part (or one whose events carry another ``run_id`` than the
    rank's first part) is skipped with a warning when ``tolerant`` (a run that did not
    close cleanly), and an error naming the file otherwise.
    """
    journals = JournalEvents(run_dir, {}, {}, [])
    for rank in journal_ranks(run_dir):
        for path in journal_parts(run_dir, rank):
            try:
                events = _read_part(path, journals.run_ids.get(rank))
            except FileNotFoundError:
                continue  # converted and deleted by a live writer since the listing
            except _UNREADABLE as exc:
                if not tolerant:
                    raise CorruptFileError(f"corrupt journal part {path}: {exc}") from None
                reason = f"damaged journal part ({exc})"
                warnings.warn(f"skipping {path}: {reason}", stacklevel=3)
                journals.skipped.append((path.relative_to(run_dir).as_posix(), reason))
                continue
            if events:
                journals.by_rank.setdefault(rank, []).extend(events)
                journals.run_ids.setdefault(rank, events[0].run_id)
    return journals


def _read_part(path: Path, run_id: str | None) -> list[Event]:
    events = read_journal(path)
    ids = sorted({e.run_id for e in events} | ({run_id} if run_id is not None else set()))
    if len(ids) > 1:
        raise JournalError(f"its events mix run ids {', '.join(ids)}")
    return events


def journal_parts_of(journals: JournalEvents, typed_max: TypedMax) -> list[PartFile]:
    """One in-memory part per type and rank: the events no typed part holds yet."""
    found: list[PartFile] = []
    for rank, events in sorted(journals.by_rank.items()):
        fresh = unconverted(events, functools.partial(typed_max, rank=rank))
        for tag, kept in sorted(fresh.items()):
            found.append(
                PartFile(
                    path=journal_rank_dir(journals.run_dir, rank),
                    event_type=tag,
                    rank=rank,
                    rows=len(kept),
                    schema_version=SCHEMA_VERSION,
                    seq_min=kept[0].seq,
                    seq_max=kept[-1].seq,
                    run_id=journals.run_ids[rank],
                    table=events_to_table(EVENT_TYPES[tag], kept),
                )
            )
    return found
