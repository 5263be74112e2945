"""The background writer: drains the hub's buffer into typed Parquet parts.

Durability. The writer thread wakes once per flush interval (default 1 s; a little
early, :func:`wake_period`, so that the write itself lands within the interval), takes
the events buffered so far and writes them, one part per event type
(``events/type=<t>/rank=<r>/part-<first seq>-<last seq>.parquet``, written under a dot
tmp name and renamed into place). Every event emitted more than one interval ago is
therefore in a closed file that any Parquet reader sees: a ``kill -9`` loses at most
the last interval. The manifest (counts, ``last_seq``, heartbeat) is rewritten every
:data:`MANIFEST_EVERY_S`, and at each explicit flush and the close; readers expect parts
to hold events newer than the manifest's ``last_seq`` in a run that did not close. An
idle writer writes nothing else.

fsync. An explicit :meth:`EventWriter.flush` (the trainer's, before each checkpoint)
writes at once and fsyncs what was written since the last one, with the directories
that gained entries and the manifest (:meth:`~esper.telemetry.sink.PartSink.sync`), so a
checkpoint never points past events durable on disk; so does the close. In between
nothing is fsynced: a ``kill -9`` loses nothing the kernel has, and a power loss can
lose what came after the last checkpoint, which the resume cuts anyway. An fsynced
write takes each type's parts written since the last fsync into its own part (one file
to fsync per type, not one per write) and deletes them once it is in place.

Bounded file count. A flush's parts are merged as the run goes, like a counter
with :data:`MERGE_FANIN` digits: once a type has that many files of one level, they
are merged into one file of the next level (zstd; level-0 parts from the tables the
writer still holds, higher levels read back with their checksums verified). A type
then has at most ``(MERGE_FANIN - 1)`` files per level, and the levels grow with the
logarithm of the writes: a 24-hour run at the default interval keeps under ~100 files
per type (about 2,100 for the whole catalogue). A merge renames its output into place,
then deletes its inputs; a crash in between is settled by the superseded-part rule
(:func:`esper.telemetry.paths.list_parts`). A reader that lists a live run's files
and then opens one may find it merged away meanwhile: it lists again.
:meth:`EventWriter.finalize` (the close) merges each type into one file, on every core.

Back-pressure. The buffer is bounded (``queue_capacity`` events; a batch of columns,
:mod:`esper.telemetry.event_columns`, counts its events and goes in whole once there is
room). When it is full the producer blocks until the writer has drained it (lossless
by default); blocked time and the number of blocked emits are counted. With
``drop_when_full`` the event (or batch) is dropped instead and its events counted.
Both counts reach the manifest and the final ``writer_stats`` event.

Errors. Any exception in the writer thread is stored as :class:`TelemetryWriteError`
(naming the path and the OS error) and raised in the producer at its next ``emit``,
``flush`` or ``close``; the writer stops at the first error.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pyarrow as pa

from esper.core.enums import RunStatus
from esper.errors import EsperError
from esper.telemetry.arrow_schema import event_schema, events_to_table
from esper.telemetry.event_columns import EventColumns
from esper.telemetry.events import EVENT_TYPES, Event, WriterStats, event_tag
from esper.telemetry.manifest import Manifest, WriterCounters, write_manifest
from esper.telemetry.paths import list_parts, manifest_path, part_name, type_rank_dir
from esper.telemetry.sink import PartSink, read_verified

#: The writer wakes this much before a flush interval has passed since its last wake
#: (at most :data:`MAX_MARGIN_FRACTION` of the interval), so a write that takes up to
#: the margin still lands within the interval.
WAKE_MARGIN_S: Final = 0.1
MAX_MARGIN_FRACTION: Final = 0.2
#: The manifest (its counts and heartbeat) is rewritten this often, besides at each
#: flush and the close. Readers call a ``running`` manifest stale after 5 s at least.
MANIFEST_EVERY_S: Final = 2.0
#: Files of one level (per type) merged into one file of the next level.
MERGE_FANIN: Final = 32
#: Level of the files a run already had when this writer started (a resumed run's:
#: the files it kept), which only the close merges again.
KEPT_LEVEL: Final = 1_000
#: Merged files written at once by the close (one thread each).
CLOSE_THREADS: Final = min(os.cpu_count() or 1, 4)
#: How long ``close`` waits for the writer thread to finish its last drain.
JOIN_TIMEOUT_S: Final = 120.0


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


def wake_period(flush_interval_s: float) -> float:
    """Seconds between the writer's wakes (see :data:`WAKE_MARGIN_S`)."""
    return flush_interval_s - min(WAKE_MARGIN_S, flush_interval_s * MAX_MARGIN_FRACTION)


