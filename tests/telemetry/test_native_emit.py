"""The hub's native emit fast path records exactly what its Python path records.

``open_run`` gives a hub whose ``emit`` is one C call (``esper.telemetry._emit``) where
the module was built, and the locked Python path with ``native=False`` (or without the
module). Both must filter, stamp, order and refuse events the same way, also with
several producer threads racing the writer's drains and a full buffer.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from _telemetry_support import all_seqs, minimal_event, read_all, read_type

from esper.core.enums import TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry import fast_emit
from esper.telemetry.arrow_schema import slot_descriptor
from esper.telemetry.emit_log import EmitLogHub
from esper.telemetry.events import EVENT_LEVELS, Event
from esper.telemetry.hub import Hub, TelemetryHub, open_run
from esper.telemetry.writer import EventWriter, TelemetryWriteError

needs_native = pytest.mark.skipif(
    fast_emit._native is None, reason="the native emit fast path was not built here"
)
PATHS = pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
#: Small enough that producers fill it and take the blocking path many times.
SMALL_QUEUE = 16
LARGE_QUEUE = 1 << 20
#: The writer drains its buffer every half of this.
FAST_DRAINS_S = 0.002
THREADS = 4
PER_THREAD = 1500
SWITCH_INTERVAL_S = 1e-6


def _script(i: int) -> list[Event]:
    """Events of step ``i``: normal and lifecycle ones, and a debug one (filtered at
    normal, recorded once the level is raised)."""
    return [
        minimal_event(ev.EnvStep, step=i),
        minimal_event(ev.LayerGradStats, step=i),
        minimal_event(ev.RewardComputed, step=i),
        minimal_event(ev.SeedGerminated, step=i),
    ]


def _record(root: Path, name: str, *, native: bool, steps: int = 300) -> Path:
    hub = open_run(root, name, level=TelemetryLevel.NORMAL, native=native)
    assert isinstance(hub, TelemetryHub)
    outer: Hub = EmitLogHub(hub, root / f"{name}.log")  # a delegating hub in front
    for i in range(steps):
        if i == steps // 3:
            outer.set_level(TelemetryLevel.DEBUG, reason="test", round=0, until_round=1)
        if i == 2 * steps // 3:
            outer.level = TelemetryLevel.LIFECYCLE  # the delegating setter reaches it
        for event in _script(i):
            outer.emit(event)
    outer.close()
    assert hub.run_dir is not None
    return hub.run_dir


Rows = dict[str, list[dict[str, object]]]
#: Fields that differ between two runs of the same events (times, names, writer timing).
VOLATILE = {"ts_ns", "run_id", "blocked_ns", "flushes", "bytes_written", "max_queue_depth"}


def _without_times(rows: Rows) -> Rows:
    return {
        tag: [{k: v for k, v in row.items() if k not in VOLATILE} for row in rows_of_type]
        for tag, rows_of_type in rows.items()
    }


def test_fast_and_python_paths_record_the_same_events(tmp_path: Path) -> None:
    fast = read_all(_record(tmp_path, "fast", native=True))
    slow = read_all(_record(tmp_path, "slow", native=False))
    assert _without_times(fast) == _without_times(slow)
    steps = [r["step"] for r in fast["layer_grad_stats"]]
    assert steps == list(range(100, 200))  # recorded only while the level was debug
    assert len(fast["env_step"]) == 200  # filtered once the level dropped to lifecycle
    seqs = sorted(r["seq"] for rows in fast.values() for r in rows)
    assert seqs == list(range(len(seqs)))  # filtered events consume no seq


def _produce(hub: Hub, thread: int, start: threading.Barrier) -> None:
    start.wait()
    for i in range(PER_THREAD):
        hub.emit(minimal_event(ev.EnvStep, env=thread, step=i))


@pytest.fixture
def eager_thread_switches() -> Iterator[None]:
    """Switch threads as often as the interpreter can, so the producers' appends land
    between any two steps of the writer's drain."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    yield
    sys.setswitchinterval(interval)


