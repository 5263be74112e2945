"""Polars schemas of the event tables, derived from the msgspec catalogue.

The analysis layer scans every Parquet file against the *current* catalogue's schema,
so files written by an older schema version come back with their missing columns as
null, and an empty typed frame can be built for an event type that was never written.
"""

from __future__ import annotations

from functools import cache
from typing import Final

import msgspec
import polars as pl

from esper.telemetry.events import ENVELOPE_FIELDS, EVENT_TYPES

_SCALARS: Final[dict[type[msgspec.inspect.Type], pl.DataType]] = {
    msgspec.inspect.IntType: pl.Int64(),
    msgspec.inspect.FloatType: pl.Float64(),
    msgspec.inspect.BoolType: pl.Boolean(),
    msgspec.inspect.StrType: pl.String(),
}


def _dtype(t: msgspec.inspect.Type) -> pl.DataType:
    scalar = _SCALARS.get(type(t))
    if scalar is not None:
        return scalar
    if isinstance(t, msgspec.inspect.ListType | msgspec.inspect.VarTupleType):
        return pl.List(_dtype(t.item_type))
    raise TypeError(f"no polars dtype for catalogue field type {t!r}")


@cache
def event_schema(event_type: str) -> pl.Schema:
    """Column names and dtypes of one event table: envelope first, then the payload."""
    cls = EVENT_TYPES.get(event_type)
    if cls is None:
        raise KeyError(f"unknown event type {event_type!r}")
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    by_name = {f.name: _dtype(f.type) for f in info.fields}
    ordered = [name for name in ENVELOPE_FIELDS] + [
        f.name for f in info.fields if f.name not in ENVELOPE_FIELDS
    ]
    return pl.Schema([(name, by_name[name]) for name in ordered])


def empty_frame(event_type: str) -> pl.LazyFrame:
    """A typed, empty lazy frame for an event type with no rows in a run."""
    return pl.LazyFrame(schema=event_schema(event_type))


def known_event_types() -> tuple[str, ...]:
    """Every event type of the current catalogue, in catalogue order."""
    return tuple(EVENT_TYPES)