def merge_start(levels: Sequence[int]) -> int | None:
    """Where the due merge of a type's files starts, given their levels (oldest first,
    never increasing): the last :data:`MERGE_FANIN` files when they share a level."""
    if len(levels) >= MERGE_FANIN and levels[-MERGE_FANIN] == levels[-1]:
        return len(levels) - MERGE_FANIN
    return None


class TelemetryWriteError(EsperError):
    """The telemetry writer failed; the message names the path and the OS error."""


@dataclass
class _File:
    """A file of one type this writer knows: its ``seq`` range, merge level and (for a
    level-0 part) its table, kept for its merge."""

    path: Path
    first: int
    last: int
    level: int
    table: pa.Table | None = None


class EventWriter:
    """Owns the bounded buffer the hub appends to, and the thread that drains it.

    The hub holds ``lock`` while it appends to ``buffer``; everything else here runs in
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
        self.sink = sink
        self.lock = threading.Lock()
        self.buffer: list[Event | EventColumns] = []
        #: Events in ``buffer`` (a batch of columns counts its events).
        self.buffered = 0
        self.error: TelemetryWriteError | None = None
        self._wake = threading.Condition(self.lock)
        self._room = threading.Condition(self.lock)
        self._flushed = threading.Condition(self.lock)
        self._requested = 0  # flush generations asked for (and with an fsync), and done
        self._sync_requested = 0
        self._done = 0
        self._stopping = False
        self._manifest_path = manifest_path(run_dir, self.rank)
        self._io_path = self._manifest_path
        self._saved_at = 0.0
        self._dirs = {tag: type_rank_dir(run_dir, tag, self.rank) for tag in EVENT_TYPES}
        self._files: dict[str, list[_File]] = {tag: self._existing(tag) for tag in EVENT_TYPES}
        #: Files written since the last fsync (an ordered set), and directories created.
        self._unsynced: dict[Path, None] = {}
        self._new_dirs: list[Path] = []
        self._thread = threading.Thread(
            target=self._run, name=f"esper-telemetry-{manifest.run_id}", daemon=True
        )

    def _existing(self, tag: str) -> list[_File]:
        return [
            _File(p.path, p.first, p.last, KEPT_LEVEL) for p in list_parts(self._dirs[tag]).live
        ]

    # --- lifecycle (producer thread) ----------------------------------------------------

    def start(self) -> None:
        self.save_manifest()
        self._thread.start()

    def wait_for_room_locked(self) -> None:
        """Block until the buffer has room (``lock`` held); count the blocked time."""
        start = time.perf_counter_ns()
        self._wake.notify()
        while self.buffered >= self.capacity and self.error is None:
            if not self._thread.is_alive():
                raise TelemetryWriteError("telemetry writer thread is not running")
            self._room.wait(self.flush_interval_s)
        self.counters.blocked_ns += time.perf_counter_ns() - start
        self.counters.blocked_emits += 1
        if self.error is not None:
            raise self.error

    def flush(self, *, sync: bool = True) -> None:
        """Return once every event buffered before the call is in a closed part, and
        (``sync``) fsynced with the manifest (see the module docstring)."""
        with self.lock:
            self.raise_if_failed()
            if not self._thread.is_alive():
                raise TelemetryWriteError("telemetry writer is closed; cannot flush")
            self._requested += 1
            target = self._requested
            if sync:
                self._sync_requested = target
            self._wake.notify()
            while self._done < target and self.error is None:
                if not self._thread.is_alive():
                    raise TelemetryWriteError("telemetry writer thread stopped unexpectedly")
                self._flushed.wait(self.flush_interval_s)
            self.raise_if_failed()

    def stop(self) -> None:
        """Write what is left, stop the thread and wait for it."""
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
        """Merge each type's files into one, fsync, write the final manifest."""
        if self.error is None:
            cpu_start = time.thread_time_ns()
            try:
                self._merge_all()
            except Exception as exc:
                self._fail(exc)
            self.counters.cpu_ns += time.thread_time_ns() - cpu_start
        self.manifest.status = status.value if self.error is None else RunStatus.FAILED.value
        self.manifest.error = error or (str(self.error) if self.error else "")
        self.manifest.finished_ns = time.time_ns()
        try:
            self.save_manifest()
            self._fsync()
        except Exception as exc:
            if self.error is None:
                self._fail(exc)

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    # --- writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        period = wake_period(self.flush_interval_s)
        deadline = time.monotonic() + period
        while True:
            with self.lock:
                while not self._stopping and self._requested == self._done:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self.buffered >= self.capacity:
                        break
                    self._wake.wait(remaining)
                depth = self.buffered
                batch = self._take_buffered()
                target, stopping = self._requested, self._stopping
                sync = self._sync_requested > self._done
                self.counters.max_queue_depth = max(self.counters.max_queue_depth, depth)
                self._room.notify_all()
            deadline = time.monotonic() + period
            cpu_start = time.thread_time_ns()
            try:
                self._write_batch(batch, sync=sync)
                if sync or time.monotonic() - self._saved_at >= MANIFEST_EVERY_S:
                    self.save_manifest()
                if sync:
                    self._fsync()
                self.counters.cpu_ns += time.thread_time_ns() - cpu_start
            except BaseException as exc:
                self._fail(exc)
                return
            with self.lock:
                self._done = target
                self._flushed.notify_all()
            if stopping:
                return

    def _take_buffered(self) -> list[Event | EventColumns]:
        """The buffered events, removed from the buffer (``lock`` held)."""
        batch = self.buffer[:]
        del self.buffer[: len(batch)]
        self.buffered = 0
        return batch

    def _write_batch(self, batch: list[Event | EventColumns], *, sync: bool) -> None:
        """One part per event type of ``batch`` (in ``seq`` order), then due merges. The
        manifest counts each type's events once its part is in place.

        A ``sync`` batch (one that is fsynced next) takes into its part the type's
        parts written since the last fsync: one file to fsync per type instead of one
        per flush. They are deleted once it is in place (the superseded-part rule
        settles a crash in between)."""
        if not batch:
            return
        groups: dict[type[Event], list[Event | EventColumns]] = {}
        for item in batch:
            cls = item.cls if isinstance(item, EventColumns) else type(item)
            groups.setdefault(cls, []).append(item)
        written = 0
        for cls, items in groups.items():
            tag = event_tag(cls)
            files = self._files[tag]
            table, first, last = _table(cls, items)
            rows = table.num_rows
            written += rows
            tail = self._unsynced_tail(files) if sync else []
            if tail:
                table = pa.concat_tables([*(f.table for f in tail if f.table is not None), table])
                first = tail[0].first
            path = self._dirs[tag] / part_name(first, last)
            self._io_path = path
            self.counters.bytes_written += self.sink.write_part(table, path)
            self._unsynced[path] = None
            self.manifest.counts[tag] = self.manifest.counts.get(tag, 0) + rows
            if not files:  # a new type directory: its entry must be made durable too
                self._new_dirs.append(path.parent)
            self._remove(tail)
            files[len(files) - len(tail) :] = [_File(path, first, last, 0, table)]
            while (start := merge_start([f.level for f in files])) is not None:
                self._merge(tag, files, start)
        self.manifest.last_seq = _last_seq(batch[-1])
        self.counters.events_written += written
        self.counters.flushes += 1

    def _unsynced_tail(self, files: list[_File]) -> list[_File]:
        """The last files of a type that are parts written since the last fsync."""
        start = len(files)
        while start and _held(files[start - 1]) and files[start - 1].path in self._unsynced:
            start -= 1
        return files[start:]

    def _remove(self, files: list[_File]) -> None:
        for f in files:
            self._io_path = f.path
            self.sink.remove(f.path)
            self._unsynced.pop(f.path, None)

    def _fsync(self) -> None:
        """Make every file written since the last call durable, with the manifest."""
        self._unsynced[self._manifest_path] = None
        self.sink.sync(self._unsynced, self._new_dirs)
        self._unsynced = {}
        self._new_dirs = []

    def _merge(self, tag: str, files: list[_File], start: int) -> None:
        """Merge ``files[start:]`` into one file of the next level, in place."""
        inputs = files[start:]
        merged = self._merged_file(tag, inputs, inputs[-1].level + 1)
        del files[start:]
        files.append(merged)

    def _merged_file(self, tag: str, inputs: list[_File], level: int) -> _File:
        """Write the merge of ``inputs`` (renamed into place), then delete them."""
        output = _output(inputs)
        schema = event_schema(EVENT_TYPES[tag])
        self._io_path = output
        self.counters.bytes_written += self.sink.write_merged(
            _tables(inputs, schema), schema, output
        )
        self.counters.compactions += 1
        self._remove([f for f in inputs if f.path != output])
        self._unsynced[output] = None
        return _File(output, inputs[0].first, inputs[-1].last, level)

    def _merge_all(self) -> None:
        """The close: every type's files into one merged file, types in parallel where
        the sink allows it (Parquet encoding releases the GIL)."""
        due = [
            (tag, files)
            for tag, files in self._files.items()
            if len(files) > 1 or (files and files[0].level == 0)
        ]
        threads = min(len(due), CLOSE_THREADS) if getattr(self.sink, "concurrent", False) else 1
        if threads > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix="esper-close") as pool:
                try:
                    jobs = [
                        (files, pool.submit(self._timed_merge, tag, files)) for tag, files in due
                    ]
                except RuntimeError:  # the interpreter is exiting (a hub closed at exit)
                    jobs = []  # (it refuses the first job already: none runs twice)
                for files, job in jobs:
                    try:
                        merged, cpu_ns = job.result()
                    except Exception:
                        self._io_path = _output(files)  # the error names this merge's file
                        raise
                    self.counters.cpu_ns += cpu_ns
                    files[:] = [merged]
            if jobs:
                return
        for tag, files in due:
            files[:] = [self._merged_file(tag, files, KEPT_LEVEL)]

    def _timed_merge(self, tag: str, files: list[_File]) -> tuple[_File, int]:
        start = time.thread_time_ns()
        merged = self._merged_file(tag, files, KEPT_LEVEL)
        return merged, time.thread_time_ns() - start

    def save_manifest(self) -> None:
        self._io_path = self._manifest_path
        self.manifest.heartbeat_ns = time.time_ns()
        write_manifest(self._manifest_path, self.manifest)
        self._saved_at = time.monotonic()

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


