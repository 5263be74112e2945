"""The telemetry hub: the one object producers call, with an O(1) ``emit``.

``emit`` filters by level, stamps the envelope (``run_id``, ``seq``, ``ts_ns``,
``rank``) in place and appends the event to the writer's bounded buffer under a lock:
no encoding, no I/O, no device sync (about half a microsecond). Filtering happens
before stamping, so a filtered event never consumes a ``seq`` and
``seq`` has no gaps per run and rank. ``emit_columns`` takes a whole step's events of one
type as columns (:mod:`esper.telemetry.event_columns`) and stamps them at once: no
per-event Python at all; ``emit_batch`` stamps a batch of Structs (a step's lifecycle
records) with consecutive seqs and one timestamp, each field set over the batch in C.
Everything else (Arrow conversion, Parquet, the manifest) happens in the writer thread
(:mod:`esper.telemetry.writer`).

Three implementations share the :class:`Hub` interface: :class:`TelemetryHub` (the
real one, from :func:`open_run`), :class:`NullHub` (level ``off``: writes nothing at
all) and :class:`~esper.telemetry.memory_hub.MemoryHub` (keeps stamped events in a
list, for tests and benchmarks).
"""

from __future__ import annotations

import atexit
import contextlib
import operator
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from itertools import repeat
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import msgspec

from esper.core.enums import RunStatus, TelemetryLevel
from esper.errors import UserError
from esper.telemetry.event_columns import EventColumns
from esper.telemetry.events import (
    EVENT_LEVELS,
    SCHEMA_VERSION,
    UNSTAMPED_SEQ,
    Event,
    TelemetryLevelChanged,
    set_fields,
)
from esper.telemetry.lock import RunLock, acquire_run_lock
from esper.telemetry.manifest import WriterCounters, new_manifest
from esper.telemetry.paths import resolve_run_dir, validate_run_id
from esper.telemetry.resume import prepare_new, prepare_resume
from esper.telemetry.sink import ParquetSink, PartSink
from esper.telemetry.writer import EventWriter, TelemetryWriteError, writer_stats_event

DEFAULT_FLUSH_INTERVAL_S: Final = 1.0
DEFAULT_QUEUE_CAPACITY: Final = 65536

_force_setattr = msgspec.structs.force_setattr
_SEQ_OF = operator.attrgetter("seq")
_time_ns = time.time_ns
_LEVELS = EVENT_LEVELS


def _level_name(level: TelemetryLevel) -> str:
    return level.name.lower()


def _unknown_event(event: object) -> TypeError:
    return TypeError(f"{type(event).__name__} is not an event type of the catalogue")


def _already_emitted(event: Event) -> ValueError:
    return ValueError(
        f"{type(event).__name__} with seq={event.seq} was already emitted; build a new event"
    )


class Hub:
    """Interface shared by every hub; producers should annotate with this type.

    It holds no state: :class:`StampingHub` owns a run's ``seq`` counter and stamps
    envelopes; :class:`DelegatingHub` wraps another hub and forwards to it.
    """

    run_id: str
    rank: int
    level: TelemetryLevel
    run_dir: Path | None

    def enabled(self, level: TelemetryLevel) -> bool:
        """Whether events of ``level`` are recorded (use it to skip building them)."""
        return level <= self.level

    def emit(self, event: Event) -> None:
        raise NotImplementedError

    def emit_batch(self, events: Sequence[Event]) -> None:
        """Emit events of one level (of one type or several), in order: one call for a
        whole step's events (the hubs that buffer take their lock once; this default
        emits them one by one)."""
        for event in events:
            self.emit(event)

    def emit_columns(self, batch: EventColumns) -> None:
        """Emit ``batch.n`` events of one type given as columns, in row order (one
        ``seq`` each, one timestamp for all): a step's events without a Struct per env."""
        raise NotImplementedError

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next recorded event gets (store it in checkpoints)."""
        raise NotImplementedError

    @property
    def events_emitted(self) -> int:
        """Events recorded by this hub (filtered and dropped events excluded)."""
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        raise NotImplementedError

    def set_level(
        self, level: TelemetryLevel, *, reason: str, round: int, until_round: int
    ) -> None:
        """Change the level (e.g. escalate to debug); the change is itself an event."""
        self.emit(
            TelemetryLevelChanged(
                round=round,
                old_level=_level_name(self.level),
                new_level=_level_name(level),
                reason=reason,
                until_round=until_round,
            )
        )
        self.level = level

    def flush(self) -> None:
        """Block until every event emitted so far is durable (no-op for in-memory hubs)."""

    def close(self, status: RunStatus = RunStatus.FINISHED, error: str = "") -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close with the status the exit implies; never swallow the exception."""
        if exc_type is None or exc is None:
            self.close(RunStatus.FINISHED)
            return
        interrupted = issubclass(exc_type, KeyboardInterrupt)
        status = RunStatus.INTERRUPTED if interrupted else RunStatus.FAILED
        try:
            self.close(status, f"{exc_type.__name__}: {exc}")
        except TelemetryWriteError as close_error:
            if close_error is not exc:
                exc.add_note(f"telemetry could not be closed cleanly: {close_error}")


