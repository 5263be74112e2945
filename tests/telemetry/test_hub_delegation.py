"""Hub hierarchy (issue 15): Hub is a stateless interface; wrappers delegate all state."""

from __future__ import annotations

from pathlib import Path

from esper.core.enums import TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.emit_log import EmitLogHub
from esper.telemetry.hub import DelegatingHub, Hub, StampingHub
from esper.telemetry.memory_hub import MemoryHub
from esper.training.loop.distributed import RankHub


def _round_started() -> ev.RoundStarted:
    return ev.RoundStarted(round=0, n_envs=1, episode_length=2, entropy_coef=0.0, lr=0.0)


def test_hub_interface_holds_no_state() -> None:
    assert Hub.__init__ is object.__init__
    assert issubclass(MemoryHub, StampingHub)
    assert issubclass(EmitLogHub, DelegatingHub) and issubclass(RankHub, DelegatingHub)


def test_emit_log_hub_forwards_state_and_logs_seq(tmp_path: Path) -> None:
    inner = MemoryHub(level=TelemetryLevel.NORMAL)
    hub = EmitLogHub(inner, tmp_path / "emit.log")
    hub.emit(_round_started())
    hub.level = TelemetryLevel.LIFECYCLE  # the wrapper's level is the inner hub's
    assert inner.level == TelemetryLevel.LIFECYCLE and not hub.enabled(TelemetryLevel.NORMAL)
    assert (hub.next_seq, hub.events_emitted) == (inner.next_seq, 1)
    hub.close()
    assert inner.closed and hub.closed
    assert (tmp_path / "emit.log").read_text().split()[0] == "0"


def test_rank_hub_drops_run_level_events_off_rank_zero() -> None:
    inner = MemoryHub(rank=1)
    hub = RankHub(inner, rank=1)
    hub.emit(_round_started())
    assert hub.rank == 1 and inner.events == [] and hub.events_emitted == 0
    # A batch of one level may mix run-level events with others: only those are dropped.
    stage = ev.SeedStageChanged(
        slot="s", seed_id="x", blueprint="b", from_stage="A", to_stage="B",
        epochs_in_prev_stage=0, alpha=0.0, initiator="policy",
    )  # fmt: skip
    hub.emit_batch([_round_started(), stage])
    assert inner.events == [stage]
