"""A batch of events of one type as columns: one step's events for every env at once.

Why: building one Struct per env per event type (and stamping each) is a Python loop
per env in every step, which is what keeps a step's host time growing with the number
of envs. A producer that already holds a step's numbers as arrays hands them over as
columns instead; the hub stamps the whole batch in O(1) (a ``seq`` range, one
timestamp) and the writer thread turns the columns into the type's Arrow table. The
files on disk are the ones the Structs would give: same columns, types and values.

A column is either one value per event (a 1-D numpy array, a list, an Arrow array, or
for a list field a 2-D numpy array whose rows are the lists, or an object array of
lists) or a single value every event shares (for a list field: a plain list).
Columns hand over their data: a producer must not change an array after emitting it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import msgspec.inspect
import numpy as np
import pyarrow as pa

from esper.telemetry.arrow_schema import column_names, event_schema
from esper.telemetry.events import ENVELOPE_FIELDS, UNSTAMPED_SEQ, Event

#: Envelope fields the hub stamps; a producer gives the other envelope fields.
STAMPED_FIELDS: Final = ("run_id", "seq", "ts_ns", "rank")


class EventColumns:
    """``n`` events of type ``cls`` whose fields are ``columns`` (unstamped until emitted).

    Every field without a default must be given; fields with a default may be left out
    and take it. Unknown field names are refused (a producer bug, named)."""

    __slots__ = ("cls", "columns", "n", "rank", "run_id", "seq", "ts_ns")

    def __init__(self, cls: type[Event], n: int, columns: Mapping[str, Any]) -> None:
        known, required = _fields(cls)
        unknown = columns.keys() - known
        missing = required - columns.keys()
        if unknown or missing:
            raise TypeError(
                f"{cls.__name__} columns: unknown {sorted(unknown)}, missing {sorted(missing)}"
            )
        self.cls = cls
        self.n = n
        self.columns = dict(columns)
        self.run_id = ""
        self.seq = UNSTAMPED_SEQ
        self.ts_ns = 0
        self.rank = 0

    @property
    def last_seq(self) -> int:
        return self.seq + self.n - 1

    def stamp(self, run_id: str, seq: int, ts_ns: int, rank: int) -> None:
        """Give the batch its envelope: ``seq`` .. ``seq + n - 1``, one timestamp."""
        if self.seq != UNSTAMPED_SEQ:
            raise ValueError(f"{self.cls.__name__} columns were already emitted")
        self.run_id, self.seq, self.ts_ns, self.rank = run_id, seq, ts_ns, rank

    def table(self) -> pa.Table:
        """The events as the type's Arrow table (the writer thread calls this)."""
        schema = event_schema(self.cls)
        arrays = [self._array(name, schema.field(name).type) for name in schema.names]
        return pa.Table.from_arrays(arrays, schema=schema)

    def events(self) -> list[Event]:
        """The events as Structs (for in-memory hubs and tests, not the hot path)."""
        rows = self.table().to_pylist()
        return msgspec.convert(rows, list[self.cls])  # type: ignore[name-defined]

    def _array(self, name: str, kind: pa.DataType) -> pa.Array:
        if name == "seq":
            return pa.array(np.arange(self.seq, self.seq + self.n, dtype=np.int64))
        if name in STAMPED_FIELDS:
            return pa.repeat(pa.scalar(getattr(self, name), type=kind), self.n)
        value = self.columns.get(name, _MISSING)
        if value is _MISSING:
            value = _defaults(self.cls)[name]
        if isinstance(value, pa.Array):  # built by the producer (e.g. ragged lists)
            return value if value.type == kind else value.cast(kind)
        if isinstance(value, np.ndarray) and value.ndim == 2:  # rows are the lists
            offsets = np.arange(self.n + 1, dtype=np.int32) * value.shape[1]
            flat = pa.array(value.reshape(-1), type=kind.value_type)
            return pa.ListArray.from_arrays(pa.array(offsets), flat)
        if isinstance(value, np.ndarray | list | tuple) and not _is_list_scalar(value, kind):
            if len(value) != self.n:
                raise ValueError(
                    f"{self.cls.__name__}.{name}: {len(value)} values for {self.n} events"
                )
            if isinstance(value, np.ndarray) and value.dtype != object:
                return pa.array(value).cast(kind)
            return pa.array(value, type=kind)
        return pa.repeat(pa.scalar(value, type=kind), self.n)


_MISSING: Final = object()


def _is_list_scalar(value: object, kind: pa.DataType) -> bool:
    """A plain list given for a list field is the value every event shares."""
    return pa.types.is_list(kind) and isinstance(value, list | tuple)


@functools.cache
def _fields(cls: type[Event]) -> tuple[frozenset[str], frozenset[str]]:
    """Names a producer may give, and those it must give (no default)."""
    payload = [f for f in column_names(cls) if f not in STAMPED_FIELDS]
    defaults = _defaults(cls)
    return frozenset(payload), frozenset(f for f in payload if f not in defaults)


@functools.cache
def _defaults(cls: type[Event]) -> dict[str, Any]:
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    out: dict[str, Any] = {}
    for f in info.fields:
        if f.default is not msgspec.NODEFAULT:
            out[f.name] = f.default
        elif f.default_factory is not msgspec.NODEFAULT:
            out[f.name] = f.default_factory()
    return out


assert set(STAMPED_FIELDS) <= set(ENVELOPE_FIELDS)