class StampingHub(Hub):
    """A hub that owns the run's ``seq`` counter and stamps each recorded event."""

    def __init__(self, run_id: str, *, level: TelemetryLevel, rank: int, start_seq: int) -> None:
        self.run_id = run_id
        self.rank = rank
        self.level = level
        self.run_dir = None
        self._seq = start_seq
        self._start_seq = start_seq
        self._closed = False

    def _stamp(self, event: Event) -> None:
        """Fill the envelope in place and take the next ``seq`` (caller holds the lock)."""
        seq = self._seq
        self._seq = seq + 1
        _force_setattr(event, "run_id", self.run_id)
        _force_setattr(event, "seq", seq)
        _force_setattr(event, "ts_ns", _time_ns())
        _force_setattr(event, "rank", self.rank)

    def _stamp_all(self, events: Sequence[Event]) -> None:
        """Stamp a batch with the next ``len(events)`` seqs and one timestamp, as a
        batch of columns is (caller holds the lock). Each envelope field is set over the
        whole batch in C (:func:`set_fields`): a step's records cost no Python per record."""
        n = len(events)
        if list(map(_SEQ_OF, events)).count(UNSTAMPED_SEQ) != n:
            raise _already_emitted(next(e for e in events if e.seq != UNSTAMPED_SEQ))
        if len(set(map(id, events))) != n:
            raise ValueError("a batch holds the same event twice; build a new event")
        start = self._seq
        envelope = (
            ("run_id", repeat(self.run_id)),
            ("seq", range(start, start + n)),
            ("ts_ns", repeat(_time_ns())),
            ("rank", repeat(self.rank)),
        )
        set_fields(events, envelope)
        self._seq = start + n

    def _stamp_columns(self, batch: EventColumns) -> None:
        """Stamp a batch of columns with the next ``batch.n`` seqs (caller holds the lock)."""
        batch.stamp(self.run_id, self._seq, _time_ns(), self.rank)
        self._seq += batch.n

    def _check_open(self) -> None:
        """Raise if the hub takes no more events (each hub says why)."""
        if self._closed:
            raise TelemetryWriteError(f"telemetry hub of run {self.run_id!r} is closed")

    def _admitted(self, event: Event) -> bool:
        """Whether one event passes the level filter; raises for an unknown event type,
        a closed hub or an event emitted before."""
        try:
            if _LEVELS[type(event)] > self.level:
                return False
        except KeyError:
            raise _unknown_event(event) from None
        self._check_open()
        if event.seq != UNSTAMPED_SEQ:
            raise _already_emitted(event)
        return True

    def _columns_recorded(self, batch: EventColumns) -> bool:
        """Whether a batch of columns passes the level filter."""
        try:
            return batch.n > 0 and _LEVELS[batch.cls] <= self.level
        except KeyError:
            raise _unknown_event(batch.cls) from None

    def _recorded(self, events: Sequence[Event]) -> bool:
        """Whether a batch of events of one level passes the level filter; raises for an
        unknown event type or a batch of several levels."""
        types = set(map(type, events))
        unknown = types - _LEVELS.keys()
        if unknown:
            raise _unknown_event(next(e for e in events if type(e) in unknown))
        levels = {_LEVELS[t] for t in types}
        if len(levels) > 1:
            names = sorted(t.__name__ for t in types)
            raise ValueError(f"a batch holds events of one level; got {names}")
        return bool(events) and levels.pop() <= self.level

    @property
    def next_seq(self) -> int:
        return self._seq

    @property
    def events_emitted(self) -> int:
        return self.next_seq - self._start_seq

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, status: RunStatus = RunStatus.FINISHED, error: str = "") -> None:
        self._closed = True


