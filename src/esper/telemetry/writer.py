"""The background writer: drains the hub's buffer into Parquet off the critical path.

Mechanism (crash safety). ``flush_interval_s`` is the durability bound: the writer
thread wakes every half interval (:data:`WAKES_PER_INTERVAL`), swaps out the events
buffered so far and writes them as *one small closed Parquet file*, a journal part
(:mod:`esper.telemetry.journal`; written under a dot tmp name and renamed into place),
then rewrites ``manifest.json`` atomically with the new counts, ``last_seq`` and a
heartbeat. An event therefore sits only in memory for at most half an interval plus the
time to write one batch, and a ``kill -9`` loses at most the events of the last flush
interval: every earlier event is in a closed file.

Typed parts. The writer keeps the journalled events and converts them, many flushes at
once, into one typed part per event type (``events/type=<t>/rank=<r>/part-<n>.parquet``),
then deletes the journal parts they cover: when :data:`CONVERT_PARTS` journal parts or
:data:`CONVERT_EVENTS` events are pending, and on an explicit :meth:`EventWriter.flush`
that asks for typed parts (the default; the trainer's checkpoint flush asks only for
durability).

Bursts and the close. A batch of at least :data:`DIRECT_EVENTS` events (a burst) skips
the journal: it is converted to tables at once and *held*, with every later batch, until
the hold comes due (the oldest held event has waited half a wake period, or the tables
pin :data:`HOLD_BYTES`) or a flush asks; then everything pending is written as one typed
part per type, so a held event is durable within the flush interval like a journalled
one. On close nothing more is written as a part: what is pending or held goes straight
into the final merge (one zstd file per type, with the parts since the last rolling
merge), so a burst is Parquet-encoded once, and journal parts are deleted only after the
merged files that hold their events are in place. A ``kill -9`` during the close can
therefore lose only what was held (the events of the last flush interval).

Too many small typed parts are merged as the run goes (every
:data:`ROLLING_COMPACT_PARTS` parts), from the tables the writer still holds
(:data:`FRESH_CACHE_BYTES`) rather than files read back; merges follow the intent-first
protocol of :mod:`esper.telemetry.compaction`, so no event is ever lost or duplicated by
a merge.

Back-pressure. The buffer is bounded (``queue_capacity`` events). When it is full the
producer blocks until the writer has drained it (lossless by default); blocked time and
the number of blocked emits are counted. With ``drop_when_full`` the event is dropped
instead and counted. Both counts reach the manifest and the final ``writer_stats`` event.

Errors. Any exception in the writer thread is stored as :class:`TelemetryWriteError`
(naming the path and the OS error) and raised in the producer at its next ``emit``,
``flush`` or ``close``; the writer stops at the first error.
"""

from __future__ import annotations

import bisect
import contextlib
import operator
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

import pyarrow as pa

from esper.core.enums import RunStatus
from esper.errors import EsperError
from esper.telemetry.arrow_schema import event_schema, events_to_tables
from esper.telemetry.compaction import Rewrite, merge, rewrite_many
from esper.telemetry.events import EVENT_TYPES, Event, WriterStats, event_tag
from esper.telemetry.journal import group_by_type, journal_rank_dir, journal_table
from esper.telemetry.manifest import Manifest, WriterCounters, write_manifest
from esper.telemetry.paths import list_parts, manifest_path, part_name, type_rank_dir
from esper.telemetry.sink import PartSink

