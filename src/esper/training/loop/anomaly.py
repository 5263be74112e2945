"""Detect unhealthy PPO updates and escalate telemetry to debug for a bounded time.

An anomaly raises the level to ``debug`` until ``round + escalation_rounds``; the
escalation and the return to the configured level are themselves events
(``telemetry_level_changed``), so an analysis can tell which rounds ran at debug.
"""

from __future__ import annotations

import math

import msgspec

from esper.config import TelemetryConfig
from esper.core.enums import AnomalyKind, TelemetryLevel
from esper.telemetry.events import PpoUpdate
from esper.telemetry.hub import Hub


class Anomaly(msgspec.Struct, frozen=True):
    kind: AnomalyKind
    detail: str
    value: float
    threshold: float


def detect_anomalies(
    m: PpoUpdate, cfg: TelemetryConfig, *, target_kl: float | None
) -> list[Anomaly]:
    """The update's anomalies, against the ``telemetry.anomaly_*`` thresholds."""
    found: list[Anomaly] = []
    if m.skipped:
        found.append(Anomaly(AnomalyKind.NON_FINITE_LOSS, m.skip_reason, math.nan, math.nan))
        return found
    if m.ratio_max > cfg.anomaly_ratio_max:
        found.append(
            Anomaly(
                AnomalyKind.RATIO_EXPLOSION,
                "max policy ratio",
                m.ratio_max,
                cfg.anomaly_ratio_max,
            )
        )
    if target_kl is not None and m.approx_kl > cfg.anomaly_kl_factor * target_kl:
        limit = cfg.anomaly_kl_factor * target_kl
        found.append(Anomaly(AnomalyKind.KL_SPIKE, "approx KL", m.approx_kl, limit))
    if m.entropy_op < cfg.anomaly_entropy_min:
        found.append(
            Anomaly(
                AnomalyKind.ENTROPY_COLLAPSE,
                "op-head entropy",
                m.entropy_op,
                cfg.anomaly_entropy_min,
            )
        )
    if m.explained_variance < cfg.anomaly_ev_min:
        found.append(
            Anomaly(
                AnomalyKind.VALUE_COLLAPSE,
                "explained variance",
                m.explained_variance,
                cfg.anomaly_ev_min,
            )
        )
    return found


class TelemetryEscalator:
    """Raises the hub to debug on anomalies and restores the base level afterwards."""

    def __init__(self, hub: Hub, *, base: TelemetryLevel, rounds: int) -> None:
        self.hub = hub
        self.base = base
        self.rounds = rounds
        self.until_round = -1

    def escalates(self, anomalies: list[Anomaly]) -> bool:
        """Whether these anomalies raise the level (reported in ``anomaly_detected``)."""
        return (
            bool(anomalies)
            and self.rounds > 0
            and TelemetryLevel.OFF != self.base < TelemetryLevel.DEBUG
        )

    def report(self, anomalies: list[Anomaly], *, rnd: int) -> None:
        """Raise the hub to debug for ``escalation_rounds`` rounds after these anomalies
        (their events are the Recorder's, emitted first)."""
        if not self.escalates(anomalies):
            return
        self.until_round = rnd + self.rounds
        if self.hub.level != TelemetryLevel.DEBUG:
            kinds = ",".join(a.kind.value for a in anomalies)
            self.hub.set_level(
                TelemetryLevel.DEBUG,
                reason=f"anomaly:{kinds}",
                round=rnd,
                until_round=self.until_round,
            )

    def on_round_start(self, rnd: int) -> None:
        # ``until_round`` is the last round that runs at debug.
        if self.hub.level != self.base and 0 <= self.until_round < rnd:
            self.hub.set_level(self.base, reason="escalation_expired", round=rnd, until_round=-1)
            self.until_round = -1
