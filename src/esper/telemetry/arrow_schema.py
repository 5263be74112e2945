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
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

import msgspec
import msgspec.inspect as mi
import pyarrow as pa

from esper.core.native import load_native
from esper.telemetry.events import ENVELOPE_FIELDS, SCHEMA_VERSION, Event, event_tag

#: File-metadata keys written into every Parquet file.
META_SCHEMA_VERSION: Final = b"esper.schema_version"
META_EVENT_TYPE: Final = b"esper.event_type"
#: Events converted per slice: one slice's events and field values stay in the CPU cache
#: while Arrow converts their rows (1,024 measured best of 256-16,384 on the writer
#: benchmark's mix, for this conversion and the column-wise one before it).
CONVERT_SLICE_EVENTS: Final = 1024
#: Events per native conversion: its cost per slice (an Arrow array per column) is paid
#: once per this many events, and the buffers it fills stay a few MB.
NATIVE_SLICE_EVENTS: Final = 16384
#: A conversion of this many events reads its values with the GIL released (the
#: producer's thread runs meanwhile); a smaller one keeps the GIL rather than wait up
#: to a switch interval (5 ms) to take it back while the producer runs Python.
RELEASE_GIL_EVENTS: Final = 4096
#: Arrow string and list offsets are int32.
_OFFSET_BYTES: Final = 4

_astuple = msgspec.structs.astuple

#: The native converter (``_columns.c``), or None where it was not built or
#: ``ESPER_NATIVE=0`` turns it off (:mod:`esper.core.native`).
_native = load_native("esper.telemetry._columns")

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


def events_to_table(cls: type[Event], events: list[Event], *, native: bool = True) -> pa.Table:
    """Columnar table of events that all have exactly type ``cls`` (see
    :func:`events_to_tables`)."""
    return events_to_tables({cls: events}, native=native)[cls]


def events_to_tables(
    groups: Mapping[type[Event], list[Event]],
    *,
    native: bool = True,
    release_gil: bool | None = None,
) -> dict[type[Event], pa.Table]:
    """One columnar table per type, of events that all have exactly that type.

    With the native converter (:mod:`esper.telemetry._columns`, built at install where a
    C compiler is present; ``native=False`` or ``ESPER_NATIVE=0`` leave it out)
    each slice's field values go straight from the Structs' slots into Arrow buffers:
    0.37 against 1.12 us per event on the writer benchmark's mix. Every slice of every
    type is converted in one call that reads most values with the GIL released, so a
    producer thread keeps running (``release_gil``; None: from :data:`RELEASE_GIL_EVENTS`
    events on; ``benchmarks/convert.py``: the same CPU per event either way). A slice
    it declines (a value outside the catalogue's shapes) and every slice without it go
    through :func:`_arrow_slice`. The tables are the same either way, bit for bit.
    """
    plans = {cls: _native_plan(cls) for cls in groups} if native and _native else None
    slice_events = CONVERT_SLICE_EVENTS if plans is None else NATIVE_SLICE_EVENTS
    bounds = {cls: _slices(len(events), slice_events) for cls, events in groups.items()}
    if release_gil is None:
        release_gil = sum(len(events) for events in groups.values()) >= RELEASE_GIL_EVENTS
    converted = iter(() if plans is None else _native_slices(groups, bounds, plans, release_gil))
    tables = {}
    for cls, events in groups.items():
        schema = event_schema(cls)
        chunks: list[list[pa.Array]] = [[] for _ in cls.__struct_fields__]
        for start, stop in bounds[cls]:
            arrays = next(converted, None)
            if arrays is None:
                arrays = _arrow_slice(cls, events[start:stop])
            for column, array in zip(chunks, arrays, strict=True):
                column.append(array)
        if not events:
            tables[cls] = schema.empty_table()
            continue
        fields = dict(zip(cls.__struct_fields__, chunks, strict=True))
        tables[cls] = pa.Table.from_arrays(
            [pa.chunked_array(fields[f.name], type=f.type) for f in schema], schema=schema
        )
    return tables


