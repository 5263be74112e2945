"""Test hook: an emission side channel, so crash tests can prove what a kill lost.

With ``ESPER_EMIT_LOG=<path>`` set, the trainer's hub is wrapped at open time by
:class:`EmitLogHub`, which appends one ``"<seq> <ts_ns>\\n"`` line per *recorded* event
(filtered events never get a ``seq`` and are not logged) with an unbuffered ``write``,
so the log survives a ``kill -9`` up to the event being emitted. A test then compares
the log with what the analysis layer recovers from disk. When the variable is unset the
real hub is returned unchanged: the hot path pays nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from esper.core.enums import RunStatus
from esper.telemetry.event_columns import EventColumns
from esper.telemetry.events import UNSTAMPED_SEQ, Event
from esper.telemetry.hub import DelegatingHub, Hub

EMIT_LOG_ENV: Final = "ESPER_EMIT_LOG"


class EmitLogHub(DelegatingHub):
    """Delegates everything to ``inner``; logs ``seq`` and ``ts_ns`` of each recorded event."""

    def __init__(self, inner: Hub, path: str | os.PathLike[str]) -> None:
        super().__init__(inner)
        self._fd = os.open(Path(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(self, event: Event) -> None:
        self._inner.emit(event)
        if event.seq != UNSTAMPED_SEQ and self._fd >= 0:
            os.write(self._fd, f"{event.seq} {event.ts_ns}\n".encode())

    def emit_batch(self, events: Sequence[Event]) -> None:
        self._inner.emit_batch(events)
        lines = [f"{e.seq} {e.ts_ns}\n" for e in events if e.seq != UNSTAMPED_SEQ]
        if lines and self._fd >= 0:
            os.write(self._fd, "".join(lines).encode())

    def emit_columns(self, batch: EventColumns) -> None:
        self._inner.emit_columns(batch)
        if batch.seq != UNSTAMPED_SEQ and self._fd >= 0:
            seqs = range(batch.seq, batch.seq + batch.n)
            os.write(self._fd, "".join(f"{seq} {batch.ts_ns}\n" for seq in seqs).encode())

    def close(self, status: RunStatus = RunStatus.FINISHED, error: str = "") -> None:
        try:
            self._inner.close(status, error)
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def with_emit_log(hub: Hub) -> Hub:
    """``hub`` wrapped by :class:`EmitLogHub` when ``ESPER_EMIT_LOG`` is set, else ``hub``."""
    path = os.environ.get(EMIT_LOG_ENV)
    return EmitLogHub(hub, path) if path else hub
