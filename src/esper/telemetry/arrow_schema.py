"""Arrow schemas derived from the event Structs, and events -> Arrow tables.

The Struct annotations are the single source of truth: ``str`` -> string, ``int`` ->
int64, ``float`` -> float64, ``bool`` -> bool, ``list[T]`` -> list of T. Columns are the
envelope first, then the payload in declaration order. There is no ``type`` column: the
event type is the directory name and is stored in the file metadata with the schema
version. Every top-level column is non-nullable because every event carries every
field; floats keep NaN and infinities as values (never nulls).
"""

from __future__ import annotations

import functools
from typing import Final

import msgspec
import msgspec.inspect as mi
import pyarrow as pa

from esper.telemetry.events import ENVELOPE_FIELDS, SCHEMA_VERSION, Event, event_tag

#: File-metadata keys written into every Parquet file.
META_SCHEMA_VERSION: Final = b"esper.schema_version"
META_EVENT_TYPE: Final = b"esper.event_type"
_astuple = msgspec.structs.astuple

_SCALARS: Final[dict[type[mi.Type], pa.DataType]] = {
    mi.StrType: pa.string(),
    mi.IntType: pa.int64(),
    mi.FloatType: pa.float64(),
    mi.BoolType: pa.bool_(),
}


class UnsupportedFieldType(TypeError):
    """An event field uses a type the Arrow mapping does not cover (a catalogue bug)."""


def arrow_type(info: mi.Type) -> pa.DataType:
    """Map one msgspec type description to its Arrow type."""
    scalar = _SCALARS.get(type(info))
    if scalar is not None:
        return scalar
    if isinstance(info, mi.ListType):
        item = _SCALARS.get(type(info.item_type))
        if item is not None:
            return pa.list_(item)
    raise UnsupportedFieldType(f"no Arrow mapping for event field type {info!r}")


@functools.cache
def column_names(cls: type[Event]) -> tuple[str, ...]:
    """Envelope fields first, then the payload fields in declaration order."""
    payload = tuple(f for f in cls.__struct_fields__ if f not in ENVELOPE_FIELDS)
    return tuple(ENVELOPE_FIELDS) + payload


@functools.cache
def event_schema(cls: type[Event]) -> pa.Schema:
    """The Arrow schema of ``cls``'s table, with version and type in its metadata."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    types = {f.name: arrow_type(f.type) for f in info.fields}
    fields = [pa.field(name, types[name], nullable=False) for name in column_names(cls)]
    metadata = {
        META_SCHEMA_VERSION: str(SCHEMA_VERSION).encode(),
        META_EVENT_TYPE: event_tag(cls).encode(),
    }
    return pa.schema(fields, metadata=metadata)


def events_to_table(cls: type[Event], events: list[Event]) -> pa.Table:
    """Columnar table of events that all have exactly type ``cls``.

    Each event is read once, in C (``msgspec.structs.astuple``), and pyarrow converts
    the rows into one struct array in a single pass, whose fields are the columns (a
    Struct's fields are in :func:`column_names` order: the envelope first).
    """
    schema = event_schema(cls)
    if not events:
        return schema.empty_table()
    rows = pa.array(list(map(_astuple, events)), type=_row_type(cls))
    batch = pa.RecordBatch.from_struct_array(rows).replace_schema_metadata(schema.metadata)
    return pa.Table.from_batches([batch], schema=schema)


@functools.cache
def _row_type(cls: type[Event]) -> pa.StructType:
    """One event as an Arrow struct: the schema's fields, which are in ``astuple`` order."""
    schema = event_schema(cls)
    if tuple(schema.names) != cls.__struct_fields__:  # a catalogue bug, not an input error
        raise UnsupportedFieldType(f"{cls.__name__}: fields are not in envelope-first order")
    return pa.struct(list(schema))


def schema_description(cls: type[Event]) -> list[dict[str, object]]:
    """Plain description of the Arrow schema (for ``schemas/arrow/<type>.json``)."""
    return [
        {"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in event_schema(cls)
    ]