def _slices(n: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def _arrow_slice(cls: type[Event], events: list[Event]) -> list[pa.Array]:
    """One slice's columns (``cls.__struct_fields__`` order) by pyarrow's converter.

    Each event is read once, in C (``msgspec.structs.astuple``), and Arrow converts the
    rows into one struct array in a single pass, whose fields are the columns (no copy).
    Transposing the rows in Python (``zip``) and converting column by column cost 1.27x
    this (1.44 against 1.14 us per event on the writer benchmark's mix).
    """
    rows = pa.array(list(map(_astuple, events)), type=_row_type(cls))
    return rows.flatten()  # type: ignore[no-any-return]


@functools.cache
def _row_type(cls: type[Event]) -> pa.StructType:
    """One event as an Arrow struct: the schema's fields in ``astuple(event)`` order."""
    schema = event_schema(cls)
    return pa.struct([schema.field(name) for name in cls.__struct_fields__])


class _NativePlan(NamedTuple):
    descriptors: tuple[object, ...]  # the fields' member descriptors (slot offsets)
    kinds: bytes  # one _KINDS code per field
    types: tuple[pa.DataType, ...]


#: Native converter codes (``_columns.c``) of scalars, and of lists of them.
_KINDS: Final[dict[pa.DataType, str]] = {
    pa.int64(): "q",
    pa.float64(): "d",
    pa.bool_(): "?",
    pa.string(): "s",
}
_LIST_KINDS: Final[dict[pa.DataType, str]] = {
    pa.int64(): "Q",
    pa.float64(): "D",
    pa.bool_(): "B",
    pa.string(): "S",
}


@functools.cache
def _native_plan(cls: type[Event]) -> _NativePlan:
    """What the native converter needs to know about ``cls``, computed once."""
    schema = event_schema(cls)
    types = tuple(schema.field(name).type for name in cls.__struct_fields__)
    kinds = "".join(_LIST_KINDS[t.value_type] if pa.types.is_list(t) else _KINDS[t] for t in types)
    descriptors = tuple(slot_descriptor(cls, name) for name in cls.__struct_fields__)
    return _NativePlan(descriptors, kinds.encode("ascii"), types)


def slot_descriptor(cls: type, name: str) -> object:
    """The member descriptor of field ``name`` (the class attribute, not a default)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    raise AttributeError(f"{cls.__name__} has no slot for field {name!r}")


def _native_slices(
    groups: Mapping[type[Event], list[Event]],
    bounds: dict[type[Event], list[tuple[int, int]]],
    plans: dict[type[Event], _NativePlan],
    release_gil: bool,
) -> list[list[pa.Array] | None]:
    """Every slice's columns from one native call, in ``groups``/``bounds`` order (None
    where it declines a slice)."""
    assert _native is not None
    jobs = [
        (cls, events, plans[cls].descriptors, plans[cls].kinds, start, stop)
        for cls, events in groups.items()
        for start, stop in bounds[cls]
    ]
    found = _native.convert_many(jobs, release_gil)
    return [
        None
        if buffers is None
        else [_array(t, stop - start, b) for t, b in zip(plans[cls].types, buffers, strict=True)]
        for (cls, _, _, _, start, stop), buffers in zip(jobs, found, strict=True)
    ]


def _array(dtype: pa.DataType, n: int, buffers: Any) -> pa.Array:
    """An Arrow array over the native converter's buffers (no copy, no nulls): the values
    (int64, float64, bool), (offsets, data) for strings, (offsets, items) for lists;
    each buffer an object of the buffer protocol that owns its memory."""
    if not isinstance(buffers, tuple):
        return pa.Array.from_buffers(dtype, n, [None, pa.py_buffer(buffers)])
    offsets, rest = buffers
    if not pa.types.is_list(dtype):
        return pa.Array.from_buffers(dtype, n, [None, pa.py_buffer(offsets), pa.py_buffer(rest)])
    items = int.from_bytes(memoryview(offsets)[-_OFFSET_BYTES:], "little", signed=True)
    child = _array(dtype.value_type, items, rest)
    return pa.Array.from_buffers(dtype, n, [None, pa.py_buffer(offsets)], children=[child])


def schema_description(cls: type[Event]) -> list[dict[str, object]]:
    """Plain description of the Arrow schema (for ``schemas/arrow/<type>.json``)."""
    return [
        {"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in event_schema(cls)
    ]
