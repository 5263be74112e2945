"""The hub's native emit fast path (:mod:`esper.telemetry._emit`), where it is built.

One C call filters, checks, stamps and appends an event (about a quarter of the Python
path's cost: benchmarks/README.md, "Native emit"). It is atomic under the GIL, so the
hub's lock is not taken on the fast path; the writer takes events with operations an
append cannot split (``EventWriter._take_buffered``). Any case
off the fast path goes back to the hub's Python ``emit``, which stamps through the same
counter (``Emitter.push``). Without the module (no C compiler, ``ESPER_NATIVE=0``, or a
free-threaded interpreter) :func:`native_emitter` returns None and the hub keeps its
locked Python path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from esper.core.enums import TelemetryLevel
from esper.core.native import load_native
from esper.telemetry.arrow_schema import slot_descriptor
from esper.telemetry.events import EVENT_LEVELS, Event

if TYPE_CHECKING:
    from esper.telemetry._emit import Emitter

_native = load_native("esper.telemetry._emit")
#: The envelope fields the hub stamps (the rest of the envelope is the producer's), in
#: the order the module takes them.
STAMPED_FIELDS: Final = ("run_id", "seq", "ts_ns", "rank")


def native_emitter(
    *,
    buffer: list[Event],
    capacity: int,
    run_id: str,
    rank: int,
    start_seq: int,
    level: TelemetryLevel,
    slow: Callable[[Event], None],
) -> Emitter | None:
    """The fast path for one hub's ``buffer``, or None where the module is unavailable."""
    if _native is None:
        return None
    emitter: Emitter = _native.Emitter(
        Event,
        tuple(slot_descriptor(Event, name) for name in STAMPED_FIELDS),
        {cls: int(lv) for cls, lv in EVENT_LEVELS.items()},
        buffer,
        capacity,
        run_id,
        rank,
        start_seq,
        int(level),
        slow,
    )
    return emitter
