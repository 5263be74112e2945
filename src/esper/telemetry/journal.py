"""The write-ahead journal: one small Parquet file per flush holding every event type.

Why. A flush of a training run holds a few dozen events of about a dozen types. Written
as one typed part per type, each part costs about a millisecond of CPU (Parquet writer
setup and close, file creation and rename, Arrow conversion of a handful of rows), so
the writer thread spent ~10 ms per flush. A journal part is one file per flush: the
batch is encoded in one msgspec call (msgpack keeps NaN and infinities exactly) into a
one-row table. The typed parts are built later from the events the writer still holds,
many flushes at once (see :mod:`esper.telemetry.writer`), and the journal parts they
cover are deleted.

Layout: ``<run_id>/journal/rank=<r>/part-<n>.parquet``, outside ``events/`` so hive
readers of ``events/**`` never see it. A closed run has no journal. A crashed one may:
its events are read by :func:`read_journal` (page checksums verified) and
:func:`unconverted` drops the ones that already reached a typed part. That test is
exact because a conversion always writes *all* pending events of a type, in ``seq``
order, before deleting a journal part: the typed parts of a type hold a prefix of its
events, so a journal event is converted iff its ``seq`` is at most the largest ``seq``
in its type's typed parts (same rank).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final, Union

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from esper.core.native import load_native
from esper.telemetry.events import EVENT_TYPES, SCHEMA_VERSION, Event, event_tag
from esper.telemetry.paths import list_parts

#: The native converter module (its ``group``), or None (:mod:`esper.core.native`).
_native = load_native("esper.telemetry._columns")

JOURNAL_DIR: Final = "journal"
#: File-metadata key that marks a journal part (typed parts carry the event type).
META_JOURNAL: Final = b"esper.journal"
META_SCHEMA_VERSION: Final = b"esper.schema_version"
JOURNAL_SCHEMA: Final = pa.schema(
    [
        pa.field("seq_min", pa.int64(), nullable=False),
        pa.field("seq_max", pa.int64(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("events", pa.large_binary(), nullable=False),
    ],
    metadata={META_JOURNAL: b"1", META_SCHEMA_VERSION: str(SCHEMA_VERSION).encode()},
)

_encoder: Final = msgspec.msgpack.Encoder()


class JournalError(ValueError):
    """A journal part that is not one (foreign schema) or does not decode."""


def journal_rank_dir(run_dir: Path, rank: int) -> Path:
    return run_dir / JOURNAL_DIR / f"rank={rank}"


def journal_parts(run_dir: Path, rank: int) -> list[Path]:
    """Closed journal parts of one rank, oldest first."""
    return [path for _, path in list_parts(journal_rank_dir(run_dir, rank))]


def journal_ranks(run_dir: Path) -> list[int]:
    """Ranks with a journal directory (empty or not)."""
    root = run_dir / JOURNAL_DIR
    if not root.is_dir():
        return []
    ranks = []
    for entry in root.iterdir():
        name = entry.name
        if entry.is_dir() and name.startswith("rank=") and name[len("rank=") :].isdigit():
            ranks.append(int(name[len("rank=") :]))
    return sorted(ranks)


def journal_table(batch: list[Event]) -> pa.Table:
    """One flush's events (stamped, in ``seq`` order) as a one-row journal table."""
    blob = _encoder.encode(batch)
    columns = [[batch[0].seq], [batch[-1].seq], [len(batch)], [blob]]
    return pa.Table.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, JOURNAL_SCHEMA, strict=True)],
        schema=JOURNAL_SCHEMA,
    )


@functools.cache
def _decoder() -> msgspec.msgpack.Decoder[Any]:
    kinds = tuple(EVENT_TYPES.values())
    return msgspec.msgpack.Decoder(list[Union[kinds]])  # type: ignore[valid-type]  # noqa: UP007


def read_journal(path: Path) -> list[Event]:
    """The events of one journal part, in ``seq`` order (page checksums verified)."""
    table = pq.read_table(path, page_checksum_verification=True)
    if (table.schema.metadata or {}).get(META_JOURNAL) is None or table.schema.names != list(
        JOURNAL_SCHEMA.names
    ):
        raise JournalError(f"{path} is not a telemetry journal part")
    events: list[Event] = []
    decode = _decoder().decode
    for blob, count in zip(
        table.column("events").to_pylist(), table.column("count").to_pylist(), strict=True
    ):
        try:
            decoded = decode(blob)
        except msgspec.DecodeError as exc:
            raise JournalError(f"{path}: cannot decode its events: {exc}") from None
        if len(decoded) != count:
            raise JournalError(f"{path}: holds {len(decoded)} events, its row says {count}")
        events.extend(decoded)
    return events


def group_by_type(events: Iterable[Event]) -> dict[str, list[Event]]:
    """Events per type tag, each list in the order given (grouped in C where the native
    converter is built: the writer groups every burst)."""
    groups: dict[type[Event], list[Event]]
    if _native is not None and type(events) is list:
        groups = _native.group(events)
    else:
        groups = defaultdict(list)
        for event in events:
            groups[type(event)].append(event)
    return {event_tag(cls): found for cls, found in groups.items()}


def unconverted(
    events: Iterable[Event], typed_max_seq: Callable[[str], int]
) -> dict[str, list[Event]]:
    """Journal events per type that no typed part holds yet (see the module docstring).

    ``typed_max_seq(tag)``: the largest ``seq`` in that type's typed parts of the same
    rank (-1: none); asked once per type present.
    """
    out: dict[str, list[Event]] = {}
    for tag, found in group_by_type(events).items():
        floor = typed_max_seq(tag)
        kept = [e for e in found if e.seq > floor]
        if kept:
            out[tag] = kept
    return out