class DelegatingHub(Hub):
    """Wraps ``inner``: every piece of state (level, ``seq``, writer) lives there.

    Subclasses override what they change (``emit``, ``close``) and forward the rest; one
    that overrides ``emit`` overrides ``emit_batch`` too.
    """

    def __init__(self, inner: Hub, *, rank: int | None = None) -> None:
        self._inner = inner
        self.run_id = inner.run_id
        self.rank = inner.rank if rank is None else rank
        self.run_dir = inner.run_dir

    @property
    def level(self) -> TelemetryLevel:
        return self._inner.level

    @level.setter
    def level(self, value: TelemetryLevel) -> None:
        self._inner.level = value

    def enabled(self, level: TelemetryLevel) -> bool:
        return self._inner.enabled(level)

    def emit(self, event: Event) -> None:
        self._inner.emit(event)

    def emit_batch(self, events: Sequence[Event]) -> None:
        self._inner.emit_batch(events)

    def emit_columns(self, batch: EventColumns) -> None:
        self._inner.emit_columns(batch)

    @property
    def next_seq(self) -> int:
        return self._inner.next_seq

    @property
    def events_emitted(self) -> int:
        return self._inner.events_emitted

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def flush(self) -> None:
        self._inner.flush()

    def close(self, status: RunStatus = RunStatus.FINISHED, error: str = "") -> None:
        self._inner.close(status, error)


