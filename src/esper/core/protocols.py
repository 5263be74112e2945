"""Structural interfaces for injected collaborators (no torch, no telemetry imports)."""

from __future__ import annotations

from typing import Protocol

from esper.core.enums import RunStatus, TelemetryLevel


class Hub(Protocol):
    """What the trainer needs from a telemetry hub (real, in-memory or null)."""

    run_id: str
    level: TelemetryLevel

    def enabled(self, level: TelemetryLevel) -> bool: ...

    def emit(self, event: object) -> None: ...

    def set_level(
        self, level: TelemetryLevel, *, reason: str, round: int, until_round: int
    ) -> None: ...

    @property
    def next_seq(self) -> int: ...

    def flush(self) -> None: ...

    def close(self, status: RunStatus = RunStatus.FINISHED, error: str = "") -> None: ...