def _table(cls: type[Event], items: list[Event | EventColumns]) -> tuple[pa.Table, int, int]:
    """One type's buffered items as one table in ``seq`` order, with its ``seq`` range:
    runs of Structs converted together, batches of columns as they are."""
    tables: list[pa.Table] = []
    structs: list[Event] = []
    for item in items:
        if isinstance(item, EventColumns):
            if structs:
                tables.append(events_to_table(cls, structs))
                structs = []
            tables.append(item.table())
        else:
            structs.append(item)
    if structs:
        tables.append(events_to_table(cls, structs))
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    return table, items[0].seq, _last_seq(items[-1])


def _last_seq(item: Event | EventColumns) -> int:
    return item.last_seq if isinstance(item, EventColumns) else item.seq


def _held(f: _File) -> bool:
    return f.table is not None


def _tables(inputs: list[_File], schema: pa.Schema) -> Iterator[pa.Table]:
    """The inputs' tables in order: held ones as they are, the others read back one row
    group at a time (bounded memory) with their page checksums verified."""
    for f in inputs:
        if f.table is not None:
            yield f.table
        else:
            yield from read_verified(f.path, schema)


def _output(inputs: list[_File]) -> Path:
    """The merged file of ``inputs``: named by the range they cover together."""
    return inputs[0].path.with_name(part_name(inputs[0].first, inputs[-1].last))