@PATHS
@pytest.mark.parametrize("queue", [SMALL_QUEUE, LARGE_QUEUE], ids=["full", "room"])
@pytest.mark.usefixtures("eager_thread_switches")
def test_concurrent_producers_lose_nothing_and_keep_their_order(
    tmp_path: Path, native: bool, queue: int
) -> None:
    """With a small queue the producers block again and again; with room, the writer
    drains (every millisecond) while they append on the fast path."""
    hub = open_run(
        tmp_path,
        "race",
        level=TelemetryLevel.NORMAL,
        queue_capacity=queue,
        flush_interval_s=FAST_DRAINS_S,
        native=native,
    )
    start = threading.Barrier(THREADS)
    threads = [threading.Thread(target=_produce, args=(hub, t, start)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hub.close()
    assert hub.run_dir is not None
    rows = read_type(hub.run_dir, "env_step")  # sorted by seq
    assert [r["seq"] for r in rows] == list(range(THREADS * PER_THREAD))
    for thread in range(THREADS):  # each producer's events in its own order
        assert [r["step"] for r in rows if r["env"] == thread] == list(range(PER_THREAD))
    (stats,) = read_type(hub.run_dir, "writer_stats")
    assert stats["events_written"] == THREADS * PER_THREAD and stats["dropped"] == 0


@PATHS
def test_refusals_are_the_same_on_both_paths(tmp_path: Path, native: bool) -> None:
    hub = open_run(tmp_path, "refuse", level=TelemetryLevel.NORMAL, native=native)

    class NotInCatalogue(Event, frozen=True, gc=False, kw_only=True):
        pass

    with pytest.raises(TypeError, match="NotInCatalogue is not an event type"):
        hub.emit(NotInCatalogue())
    event = minimal_event(ev.EnvStep)
    hub.emit(event)
    with pytest.raises(ValueError, match="already emitted"):
        hub.emit(event)
    assert hub.next_seq == 1 and hub.events_emitted == 1
    hub.close()
    with pytest.raises(TelemetryWriteError, match="is closed"):
        hub.emit(minimal_event(ev.EnvStep))
    assert all_seqs(tmp_path / "refuse") == [0, 1]  # the event and the final stats


@PATHS
def test_resumed_seq_continues_from_start_seq(tmp_path: Path, native: bool) -> None:
    hub = open_run(tmp_path, "seq", level=TelemetryLevel.NORMAL, start_seq=40, native=native)
    for i in range(3):
        hub.emit(minimal_event(ev.EnvStep, step=i))
    assert (hub.next_seq, hub.events_emitted) == (43, 3)
    hub.close()
    assert sorted(all_seqs(tmp_path / "seq")) == [40, 41, 42, 43]


def _emitter(**changes: object) -> Any:
    """A native Emitter with working arguments, ``changes`` applied."""
    assert fast_emit._native is not None
    args: dict[str, object] = {
        "base": Event,
        "descriptors": tuple(slot_descriptor(Event, f) for f in fast_emit.STAMPED_FIELDS),
        "levels": {cls: int(level) for cls, level in EVENT_LEVELS.items()},
        "buffer": [],
        "capacity": 8,
        "run_id": "r",
        "rank": 0,
        "seq": 0,
        "level": int(TelemetryLevel.NORMAL),
        "slow": print,
    }
    args.update(changes)
    return fast_emit._native.Emitter(**args)


@needs_native
def test_the_emitter_checks_its_arguments() -> None:
    descriptors = tuple(slot_descriptor(Event, f) for f in fast_emit.STAMPED_FIELDS)
    _emitter()
    with pytest.raises(TypeError, match="not a subclass"):
        _emitter(levels={int: 1})
    with pytest.raises(TypeError, match="is not an int"):
        _emitter(levels={ev.EnvStep: 1.5})
    with pytest.raises(TypeError, match="object slot"):
        _emitter(descriptors=(*descriptors[:3], slot_descriptor(ev.EnvStep, "train_loss")))
    with pytest.raises(ValueError, match="capacity"):
        _emitter(capacity=0)
    with pytest.raises(TypeError, match="callable"):
        _emitter(slow=3)


@needs_native
def test_the_fast_path_holds_exactly_the_references_it_should() -> None:
    """Each stamped event holds the run id once, the buffer holds each event once, and
    nothing is left behind once both are gone (a leak in C would show here)."""
    run_id = "".join(["refcount-", "probe"])  # a fresh str, not an interned constant
    buffer: list[Event] = []
    emitter = _emitter(buffer=buffer, capacity=1 << 16, run_id=run_id)
    template = minimal_event(ev.EnvStep)
    events = [msgspec.structs.replace(template) for _ in range(1000)]
    before_run_id, before_event = sys.getrefcount(run_id), sys.getrefcount(events[0])
    for event in events:
        emitter.emit(event)
    after_run_id, after_event = sys.getrefcount(run_id), sys.getrefcount(events[0])
    assert after_run_id == before_run_id + len(events)
    assert after_event == before_event + 1  # the buffer's
    in_order = buffer == events and [e.seq for e in events] == list(range(1000))
    buffer.clear()
    released_event = sys.getrefcount(events[0])
    del events, event  # the loop variable held the last one
    released_run_id = sys.getrefcount(run_id)
    assert in_order
    assert (released_event, released_run_id) == (before_event, before_run_id)


def test_the_emit_module_is_built_where_ci_runs() -> None:
    """setup.py builds it as optional: a broken build would only show up as lost speed."""
    if not os.environ.get("CI"):
        pytest.skip("CI is not set: this build check runs under CI only (CI=1 to run it here)")
    assert fast_emit._native is not None


class _AppendsWhileCopied(list[object]):
    """A buffer that gets an append (as from a producer thread) in the middle of being
    copied, whichever way the writer copies it."""

    def __getitem__(self, index: Any) -> Any:
        taken = super().__getitem__(index)
        if isinstance(index, slice):
            super().append("late")
        return taken

    def copy(self) -> list[object]:
        taken = list(self)
        super().append("late")
        return taken


def test_a_drain_keeps_what_is_appended_while_it_copies() -> None:
    """The native emit appends without the writer's lock: an event appended between the
    drain's copy and its removal must stay buffered for the next drain, not be lost."""
    holder = SimpleNamespace(buffer=_AppendsWhileCopied(["a", "b"]))
    assert EventWriter._take_buffered(holder) == ["a", "b"]  # type: ignore[arg-type]
    assert holder.buffer == ["late"]
