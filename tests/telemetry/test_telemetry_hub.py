"""Hub semantics: levels, seq stamping, hub variants, context-manager statuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from _telemetry_support import all_seqs, minimal_event, read_type

from esper.core.enums import RunStatus, TelemetryLevel
from esper.errors import UserError
from esper.telemetry import events as ev
from esper.telemetry.events import UNSTAMPED_SEQ
from esper.telemetry.hub import NullHub, TelemetryHub, open_run
from esper.telemetry.manifest import read_manifest
from esper.telemetry.memory_hub import MemoryHub
from esper.telemetry.paths import manifest_path
from esper.telemetry.writer import TelemetryWriteError


def _step(i: int = 0) -> ev.Event:
    return minimal_event(ev.EnvStep, step=i)


def _debug() -> ev.Event:
    return minimal_event(ev.LayerGradStats)


def _lifecycle() -> ev.Event:
    return minimal_event(ev.RoundStarted)


def test_seq_is_gapless_across_types_and_filtered_events_consume_none(tmp_path: Path) -> None:
    with open_run(tmp_path, "seq", level=TelemetryLevel.NORMAL, flush_interval_s=0.05) as hub:
        for i in range(300):
            hub.emit(_step(i))
            hub.emit(_debug())  # above the level: dropped before stamping
            if i % 7 == 0:
                hub.emit(_lifecycle())
            if i % 50 == 0:
                hub.flush()
        assert hub.events_emitted == hub.next_seq == 300 + 43
    assert hub.run_dir is not None
    seqs = all_seqs(hub.run_dir)
    assert sorted(seqs) == list(range(len(seqs)))  # no gaps, no duplicates
    assert len(seqs) == 343 + 1  # + the final writer_stats
    for tag in ("env_step", "round_started"):
        type_seqs = [r["seq"] for r in read_type(hub.run_dir, tag)]
        assert type_seqs == sorted(set(type_seqs))  # strictly increasing within a type
    assert read_type(hub.run_dir, "layer_grad_stats") == []


def test_stamping_and_envelope(tmp_path: Path) -> None:
    hub = open_run(tmp_path, "stamp", level=TelemetryLevel.NORMAL, rank=3, start_seq=10)
    event = minimal_event(ev.EnvStep, round=2, env=1, step=5)
    hub.emit(event)
    assert (event.run_id, event.seq, event.rank) == ("stamp", 10, 3)
    assert (event.round, event.env, event.step) == (2, 1, 5)
    assert event.ts_ns > 0
    with pytest.raises(ValueError, match="already emitted"):
        hub.emit(event)
    with pytest.raises(TypeError, match="not an event type"):
        hub.emit(object())  # type: ignore[arg-type]
    hub.close()
    assert hub.run_dir is not None
    assert manifest_path(hub.run_dir, 3).name == "manifest-rank3.json"
    manifest = read_manifest(manifest_path(hub.run_dir, 3))
    assert manifest.rank == 3 and manifest.first_seq == 10 and manifest.last_seq == 11
    with pytest.raises(TelemetryWriteError, match="closed"):
        hub.emit(_step())


def test_set_level_is_an_event_and_enables_debug(tmp_path: Path) -> None:
    with open_run(tmp_path, "lvl", level=TelemetryLevel.NORMAL) as hub:
        assert hub.enabled(TelemetryLevel.NORMAL) and not hub.enabled(TelemetryLevel.DEBUG)
        hub.set_level(TelemetryLevel.DEBUG, reason="ratio_explosion", round=4, until_round=6)
        assert hub.level == TelemetryLevel.DEBUG and hub.enabled(TelemetryLevel.DEBUG)
        hub.emit(_debug())
        hub.set_level(TelemetryLevel.LIFECYCLE, reason="expired", round=7, until_round=-1)
        hub.emit(_step())  # normal is now filtered
        hub.emit(_debug())
    assert hub.run_dir is not None
    changes = read_type(hub.run_dir, "telemetry_level_changed")
    assert [(c["old_level"], c["new_level"], c["round"]) for c in changes] == [
        ("normal", "debug", 4),
        ("debug", "lifecycle", 7),
    ]
    assert changes[0]["until_round"] == 6 and changes[0]["reason"] == "ratio_explosion"
    assert len(read_type(hub.run_dir, "layer_grad_stats")) == 1
    assert read_type(hub.run_dir, "env_step") == []


def test_level_off_writes_nothing(tmp_path: Path) -> None:
    hub = open_run(tmp_path / "runs", "off", level=TelemetryLevel.OFF)
    assert isinstance(hub, NullHub)
    with hub:
        hub.emit(_step())
        hub.set_level(TelemetryLevel.DEBUG, reason="x", round=0, until_round=1)
        assert not hub.enabled(TelemetryLevel.LIFECYCLE)
        hub.flush()
    assert hub.events_emitted == 0 and hub.run_dir is None
    assert not (tmp_path / "runs").exists()


def test_memory_hub_filters_and_stamps_like_the_real_one() -> None:
    hub = MemoryHub("mem", level=TelemetryLevel.NORMAL, start_seq=5)
    hub.emit(_step())
    hub.emit(_debug())
    hub.emit(_lifecycle())
    hub.close(RunStatus.FINISHED)
    assert [e.seq for e in hub.events] == [5, 6, 7]
    assert [type(e) for e in hub.events] == [ev.EnvStep, ev.RoundStarted, ev.WriterStats]
    assert hub.of_type(ev.EnvStep)[0].run_id == "mem"
    assert hub.status is RunStatus.FINISHED and hub.closed


@pytest.mark.parametrize(
    ("exc_type", "status"),
    [(RuntimeError, RunStatus.FAILED), (KeyboardInterrupt, RunStatus.INTERRUPTED)],
)
def test_context_manager_records_failure_and_reraises(
    tmp_path: Path, exc_type: type[BaseException], status: RunStatus
) -> None:
    with pytest.raises(exc_type), open_run(tmp_path, "cm", level=TelemetryLevel.NORMAL) as hub:
        hub.emit(_step())
        raise exc_type("boom")
    assert isinstance(hub, TelemetryHub) and hub.closed and hub.run_dir is not None
    manifest = read_manifest(manifest_path(hub.run_dir, 0))
    assert manifest.status == status.value
    assert exc_type.__name__ in manifest.error
    assert manifest.counts == {"env_step": 1, "writer_stats": 1}


def test_existing_run_is_not_overwritten(tmp_path: Path) -> None:
    open_run(tmp_path, "dup", level=TelemetryLevel.NORMAL).close()
    with pytest.raises(UserError, match="already has telemetry"):
        open_run(tmp_path, "dup", level=TelemetryLevel.NORMAL)
    with pytest.raises(UserError, match="cannot resume"):
        open_run(tmp_path, "nothing-here", level=TelemetryLevel.NORMAL, resume=True)


@pytest.mark.parametrize(
    "kwargs",
    [{"rank": -1}, {"flush_interval_s": 0.0}, {"queue_capacity": 0}, {"start_seq": -2}],
)
def test_bad_arguments_are_user_errors(tmp_path: Path, kwargs: dict[str, float]) -> None:
    with pytest.raises(UserError):
        open_run(tmp_path, "bad", level=TelemetryLevel.NORMAL, **kwargs)  # type: ignore[arg-type]


def _lifecycle_records() -> list[ev.Event]:
    """A step's lifecycle records as the models report them: several types, one level."""
    return [
        minimal_event(ev.GateEvaluated, env=0),
        minimal_event(ev.SeedStageChanged, env=0),
        minimal_event(ev.SeedGerminated, env=1),
        minimal_event(ev.SeedStageChanged, env=1),
    ]