class TelemetryHub(StampingHub):
    """Hub backed by the background Parquet writer; create it with :func:`open_run`."""

    def __init__(
        self,
        run_id: str,
        *,
        level: TelemetryLevel,
        rank: int,
        start_seq: int,
        run_dir: Path,
        writer: EventWriter,
        drop_when_full: bool,
        run_lock: RunLock | None = None,
    ) -> None:
        super().__init__(run_id, level=level, rank=rank, start_seq=start_seq)
        self.run_dir = run_dir
        self._writer = writer
        self._run_lock = run_lock
        self._lock = writer.lock
        self._buf = writer.buffer
        self._capacity = writer.capacity
        self._drop = drop_when_full

    @property
    def manifest_counters(self) -> WriterCounters:
        """Live writer statistics (the same object the manifest reports)."""
        return self._writer.counters

    def _check_open(self) -> None:
        """Raise the writer's failure, or that the hub is closed."""
        if self._closed or self._writer.error is not None:
            self._writer.raise_if_failed()
            raise TelemetryWriteError(f"telemetry hub of run {self.run_id!r} is closed")

    def emit(self, event: Event) -> None:
        """Filter, check, stamp and append (blocks while the buffer is full)."""
        if not self._admitted(event):
            return
        with self._lock:
            if self._writer.buffered >= self._capacity:
                if self._drop:
                    self._writer.counters.dropped += 1
                    return
                self._writer.wait_for_room_locked()
            self._stamp(event)
            self._buf.append(event)
            self._writer.buffered += 1

    def emit_batch(self, events: Sequence[Event]) -> None:
        """:meth:`emit` of events of one level, under one lock (one by one when the
        buffer has no room for all of them)."""
        if not self._recorded(events):
            return
        self._check_open()
        with self._lock:
            if self._writer.buffered + len(events) <= self._capacity:
                self._stamp_all(events)
                self._buf.extend(events)
                self._writer.buffered += len(events)
                return
        for event in events:
            self.emit(event)

    def emit_columns(self, batch: EventColumns) -> None:
        """:meth:`emit_batch` of columns: the batch goes in whole once the buffer has
        room (with ``drop_when_full``, a full buffer drops it, counting its events)."""
        if not self._columns_recorded(batch):
            return
        self._check_open()
        with self._lock:
            if self._writer.buffered + batch.n > self._capacity:
                if self._drop:
                    self._writer.counters.dropped += batch.n
                    return
                self._writer.wait_for_room_locked()
            self._stamp_columns(batch)
            self._buf.append(batch)
            self._writer.buffered += batch.n

    def flush(self) -> None:
        if self._closed:
            self._writer.raise_if_failed()
            return
        self._writer.flush()

    def close(self, status: RunStatus = RunStatus.FINISHED, error: str = "") -> None:
        """Flush, record a final ``writer_stats`` event, merge, write the final manifest.

        Idempotent. Raises :class:`TelemetryWriteError` if the writer failed at any
        point (the manifest then says ``failed`` if it can still be written). A Ctrl-C
        during the close (a second one, after the one that ends the run) is held until
        the close is done, then raised: cut short, the close would leave the run
        reading as crashed.
        """
        if self._closed:
            return
        with _interrupts_held():
            self._close(status, error)

    def _close(self, status: RunStatus, error: str) -> None:
        writer = self._writer
        failure: TelemetryWriteError | None = None
        try:
            writer.flush(sync=False)  # the close's own fsync covers it
            stats = writer_stats_event(writer.counters)  # recorded whatever the level
            with self._lock:
                if writer.buffered >= self._capacity:
                    writer.wait_for_room_locked()
                self._stamp(stats)
                self._buf.append(stats)
                writer.buffered += 1
        except TelemetryWriteError as exc:
            failure = exc
        self._closed = True
        _OPEN_HUBS.discard(self)
        try:
            writer.stop()
        except TelemetryWriteError as exc:
            failure = failure or exc
        writer.finalize(status, error)
        if self._run_lock is not None:
            self._run_lock.release()  # after the final manifest: the run is complete
        failure = failure or writer.error
        if failure is not None:
            raise failure


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """SIGINT (main thread only) held while the block runs, then raised once."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous == signal.SIG_IGN:
        yield
        return
    held: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
    if held:
        raise KeyboardInterrupt


class NullHub(StampingHub):
    """Level ``off``: nothing is recorded and nothing touches the disk."""

    def __init__(self, run_id: str = "null", *, rank: int = 0, start_seq: int = 0) -> None:
        super().__init__(run_id, level=TelemetryLevel.OFF, rank=rank, start_seq=start_seq)

    def enabled(self, level: TelemetryLevel) -> bool:
        return False

    def emit(self, event: Event) -> None:
        return None

    def emit_batch(self, events: Sequence[Event]) -> None:
        return None

    def emit_columns(self, batch: EventColumns) -> None:
        return None

    def set_level(
        self, level: TelemetryLevel, *, reason: str, round: int, until_round: int
    ) -> None:
        return None


def open_run(
    telemetry_dir: str | os.PathLike[str],
    run_id: str,
    *,
    level: TelemetryLevel,
    rank: int = 0,
    config_hash: str = "",
    flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
    queue_capacity: int = DEFAULT_QUEUE_CAPACITY,
    drop_when_full: bool = False,
    start_seq: int = 0,
    parent_run_id: str = "",
    resume: bool = False,
    sink: PartSink | None = None,
    world_size: int = 1,
    replace: bool = False,
    checkpoint_hash: str = "",
) -> Hub:
    """Open the telemetry of one run and rank; level ``off`` returns a :class:`NullHub`.

    ``resume=True`` continues an existing run: ``seq`` restarts at ``start_seq`` (the
    checkpoint's ``next_seq``) and events the old session wrote from there on are cut,
    once the run is checked (:func:`esper.telemetry.resume.prepare_resume`;
    ``checkpoint_hash``, the config hash the checkpoint was written with, must be one
    of the run's sessions').
    ``sink`` replaces the Parquet sink (tests inject slow or failing ones).
    ``world_size`` (ranks of a multi-process run) is recorded in a new run's manifest.
    ``replace=True`` discards this rank's telemetry first (the trainer's restart of a
    run that completed no round, :func:`esper.telemetry.resume.check_new_run_dir`).

    The run's writer lock (:mod:`esper.telemetry.lock`) is taken first and held until
    :meth:`TelemetryHub.close`: while another live process writes the run (rank), this
    raises :class:`~esper.telemetry.lock.RunLockedError` before anything is cut or written.
    """
    validate_run_id(run_id)
    _check_open_args(rank, flush_interval_s, queue_capacity, start_seq)
    if level == TelemetryLevel.OFF:
        return NullHub(run_id, rank=rank, start_seq=start_seq)
    run_dir = resolve_run_dir(telemetry_dir, run_id)
    run_lock = acquire_run_lock(run_dir, rank=rank, run_id=run_id)
    sink = sink or ParquetSink()
    try:
        if resume:
            manifest = prepare_resume(
                run_dir, run_id=run_id, rank=rank, start_seq=start_seq, level=_level_name(level),
                flush_interval_s=flush_interval_s, config_hash=config_hash, sink=sink,
                checkpoint_hash=checkpoint_hash,
            )  # fmt: skip
        else:
            manifest = new_manifest(
                run_id=run_id, rank=rank, schema_version=SCHEMA_VERSION, config_hash=config_hash,
                parent_run_id=parent_run_id, level=_level_name(level),
                flush_interval_s=flush_interval_s, first_seq=start_seq, world_size=world_size,
            )  # fmt: skip
            prepare_new(run_dir, manifest, replace=replace)
        writer = EventWriter(
            run_dir,
            manifest=manifest,
            flush_interval_s=flush_interval_s,
            queue_capacity=queue_capacity,
            sink=sink,
        )
        hub = TelemetryHub(
            run_id,
            level=level,
            rank=rank,
            start_seq=start_seq,
            run_dir=run_dir,
            writer=writer,
            drop_when_full=drop_when_full,
            run_lock=run_lock,
        )
        writer.start()
    except BaseException:
        run_lock.release()
        raise
    _OPEN_HUBS.add(hub)
    return hub


def _check_open_args(rank: int, flush_interval_s: float, capacity: int, start_seq: int) -> None:
    if rank < 0:
        raise UserError(f"telemetry rank must be >= 0, got {rank}")
    if not flush_interval_s > 0:
        raise UserError(f"telemetry flush interval must be > 0 s, got {flush_interval_s}")
    if capacity < 1:
        raise UserError(f"telemetry queue capacity must be >= 1, got {capacity}")
    if start_seq < 0:
        raise UserError(f"telemetry start_seq must be >= 0, got {start_seq}")


# --- Normal interpreter exit: close hubs the program forgot to close ----------------------

#: Strong references: a hub the program dropped without closing must still be flushed.
_OPEN_HUBS: set[TelemetryHub] = set()


def _close_open_hubs() -> None:
    """Flush and close every open hub at exit, with the status the exit implies."""
    last = getattr(sys, "last_value", None)
    if isinstance(last, KeyboardInterrupt):
        status, error = RunStatus.INTERRUPTED, "KeyboardInterrupt"
    elif last is not None:
        status, error = RunStatus.FAILED, f"{type(last).__name__}: {last}"
    else:
        status, error = RunStatus.FINISHED, ""
    for hub in list(_OPEN_HUBS):
        try:
            hub.close(status, error)
        except Exception as exc:
            print(f"warning: telemetry of run {hub.run_id!r}: {exc}", file=sys.stderr)


atexit.register(_close_open_hubs)
