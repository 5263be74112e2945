"""Events emitted as columns (one call per step and type) give the files Structs give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import numpy as np
import pytest
from _telemetry_support import STAMPED, all_seqs, edge_event, read_type, rows_equal

from esper.core.enums import TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.emit_log import EmitLogHub
from esper.telemetry.event_columns import EventColumns
from esper.telemetry.events import EVENT_TYPES, Event
from esper.telemetry.hub import NullHub, open_run
from esper.telemetry.manifest import read_manifest
from esper.telemetry.memory_hub import MemoryHub
from esper.telemetry.paths import manifest_path

#: Edge-value variants per type (every variant of :func:`edge_event`).
VARIANTS = range(6)


def _as_columns(events: list[Event]) -> EventColumns:
    """The same unstamped events as columns: a list field as an object array of lists."""
    cls = type(events[0])
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    columns: dict[str, Any] = {}
    for f in info.fields:
        if f.name in STAMPED:
            continue
        values = [getattr(e, f.name) for e in events]
        if isinstance(f.type, mi.ListType):
            array = np.empty(len(values), dtype=object)
            array[:] = values
            columns[f.name] = array
        else:
            columns[f.name] = values
    return EventColumns(cls, len(events), columns)


def _unstamped(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("ts_ns", "run_id")}


@pytest.mark.parametrize("tag", sorted(EVENT_TYPES))
def test_columns_write_the_rows_structs_write(tmp_path: Path, tag: str) -> None:
    cls = EVENT_TYPES[tag]
    with open_run(tmp_path, "structs", level=TelemetryLevel.DEBUG) as structs:
        structs.emit_batch([edge_event(cls, v) for v in VARIANTS])
    with open_run(tmp_path, "columns", level=TelemetryLevel.DEBUG) as columns:
        columns.emit_columns(_as_columns([edge_event(cls, v) for v in VARIANTS]))
    assert structs.run_dir is not None and columns.run_dir is not None
    expected, got = read_type(structs.run_dir, tag), read_type(columns.run_dir, tag)
    assert len(got) == len(expected) >= len(VARIANTS)
    if tag == "writer_stats":  # the close's own row (last) counts this run's file bytes,
        expected, got = expected[:-1], got[:-1]  # which vary with the timestamps in them
    for a, b in zip(expected, got, strict=True):
        assert rows_equal(_unstamped(a), _unstamped(b)) == []


def test_a_batch_takes_a_seq_range_between_single_events(tmp_path: Path) -> None:
    n = 16
    steps = {"round": 0, "env": np.arange(n), "step": 3, "train_loss": np.linspace(0, 1, n)}
    zeros = {f: 0.0 for f in ("train_acc", "val_loss", "val_acc", "train_ms", "val_ms")}
    zeros |= {"features_ms": 0.0, "policy_ms": 0.0}
    counts = {"active_seeds": 0, "host_params": 10, "seed_params": np.zeros(n, dtype=np.int64)}
    with open_run(tmp_path, "mixed", level=TelemetryLevel.NORMAL) as hub:
        hub.emit(ev.RoundStarted(round=0, n_envs=n, episode_length=4, entropy_coef=0.0, lr=0.0))
        batch = EventColumns(ev.EnvStep, n, steps | zeros | counts)
        hub.emit_columns(batch)
        hub.emit(ev.RoundStarted(round=1, n_envs=n, episode_length=4, entropy_coef=0.0, lr=0.0))
        assert (batch.seq, batch.last_seq, hub.next_seq) == (1, n, n + 2)
        with pytest.raises(ValueError, match="already emitted"):
            hub.emit_columns(batch)
    assert hub.run_dir is not None
    rows = read_type(hub.run_dir, "env_step")
    assert [r["seq"] for r in rows] == list(range(1, n + 1))
    assert [r["env"] for r in rows] == list(range(n))
    assert [r["train_loss"] for r in rows] == np.linspace(0, 1, n).tolist()
    assert {r["ts_ns"] for r in rows} == {batch.ts_ns}  # one timestamp for the batch
    assert sorted(all_seqs(hub.run_dir)) == list(range(n + 3))  # + writer_stats
    manifest = read_manifest(manifest_path(hub.run_dir, 0))
    assert manifest.counts["env_step"] == n and manifest.last_seq == n + 2


def test_bad_columns_are_named() -> None:
    with pytest.raises(
        TypeError, match=r"unknown \['stepp'\], missing \['entropy_coef', 'episode_length'"
    ):
        EventColumns(ev.RoundStarted, 2, {"stepp": 0, "round": 0})
    batch = EventColumns(
        ev.RoundStarted, 3, {"n_envs": [1, 2], "episode_length": 4, "entropy_coef": 0.0, "lr": 0.0}
    )
    batch.stamp("x", 0, 0, 0)
    with pytest.raises(ValueError, match=r"RoundStarted.n_envs: 2 values for 3 events"):
        batch.table()


def test_memory_null_and_emit_log_hubs_take_columns(tmp_path: Path) -> None:
    events = [edge_event(ev.ActionTaken, v) for v in VARIANTS]
    memory = MemoryHub(level=TelemetryLevel.NORMAL)
    logged = EmitLogHub(memory, tmp_path / "emit.log")
    logged.emit_columns(_as_columns(events))
    logged.emit_columns(_as_columns([edge_event(ev.LayerGradStats, 0)]))  # debug: filtered
    assert memory.next_seq == len(events)
    for expected, got in zip(events, memory.events, strict=True):
        row = msgspec.structs.asdict(got)
        assert row["seq"] == memory.events.index(got)
        assert rows_equal(_unstamped(msgspec.structs.asdict(expected)) | {"seq": -1},
                          _unstamped(row) | {"seq": -1}) == []  # fmt: skip
    lines = (tmp_path / "emit.log").read_text().splitlines()
    assert [int(line.split()[0]) for line in lines] == list(range(len(events)))
    null = NullHub()
    null.emit_columns(_as_columns(events))
    assert null.next_seq == 0


def test_full_buffer_blocks_for_a_batch_or_drops_it_whole(tmp_path: Path) -> None:
    n, batches = 8, 60
    env = np.arange(n)

    def batch(i: int) -> EventColumns:
        cols = {"round": 0, "env": env, "step": i, "family": "accuracy", "op": "WAIT"}
        cols |= {f: 0.0 for f in ev.REWARD_COMPONENTS} | {"total": 0.0, "normalized": 0.0}
        return EventColumns(ev.RewardComputed, n, cols)

    for drop in (False, True):
        hub = open_run(
            tmp_path, f"full-{drop}", level=TelemetryLevel.NORMAL, queue_capacity=20,
            flush_interval_s=0.05, drop_when_full=drop,
        )  # fmt: skip
        with hub:
            for i in range(batches):
                hub.emit_columns(batch(i))
        assert hub.run_dir is not None
        (stats,) = read_type(hub.run_dir, "writer_stats")
        written = read_type(hub.run_dir, "reward_computed")
        assert len(written) + stats["dropped"] == n * batches
        assert stats["dropped"] % n == 0 and (stats["dropped"] > 0) == drop
        assert stats["max_queue_depth"] <= 20 + n - 1
        assert sorted(all_seqs(hub.run_dir)) == list(range(len(written) + 1))
