"""A hub that keeps the stamped events in a list: for tests and benchmarks that read a
run's events back without a run directory. It filters and stamps exactly as the real
hub (:class:`~esper.telemetry.hub.TelemetryHub`) does."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry.event_columns import EventColumns
from esper.telemetry.events import Event
from esper.telemetry.hub import StampingHub
from esper.telemetry.manifest import WriterCounters
from esper.telemetry.paths import validate_run_id
from esper.telemetry.writer import TelemetryWriteError, writer_stats_event


class MemoryHub(StampingHub):
    """Keeps stamped events in ``events`` (same filtering and stamping as the real hub)."""

    def __init__(
        self,
        run_id: str = "memory",
        *,
        level: TelemetryLevel = TelemetryLevel.DEBUG,
        rank: int = 0,
        start_seq: int = 0,
    ) -> None:
        super().__init__(validate_run_id(run_id), level=level, rank=rank, start_seq=start_seq)
        self.events: list[Event] = []
        self.status: RunStatus = RunStatus.RUNNING
        self.error = ""
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        if not self._admitted(event):
            return
        with self._lock:
            self._stamp_and_store(event)

    def emit_batch(self, events: Sequence[Event]) -> None:
        if not self._recorded(events):
            return
        self._check_open()
        with self._lock:
            self._stamp_all(events)
            self.events.extend(events)

    def emit_columns(self, batch: EventColumns) -> None:
        if not self._columns_recorded(batch):
            return
        self._check_open()
        with self._lock:
            self._stamp_columns(batch)
            self.events.extend(batch.events())

    def _check_open(self) -> None:
        if self._closed:
            raise TelemetryWriteError(f"memory hub of run {self.run_id!r} is closed")

    def _stamp_and_store(self, event: Event) -> None:
        self._stamp(event)
        self.events.append(event)

    def close(self, status: RunStatus = RunStatus.FINISHED, error: str = "") -> None:
        """Mirror the real hub: a final ``writer_stats`` event, then closed."""
        if self._closed:
            return
        stats = writer_stats_event(WriterCounters(events_written=len(self.events)))
        with self._lock:
            self._stamp_and_store(stats)
        self.status, self.error = status, error
        self._closed = True

    def of_type(self, cls: type[Event]) -> list[Event]:
        """The recorded events of one type, in emission order."""
        return [e for e in self.events if type(e) is cls]