def test_a_batch_of_several_types_of_one_level_keeps_its_order(tmp_path: Path) -> None:
    hubs = [
        MemoryHub("mem", level=TelemetryLevel.LIFECYCLE),
        open_run(tmp_path, "batch", level=TelemetryLevel.LIFECYCLE),
    ]
    for hub in hubs:
        records = _lifecycle_records()
        hub.emit(_lifecycle())
        hub.emit_batch(records)
        assert [e.seq for e in records] == [1, 2, 3, 4]
        hub.close()
    run_dir = hubs[1].run_dir
    assert run_dir is not None
    got = sorted(
        (r["seq"], tag)
        for tag in ("gate_evaluated", "seed_stage_changed", "seed_germinated")
        for r in read_type(run_dir, tag)
    )
    assert [tag for _, tag in got] == [
        "gate_evaluated", "seed_stage_changed", "seed_germinated", "seed_stage_changed"
    ]  # fmt: skip


def test_a_batch_is_stamped_whole_or_not_at_all() -> None:
    hub = MemoryHub("mem", level=TelemetryLevel.LIFECYCLE, rank=3, start_seq=7)
    records = _lifecycle_records()
    hub.emit_batch(records)
    assert [(e.run_id, e.seq, e.rank) for e in records] == [("mem", s, 3) for s in range(7, 11)]
    assert len({e.ts_ns for e in records}) == 1 and records[0].ts_ns > 0  # one per batch
    # An event emitted before, anywhere in a batch: refused, naming it, none stamped.
    fresh = _lifecycle_records()
    with pytest.raises(ValueError, match="SeedStageChanged with seq=8 was already emitted"):
        hub.emit_batch([*fresh, records[1]])
    assert all(e.seq == UNSTAMPED_SEQ for e in fresh) and hub.next_seq == 11
    with pytest.raises(ValueError, match="same event twice"):
        hub.emit_batch([*fresh, fresh[0]])
    assert all(e.seq == UNSTAMPED_SEQ for e in fresh) and hub.next_seq == 11
    assert hub.events == records


def test_a_batch_below_the_level_is_dropped_and_one_of_mixed_levels_refused() -> None:
    hub = MemoryHub("mem", level=TelemetryLevel.OFF)
    records = _lifecycle_records()
    hub.emit_batch(records)
    assert hub.events == [] and all(e.seq == UNSTAMPED_SEQ for e in records)
    hub = MemoryHub("mem", level=TelemetryLevel.DEBUG)
    with pytest.raises(ValueError, match="one level"):
        hub.emit_batch([*_lifecycle_records(), _step()])
    with pytest.raises(TypeError, match="not an event type"):
        hub.emit_batch([*_lifecycle_records(), object()])  # type: ignore[list-item]
    assert hub.events == []