#: The writer wakes this often per flush interval, leaving the other half of the
#: interval for writing the batch, so the durability bound holds with margin.
WAKES_PER_INTERVAL: Final = 2
#: Convert the journalled events into typed parts once this many journal parts (at two
#: wakes per second, about half a minute of a run) or events are pending. Each typed
#: part costs about 1 ms of CPU whatever its size, a journal part about 0.5 ms per flush.
CONVERT_PARTS: Final = 64
CONVERT_EVENTS: Final = 16_384
#: A batch this large (a burst) is converted to tables at once instead of journalled:
#: the per-part cost is then small against its events, and a journal would only add an
#: encoding. The tables are kept unwritten until the hold is due (below) or the close
#: merges them: a burst is then Parquet-encoded once (the close's zstd file), not twice
#: (an lz4 part, then the merge): 0.85-1.06 instead of 1.12-1.33 us of writer CPU per
#: event, medians (benchmarks/README.md, "Held bursts").
DIRECT_EVENTS: Final = 4_096
#: Unwritten tables are written once the oldest has waited this fraction of a wake
#: period (so such an event is durable within the flush interval, like a journalled
#: one) ...
HOLD_FRACTION: Final = 0.5
#: ... or once they pin this many bytes (converted tables: about 200 bytes per event of
#: the writer benchmark's mix, a sixth of it the run id repeated per row). At the default
#: flush interval time bounds a hold first below ~2.5M events/s. At 32 MiB a 200k-event
#: burst came due by bytes mid-burst and was partly encoded twice (lz4 parts of its
#: small types, merged again at the close), on one thread, while the producer waited
#: (benchmarks/README.md, "Native emit").
HOLD_BYTES: Final = 64 * 1024 * 1024
#: A type with this many events to write goes straight into a compacted (zstd) file,
#: merged with its fresh parts, instead of an lz4 part merged again later: the events of
#: a burst that outlasts a hold are then encoded once too ...
FINAL_ROWS: Final = 16_384
#: ... for at most this many such files per type in a session: they are kept as they
#: are (never merged again), so the cap bounds what they add to a run's file count
#: (one per type and hold otherwise); past it, a sustained burst is written as lz4 parts
#: and merged every :data:`ROLLING_COMPACT_PARTS`, as small batches are.
MAX_FINAL_FILES: Final = 8
#: Merge a type's fresh part files once this many have accumulated during a run.
ROLLING_COMPACT_PARTS: Final = 128
#: Bytes of Arrow tables the writer keeps of its parts since their type's last merge, so
#: a merge rewrites them from memory instead of reading every small file back (reading
#: a part cost about as much CPU as writing it). A type whose parts outgrow the budget
#: is merged from its files.
FRESH_CACHE_BYTES: Final = 4 * 1024 * 1024
#: How long ``close`` waits for the writer thread to finish its last drain.
JOIN_TIMEOUT_S: Final = 120.0


_seq = operator.attrgetter("seq")


def _type_counts(batch: list[Event]) -> dict[str, int]:
    """Events per type tag (counted in C: ``Counter`` over the classes)."""
    return {event_tag(cls): n for cls, n in Counter(map(type, batch)).items()}


def _held_bytes(table: pa.Table) -> int:
    """Memory a held table pins: its buffers' sizes. ``Table.nbytes`` walks the arrays'
    slices instead: 7 us on a fresh part's table, 42 us on a merged one, against 0.5 and
    1.4 us for this (measured alone; more inside the writer thread)."""
    return int(table.get_total_buffer_size())


def writer_stats_event(c: WriterCounters) -> WriterStats:
    """The final ``writer_stats`` event of a hub, from its counters."""
    return WriterStats(
        events_written=c.events_written,
        bytes_written=c.bytes_written,
        flushes=c.flushes,
        max_queue_depth=c.max_queue_depth,
        blocked_ns=c.blocked_ns,
        blocked_emits=c.blocked_emits,
        dropped=c.dropped,
    )


class TelemetryWriteError(EsperError):
    """The telemetry writer failed; the message names the path and the OS error."""


