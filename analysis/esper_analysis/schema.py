"""Polars schemas of the event tables: the writer's Arrow schemas, as polars types.

Every scan is typed by the *current* catalogue, so an older schema version's missing
columns come back as null, and an empty typed frame can be built for an event type
that was never written.
"""

from __future__ import annotations

from functools import cache
from typing import Final

import polars as pl

from esper.telemetry.arrow_schema import event_schema
from esper.telemetry.events import ENVELOPE_FIELDS, EVENT_TYPES


@cache
def polars_schema(event_type: str) -> pl.Schema:
    """Column names and dtypes of one event table: envelope first, then the payload."""
    cls = EVENT_TYPES.get(event_type)
    if cls is None:
        raise KeyError(f"unknown event type {event_type!r}")
    frame = pl.from_arrow(event_schema(cls).empty_table())
    assert isinstance(frame, pl.DataFrame)
    return frame.schema


#: The envelope's columns, which every event table has.
ENVELOPE: Final = pl.Schema(
    {name: polars_schema(next(iter(EVENT_TYPES)))[name] for name in ENVELOPE_FIELDS}
)


@cache
def empty_frame(event_type: str) -> pl.LazyFrame:
    """A typed, empty lazy frame for an event type with no rows in a run."""
    return pl.LazyFrame(schema=polars_schema(event_type))


def known_event_types() -> tuple[str, ...]:
    """Every event type of the current catalogue, in catalogue order."""
    return tuple(EVENT_TYPES)
