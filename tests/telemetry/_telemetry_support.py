"""Helpers shared by the telemetry tests: event strategies, reading runs back."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import polars as pl
from hypothesis import strategies as st

from esper.telemetry import events as ev
from esper.telemetry.events import ENVELOPE_FIELDS, EVENT_TYPES, Event
from esper.telemetry.paths import list_parts
from esper.telemetry.sink import ParquetSink

INT_BOUND = 2**62
#: Periodic flushes this fast let a test see several parts within a second.
FAST_FLUSH_S = 0.05
#: How long :func:`wait_for` waits for the writer thread before failing the test.
WAIT_S = 10.0
STAMPED = frozenset({"run_id", "seq", "ts_ns", "rank"})

_SCALAR_STRATEGIES: dict[type[mi.Type], st.SearchStrategy[Any]] = {
    mi.StrType: st.text(max_size=20),
    mi.IntType: st.integers(-INT_BOUND, INT_BOUND),
    mi.FloatType: st.floats(allow_nan=True, allow_infinity=True),
    mi.BoolType: st.booleans(),
}


def _field_strategy(info: mi.Type) -> st.SearchStrategy[Any]:
    if isinstance(info, mi.ListType):
        return st.lists(_SCALAR_STRATEGIES[type(info.item_type)], max_size=4)
    return _SCALAR_STRATEGIES[type(info)]


def event_strategy(cls: type[Event]) -> st.SearchStrategy[Event]:
    """Random, unstamped events of ``cls`` (the hub stamps run_id/seq/ts_ns/rank)."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    fields = {f.name: _field_strategy(f.type) for f in info.fields if f.name not in STAMPED}
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


def minimal_event(cls: type[Event], **envelope: int) -> Event:
    """A valid event of ``cls`` with zero-ish payload (for counting tests)."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    defaults: dict[type[mi.Type], Any] = {
        mi.StrType: "",
        mi.IntType: 0,
        mi.FloatType: 0.0,
        mi.BoolType: False,
    }
    kwargs: dict[str, Any] = {}
    for f in info.fields:
        if f.name in ENVELOPE_FIELDS:
            continue
        kwargs[f.name] = [] if isinstance(f.type, mi.ListType) else defaults[type(f.type)]
    kwargs.update(envelope)
    return cls(**kwargs)


def as_row(event: Event) -> dict[str, Any]:
    row = msgspec.structs.asdict(event)
    row.pop("type", None)
    return row


def read_type(run_dir: Path, tag: str) -> list[dict[str, Any]]:
    """Rows of one event type (all ranks), ordered by (rank, seq), from its live parts."""
    type_dir = run_dir / "events" / f"type={tag}"
    ranks = sorted(type_dir.glob("rank=*")) if type_dir.is_dir() else []
    parts = [p.path for rank_dir in ranks for p in list_parts(rank_dir).live]
    rows = pl.read_parquet(parts).to_dicts() if parts else []
    return sorted(rows, key=lambda r: (r["rank"], r["seq"]))


def read_all(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    return {tag: rows for tag in sorted(EVENT_TYPES) if (rows := read_type(run_dir, tag))}


def all_seqs(run_dir: Path, rank: int = 0) -> list[int]:
    """Every seq of ``rank`` across all type files, in file order (unsorted)."""
    seqs: list[int] = []
    for rows in read_all(run_dir).values():
        seqs.extend(r["seq"] for r in rows if r["rank"] == rank)
    return seqs


def same_value(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN and keeps the sign of infinities."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def rows_equal(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Names of the fields whose values differ (empty: equal)."""
    if expected.keys() != actual.keys():
        return [f"keys: {sorted(expected.keys() ^ actual.keys())}"]
    return [k for k in expected if not same_value(expected[k], actual[k])]


EDGE_VALUES = {
    str: ["", "héllo ✓ 𝄞 日本", "\x00nul", "x" * 1000],
    int: [0, INT_BOUND, -INT_BOUND, -1],
    float: [math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308],
    bool: [True, False, True, False],
}


def edge_event(cls: type[Event], variant: int) -> Event:
    """An unstamped event of ``cls`` whose fields take ``EDGE_VALUES`` (variants 0-5)."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    kwargs: dict[str, Any] = {}
    for f in info.fields:
        if f.name in ("run_id", "seq", "ts_ns", "rank"):
            continue
        if isinstance(f.type, mi.ListType):
            item = _PY[type(f.type.item_type)]
            kwargs[f.name] = EDGE_VALUES[item][: variant + 1] if variant < 3 else []
        else:
            values = EDGE_VALUES[_PY[type(f.type)]]
            kwargs[f.name] = values[variant % len(values)]
    return cls(**kwargs)


_PY: dict[type[mi.Type], type] = {
    mi.StrType: str,
    mi.IntType: int,
    mi.FloatType: float,
    mi.BoolType: bool,
}


def mixed_step(i: int) -> list[Event]:
    """Three events of step ``i``, of three types, as a training step emits them."""
    return [
        minimal_event(ev.EnvStep, step=i),
        minimal_event(ev.ActionTaken, step=i),
        minimal_event(ev.RewardComputed, step=i),
    ]


def wait_for(predicate: Callable[[], object], what: str) -> None:
    """Poll ``predicate`` (the writer works in its own thread) until true, or fail."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class SyncRecordingSink(ParquetSink):
    """The Parquet sink, recording every path it was asked to make durable."""

    def __init__(self) -> None:
        self.synced: set[Path] = set()
        self._lock = threading.Lock()

    def sync(self, files: Iterable[Path], new_dirs: Iterable[Path]) -> None:
        files, new_dirs = list(files), list(new_dirs)
        super().sync(files, new_dirs)
        with self._lock:
            self.synced.update(files, new_dirs)


def live_files(run_dir: Path) -> set[Path]:
    """Every live part file of a run (all types and ranks)."""
    return {
        p.path
        for rank_dir in run_dir.glob("events/type=*/rank=*")
        for p in list_parts(rank_dir).live
    }