class EventWriter:
    """Owns the bounded buffer the hub appends to, and the thread that drains it.

    The hub holds ``lock`` while it appends to ``buffer`` (see
    :meth:`esper.telemetry.hub.TelemetryHub.emit`); everything else here runs either in
    the writer thread or, after :meth:`stop`, in the closing thread.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        manifest: Manifest,
        flush_interval_s: float,
        queue_capacity: int,
        sink: PartSink,
    ) -> None:
        self.run_dir = run_dir
        self.rank = manifest.rank
        self.manifest = manifest
        self.counters: WriterCounters = manifest.writer
        self.capacity = queue_capacity
        self.flush_interval_s = flush_interval_s
        self._period_s = flush_interval_s / WAKES_PER_INTERVAL
        self.sink = sink
        self.lock = threading.Lock()
        self.buffer: list[Event] = []
        self.error: TelemetryWriteError | None = None
        #: Called (in the writer thread) once ``error`` is set: the hub turns its native
        #: fast path off, so the next emit raises the error.
        self.on_fail: Callable[[], None] | None = None
        self._wake = threading.Condition(self.lock)
        self._room = threading.Condition(self.lock)
        self._flushed = threading.Condition(self.lock)
        self._flush_requested = 0
        self._flush_done = 0
        #: The latest flush generation that asked for typed parts, and for durability.
        self._typed_requested = 0
        self._durable_requested = 0
        self._stopping = False
        self._io_path: Path = manifest_path(run_dir, self.rank)
        self._next_part: dict[str, int] = {}
        self._fresh: dict[str, list[Path]] = defaultdict(list)
        #: The tables of ``_fresh``'s parts, per type, while they fit the budget (None
        #: once a type's did not: that type is merged from its files).
        self._fresh_tables: dict[str, list[pa.Table] | None] = {}
        self._cached_bytes = 0
        #: Journalled events not yet in typed parts, and the journal parts holding them.
        self._pending: list[Event] = []
        self._journals: list[Path] = []
        #: Converted events not yet in closed files (a burst's hold), per type in ``seq``
        #: order; how many rows of each are not counted yet; their bytes; the last
        #: ``seq`` among them; and when the hold began (None: nothing held).
        self._unwritten: dict[str, list[pa.Table]] = {}
        self._uncounted: dict[str, int] = {}
        self._unwritten_bytes = 0
        self._unwritten_last_seq = -1
        self._hold_since: float | None = None
        #: Compacted files written straight from a hold, per type (see MAX_FINAL_FILES).
        self._final_files: Counter[str] = Counter()
        self._journal_dir = journal_rank_dir(run_dir, self.rank)
        existing = list_parts(self._journal_dir)
        self._next_journal = existing[-1][0] + 1 if existing else 0
        self._thread = threading.Thread(
            target=self._run, name=f"esper-telemetry-{manifest.run_id}", daemon=True
        )

    # --- lifecycle (producer thread) ----------------------------------------------------

    def start(self) -> None:
        self.save_manifest()
        self._thread.start()

    def wait_for_room_locked(self) -> None:
        """Block until the buffer has room (``lock`` held); count the blocked time."""
        start = time.perf_counter_ns()
        self._wake.notify()
        while len(self.buffer) >= self.capacity and self.error is None:
            if not self._thread.is_alive():
                raise TelemetryWriteError("telemetry writer thread is not running")
            self._room.wait(self.flush_interval_s)
        self.counters.blocked_ns += time.perf_counter_ns() - start
        self.counters.blocked_emits += 1
        if self.error is not None:
            raise self.error

    def flush(self, *, typed: bool = True, durable: bool = True) -> None:
        """Return once every event buffered before the call is in a closed file: a typed
        part, or with ``typed=False`` possibly a journal part (see the module docstring).
        With ``durable=False`` (the close's drain, which the close's merge makes durable)
        once the writer has taken them: a held burst stays unwritten.
        """
        with self.lock:
            self.raise_if_failed()
            if not self._thread.is_alive():
                raise TelemetryWriteError("telemetry writer is closed; cannot flush")
            self._flush_requested += 1
            target = self._flush_requested
            if typed:
                self._typed_requested = target
            if durable:
                self._durable_requested = target
            self._wake.notify()
            while self._flush_done < target and self.error is None:
                if not self._thread.is_alive():
                    raise TelemetryWriteError("telemetry writer thread stopped unexpectedly")
                self._flushed.wait(self.flush_interval_s)
            self.raise_if_failed()

    def stop(self) -> None:
        """Drain what is left, stop the thread and wait for it."""
        with self.lock:
            self._stopping = True
            self._wake.notify()
        self._thread.join(JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            raise TelemetryWriteError(
                f"telemetry writer did not finish within {JOIN_TIMEOUT_S:.0f} s "
                f"(last path: {self._io_path})"
            )

    def finalize(self, status: RunStatus, error: str) -> None:
        """Merge each type's parts into one file and write the final manifest."""
        if self.error is None:
            cpu_start = time.thread_time_ns()
            try:
                self._compact_all()
            except Exception as exc:
                self._fail(exc)
            else:
                self._remove_empty_journal_dirs()
            self.counters.cpu_ns += time.thread_time_ns() - cpu_start
        self.manifest.status = status.value if self.error is None else RunStatus.FAILED.value
        self.manifest.error = error or (str(self.error) if self.error else "")
        self.manifest.finished_ns = time.time_ns()
        try:
            self.save_manifest()
        except Exception as exc:
            if self.error is None:
                self._fail(exc)

    def _remove_empty_journal_dirs(self) -> None:
        """A cleanly closed rank leaves no journal, not even its empty directory (the
        shared ``journal/`` goes too once no other rank has one)."""
        for directory in (self._journal_dir, self._journal_dir.parent):
            with contextlib.suppress(OSError):  # absent, or still in use
                directory.rmdir()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    # --- writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        deadline = time.monotonic() + self._period_s
        while True:
            with self.lock:
                while (
                    not self._stopping
                    and self._flush_requested == self._flush_done
                    and len(self.buffer) < self.capacity
                ):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._wake.wait(remaining)
                batch = self._take_buffered()
                generation = self._flush_requested
                draining = generation > self._flush_done  # a flush or the close's drain
                durable = self._durable_requested > self._flush_done
                typed = self._typed_requested > self._flush_done
                stopping = self._stopping
                self.counters.max_queue_depth = max(self.counters.max_queue_depth, len(batch))
                self._room.notify_all()
            deadline = time.monotonic() + self._period_s
            cpu_start = time.thread_time_ns()
            try:
                closing = stopping or (draining and not durable)
                self._write_batch(batch, typed=typed, durable=durable, closing=closing)
                self._rolling_compaction()
                self.save_manifest()
                # The manifest just saved lags by its own write; the next one has it.
                self.counters.cpu_ns += time.thread_time_ns() - cpu_start
            except BaseException as exc:
                self._fail(exc)
                return
            with self.lock:
                self._flush_done = generation
                self._flushed.notify_all()
            if stopping:
                return

    def _take_buffered(self) -> list[Event]:
        """The buffered events, removed from the buffer (``lock`` held): a copy, then a
        delete of that many. The native emit (:mod:`esper.telemetry.fast_emit`) appends
        without the lock, atomically under the GIL; an append between the two steps stays
        in the buffer, where a ``copy`` then ``clear`` would lose it."""
        batch = self.buffer[:]
        del self.buffer[: len(batch)]
        return batch

    def _write_batch(
        self, batch: list[Event], *, typed: bool, durable: bool, closing: bool
    ) -> None:
        """Make ``batch`` durable: a journal part, or typed parts of everything pending
        when a conversion is due (``typed``, or a threshold). A burst (a batch of
        :data:`DIRECT_EVENTS`) starts a hold: it and every later batch are converted to
        tables at once but written only when the hold is due (:meth:`_hold_due`) or a
        flush asks, as one part per type. On close (``closing``) nothing is converted or
        written as a part: a small batch is journalled, a burst held, and everything
        pending goes straight into the final merge, so a burst is Parquet-encoded once.

        The manifest counts an event once it is in a closed file: a journalled batch at
        once, a converted one type by type as its parts land (so a failure half-way
        leaves counts that match the files); ``last_seq`` only covers closed files.
        """
        if self._hold_since is not None or len(batch) >= DIRECT_EVENTS:
            self._hold(batch)
            if not closing and (typed or durable or self._hold_due()):
                self._convert()
        elif not closing and (typed or self._conversion_due(len(batch))):
            self._pending.extend(batch)
            self._convert()
        elif batch:  # journalled (also on close: durable if the close's merge fails)
            self._pending.extend(batch)
            path = self._journal_dir / part_name(self._next_journal)
            self._io_path = path
            self.counters.bytes_written += self.sink.write_table(journal_table(batch), path)
            self._next_journal += 1
            self._journals.append(path)
            for tag, n in _type_counts(batch).items():
                self._count(tag, n)
            self.manifest.last_seq = batch[-1].seq
        if batch:
            self.counters.events_written += len(batch)
            self.counters.flushes += 1

    def _count(self, tag: str, n: int) -> None:
        self.manifest.counts[tag] = self.manifest.counts.get(tag, 0) + n

    def _conversion_due(self, batch_events: int) -> bool:
        """Whether journalling this batch would reach a conversion threshold."""
        return (
            len(self._journals) + 1 >= CONVERT_PARTS
            or len(self._pending) + batch_events >= CONVERT_EVENTS
        )

    def _hold(self, batch: list[Event]) -> None:
        """Convert the pending (journalled) events and ``batch`` into unwritten tables, one
        list per type in ``seq`` order, with the rows of each not yet counted."""
        counted = self.manifest.last_seq  # journalled events are counted already
        for events in (self._pending, batch):
            groups = group_by_type(events)
            tables = events_to_tables({EVENT_TYPES[tag]: found for tag, found in groups.items()})
            for tag, found in groups.items():
                table = tables[EVENT_TYPES[tag]]
                self._unwritten.setdefault(tag, []).append(table)
                uncounted = len(found) - bisect.bisect_right(found, counted, key=_seq)
                self._uncounted[tag] = self._uncounted.get(tag, 0) + uncounted
                self._unwritten_bytes += _held_bytes(table)
            if events:
                self._unwritten_last_seq = events[-1].seq
                if self._hold_since is None:
                    self._hold_since = time.monotonic()
        self._pending = []

    def _hold_due(self) -> bool:
        """Whether unwritten tables must be written now: the oldest has waited half a wake
        period (so it is durable within the flush interval, as a journalled event is),
        or they pin :data:`HOLD_BYTES`."""
        assert self._hold_since is not None
        waited = time.monotonic() - self._hold_since
        return waited >= self._period_s * HOLD_FRACTION or self._unwritten_bytes >= HOLD_BYTES

    def _convert(self) -> None:
        """Write the pending and unwritten events of each type, then drop their journal:
        a type with :data:`FINAL_ROWS` of them is merged at once with its fresh parts
        into a compacted (zstd) file, encoded once (up to :data:`MAX_FINAL_FILES` per
        type); any other becomes an lz4 part.

        Every pending event of a type goes into the same file, in ``seq`` order, before
        any journal part is deleted: the invariant that makes a crashed run's journal
        readable without duplicates (:func:`esper.telemetry.journal.unconverted`).
        """
        self._hold([])
        large = []
        for tag, tables in self._unwritten.items():
            rows = sum(t.num_rows for t in tables)
            if rows >= FINAL_ROWS and self._final_files[tag] < MAX_FINAL_FILES:
                self._final_files[tag] += 1
                large.append(tag)
                continue
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            path = self._next_part_path(tag)
            self._io_path = path
            self.counters.bytes_written += self.sink.write_table(table, path)
            self._count(tag, self._uncounted.get(tag, 0))
            self._fresh[tag].append(path)
            self._keep(tag, table)
        self._merge_unwritten(large)

    def _merge_unwritten(self, tags: Iterable[str], *, parallel: bool = False) -> None:
        """Merge each of ``tags``' fresh parts and unwritten tables into one compacted
        file (the unwritten rows need no part of their own: they are counted as each
        merged file lands), then end the hold; all share one intent record save
        (:func:`rewrite_many`)."""
        jobs = [
            self._merge_job(tag, self._fresh.pop(tag, []), self._unwritten.get(tag))
            for tag in sorted(tags)
        ]
        if jobs:
            self._rewrite(jobs, landed=self._count_landed, parallel=parallel)
        self._release_unwritten()

    def _release_unwritten(self) -> None:
        """The unwritten events are in closed files now: advance ``last_seq``, drop the
        journal parts that held some of them, and end the hold."""
        if self._hold_since is not None:
            self.manifest.last_seq = max(self.manifest.last_seq, self._unwritten_last_seq)
        for path in self._journals:
            self._io_path = path
            self.sink.remove(path)
        self._journals = []
        self._unwritten = {}
        self._uncounted = {}
        self._unwritten_bytes = 0
        self._hold_since = None

    def _keep(self, tag: str, table: pa.Table) -> None:
        """Hold a fresh part's table for its merge, or stop holding the type's (budget)."""
        held = self._fresh_tables.setdefault(tag, [])
        if held is None:
            return
        size = _held_bytes(table)
        if self._cached_bytes + size > FRESH_CACHE_BYTES:
            self._take_held(tag)
            self._fresh_tables[tag] = None
            return
        held.append(table)
        self._cached_bytes += size

    def _take_held(self, tag: str) -> list[pa.Table] | None:
        """The held tables of ``tag``'s fresh parts (None if not all held), released."""
        held = self._fresh_tables.pop(tag, None)
        for table in held or ():
            self._cached_bytes -= _held_bytes(table)
        return held

    def _next_part_path(self, tag: str) -> Path:
        directory = type_rank_dir(self.run_dir, tag, self.rank)
        number = self._next_part.get(tag)
        if number is None:
            existing = list_parts(directory)
            number = existing[-1][0] + 1 if existing else 0
        self._next_part[tag] = number + 1
        return directory / part_name(number)

    def _rolling_compaction(self) -> None:
        for tag, fresh in self._fresh.items():
            if len(fresh) >= ROLLING_COMPACT_PARTS:
                self._merge(tag, list(fresh))
                fresh.clear()

    def _compact_all(self) -> None:
        """Merge the parts written since the last rolling compaction, and the unwritten
        tables, into one file per type.

        Earlier compacted files are left as they are, so closing costs time proportional
        to the last stretch of the run, not to the whole run. A single fresh part is
        rewritten too: parts are lz4 while the run goes, a closed run is all zstd. Pending
        and unwritten events go into the merge directly (no part of their own), and the
        journal parts are dropped once every merged file has landed.
        """
        self._hold([])  # the pending (journalled) events join the unwritten tables
        self._merge_unwritten(
            set(self._unwritten) | {t for t, fresh in self._fresh.items() if fresh},
            parallel=True,
        )

    def _count_landed(self, job: Rewrite) -> None:
        """A merged file is in place: count its rows that no journal part held."""
        self._count(job.event_type, self._uncounted.pop(job.event_type, 0))

    def _merge(self, tag: str, inputs: list[Path]) -> None:
        self._rewrite([self._merge_job(tag, inputs)])

    def _merge_job(
        self, tag: str, inputs: list[Path], tail: list[pa.Table] | None = None
    ) -> Rewrite:
        return merge(
            event_type=tag,
            inputs=inputs,
            output=self._next_part_path(tag),
            schema=event_schema(EVENT_TYPES[tag]),
            contents=self._take_held(tag),  # every fresh part's table, or None
            tail=tail,
        )

    def _rewrite(
        self,
        jobs: list[Rewrite],
        landed: Callable[[Rewrite], None] = lambda _job: None,
        *,
        parallel: bool = False,
    ) -> None:
        """Rewrite ``jobs`` crash-safely; the close's merge (``parallel``) encodes its
        files on every core, since the caller waits for it, while merges during the run
        stay on this thread so that training keeps the other cores."""
        sizes = rewrite_many(
            sink=self.sink,
            manifest=self.manifest,
            save=lambda _m: self.save_manifest(),
            rewrites=jobs,
            touching=self._touching,
            landed=landed,
            spent=self._spent_elsewhere,
            parallel=parallel,
        )
        self.counters.bytes_written += sum(sizes)
        self.counters.compactions += len(jobs)

    def _touching(self, path: Path) -> None:
        self._io_path = path

    def _spent_elsewhere(self, cpu_ns: int) -> None:
        """CPU time of the threads that encoded merged files in parallel: the writer's."""
        self.counters.cpu_ns += cpu_ns

    def save_manifest(self) -> None:
        path = manifest_path(self.run_dir, self.rank)
        self._io_path = path
        self.manifest.heartbeat_ns = time.time_ns()
        write_manifest(path, self.manifest)

    def _fail(self, exc: BaseException) -> None:
        error = TelemetryWriteError(
            f"telemetry writer failed on {self._io_path}: {type(exc).__name__}: {exc}"
        )
        error.__cause__ = exc
        with self.lock:
            if self.error is None:
                self.error = error
            self._room.notify_all()
            self._flushed.notify_all()
        if self.on_fail is not None:
            self.on_fail()
