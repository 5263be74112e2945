"""The native column converter gives exactly pyarrow's tables, and declines what it can't.

``events_to_table`` converts with ``esper.telemetry._columns`` where it was built, and with
pyarrow's converter otherwise (``native=False``). Both must give the same bytes for every
event type and value, and the native one must hand every value outside the catalogue's
shapes back to pyarrow (same table, or same error, as without it).
"""

from __future__ import annotations

import enum
import importlib.util
import itertools
import math
import os
import sys
import threading
import tracemalloc
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from _telemetry_support import edge_event, event_strategy
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.core.native import MODULES, NATIVE_ENV, load_native, native_status
from esper.telemetry import arrow_schema
from esper.telemetry.arrow_schema import NATIVE_SLICE_EVENTS, events_to_table, events_to_tables
from esper.telemetry.events import EVENT_TYPES, Event

needs_native = pytest.mark.skipif(
    arrow_schema._native is None, reason="the native converter was not built here"
)

STAMPS = st.fixed_dictionaries(
    {
        "run_id": st.text(max_size=12),
        "seq": st.integers(-(2**63), 2**63 - 1),
        "ts_ns": st.integers(0, 2**63 - 1),
        "rank": st.integers(0, 64),
    }
)


def ipc_bytes(table: pa.Table) -> bytes:
    """The table's exact content (``Table.equals`` calls NaN unequal to itself)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks())
    return bytes(sink.getvalue().to_pybytes())


def assert_same_as_pyarrow(cls: type[Event], events: list[Event]) -> None:
    """The native tables, read with the GIL held and with it released, are pyarrow's."""
    reference = events_to_table(cls, events, native=False)
    for release_gil in (False, True):
        native = events_to_tables({cls: events}, release_gil=release_gil)[cls]
        assert native.schema.equals(reference.schema, check_metadata=True)
        assert ipc_bytes(native) == ipc_bytes(reference)


def test_the_native_converter_is_built_where_ci_runs() -> None:
    """setup.py builds it as optional: a broken build would only show up as lost speed."""
    if not os.environ.get("CI"):
        pytest.skip("CI is not set: this build check runs under CI only (CI=1 to run it here)")
    assert arrow_schema._native is not None


@needs_native
@pytest.mark.parametrize("tag", sorted(EVENT_TYPES))
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_random_events_convert_like_pyarrow(tag: str, data: st.DataObject) -> None:
    cls = EVENT_TYPES[tag]
    events = data.draw(st.lists(event_strategy(cls), max_size=4))
    stamped = [msgspec.structs.replace(e, **data.draw(STAMPS)) for e in events]
    assert_same_as_pyarrow(cls, stamped)


@needs_native
def test_edge_values_convert_like_pyarrow() -> None:
    """NaN, infinities, -0.0, subnormals, NUL and non-ASCII strings, empty lists."""
    for cls in EVENT_TYPES.values():
        assert_same_as_pyarrow(cls, [edge_event(cls, v) for v in range(6)])


class Stage(enum.StrEnum):
    TRAINING = "training"


def _with(cls: type[Event], **fields: Any) -> Event:
    """A valid edge event with some fields replaced (msgspec does not re-validate)."""
    return msgspec.structs.replace(edge_event(cls, 1), **fields)


#: Values outside the native shapes that pyarrow still converts.
DECLINED = {
    "int in a float field": ("env_step", {"train_loss": 3}),
    "numpy float in a float field": ("env_step", {"train_loss": np.float64(0.25)}),
    "tuple for a list": ("action_taken", {"op_mask": (True, False)}),
    "int in a list of floats": ("counterfactual_computed", {"contributions": [1, 2.5]}),
}


@needs_native
@pytest.mark.parametrize("case", sorted(DECLINED))
def test_values_outside_the_native_shapes_fall_back_to_pyarrow(case: str) -> None:
    tag, fields = DECLINED[case]
    cls = EVENT_TYPES[tag]
    odd = _with(cls, **fields)
    plan = arrow_schema._native_plan(cls)
    assert arrow_schema._native is not None
    assert arrow_schema._native.convert(cls, [odd], *plan[:2], 0, 1) is None
    assert_same_as_pyarrow(cls, [edge_event(cls, 0), odd, edge_event(cls, 2)])


@needs_native
def test_str_subclasses_convert_natively_to_their_value() -> None:
    cls = EVENT_TYPES["action_taken"]
    event = _with(cls, op=Stage.TRAINING, masked_heads=[Stage.TRAINING, "x"])
    plan = arrow_schema._native_plan(cls)
    assert arrow_schema._native is not None
    assert arrow_schema._native.convert(cls, [event], *plan[:2], 0, 1) is not None
    assert_same_as_pyarrow(cls, [event])
    assert events_to_table(cls, [event])["op"].to_pylist() == ["training"]


@needs_native
def test_a_declined_slice_among_native_ones_keeps_every_row_in_order() -> None:
    cls = EVENT_TYPES["env_step"]
    n = 2 * NATIVE_SLICE_EVENTS + 5
    events = [msgspec.structs.replace(edge_event(cls, i % 6), seq=i) for i in range(n)]
    events[NATIVE_SLICE_EVENTS + 3] = _with(cls, seq=NATIVE_SLICE_EVENTS + 3, train_loss=1)
    table = events_to_table(cls, events)
    assert table["seq"].num_chunks == 3 and table.num_rows == n
    assert table["seq"].to_pylist() == list(range(n))
    assert_same_as_pyarrow(cls, events)


@needs_native
@pytest.mark.parametrize(
    ("tag", "fields"),
    [
        ("env_step", {"active_seeds": 2**64}),  # beyond int64
        ("env_step", {"active_seeds": True}),  # pyarrow: "Expected integer, got bool"
        ("action_taken", {"op": "\ud800"}),  # a lone surrogate: not UTF-8
        ("action_taken", {"masked_heads": ["ok", "\udfff"]}),
    ],
)
def test_invalid_values_raise_what_pyarrow_raises(tag: str, fields: dict[str, Any]) -> None:
    cls = EVENT_TYPES[tag]
    events = [edge_event(cls, 0), _with(cls, **fields)]
    with pytest.raises(Exception) as reference:
        events_to_table(cls, events, native=False)
    for release_gil in (False, True):
        with pytest.raises(type(reference.value)):
            events_to_tables({cls: events}, release_gil=release_gil)


@needs_native
def test_events_of_another_type_are_left_to_pyarrow() -> None:
    cls, other = EVENT_TYPES["env_step"], EVENT_TYPES["round_started"]
    plan = arrow_schema._native_plan(cls)
    assert arrow_schema._native is not None
    mixed: list[Event] = [edge_event(cls, 0), edge_event(other, 0)]
    assert arrow_schema._native.convert(cls, mixed, *plan[:2], 0, 2) is None


@needs_native
def test_out_of_range_slices_and_bad_plans_are_refused() -> None:
    cls = EVENT_TYPES["round_started"]
    descriptors, kinds, _ = arrow_schema._native_plan(cls)
    native = arrow_schema._native
    assert native is not None
    events = [edge_event(cls, 0)]
    with pytest.raises(IndexError):
        native.convert(cls, events, descriptors, kinds, 0, 2)
    with pytest.raises(ValueError, match="one kind per descriptor"):
        native.convert(cls, events, descriptors, kinds[:-1], 0, 1)
    with pytest.raises(ValueError, match="unknown column kind"):
        native.convert(cls, events, descriptors, b"x" * len(kinds), 0, 1)
    with pytest.raises(TypeError, match="not an object slot"):
        native.convert(cls, events, (math.pi,) * len(kinds), kinds, 0, 1)
    other = arrow_schema._native_plan(EVENT_TYPES["run_started"])  # more, later slots
    with pytest.raises(TypeError, match="not a slot of"):
        native.convert(cls, events, other.descriptors[-1:], other.kinds[-1:], 0, 1)
    good = (cls, events, descriptors, kinds, 0, 1)
    with pytest.raises(IndexError):  # one bad job among good ones: nothing converted
        native.convert_many([good, (cls, events, descriptors, kinds, 0, 2), good], True)
    with pytest.raises(TypeError, match="a job is a tuple"):
        native.convert_many([list(good)], True)


@needs_native
@pytest.mark.parametrize("value", [Stage.TRAINING, "ünïcode", "\ud800"])
def test_a_str_that_needs_the_gil_mid_slice_redoes_only_its_column(value: str) -> None:
    """The GIL-free pass takes compact ASCII strs only: a str subclass, a non-ASCII str
    or a lone surrogate part-way through a column sends that column to the pass with
    the GIL, from its first row; every other column keeps its GIL-free values."""
    cls = EVENT_TYPES["action_taken"]
    events = [msgspec.structs.replace(edge_event(cls, 4), seq=i) for i in range(40)]
    events[25] = msgspec.structs.replace(events[25], op=value)
    if value == "\ud800":  # not UTF-8: pyarrow's own error, either way
        for release_gil in (False, True):
            with pytest.raises(UnicodeEncodeError):
                events_to_tables({cls: events}, release_gil=release_gil)
        return
    assert_same_as_pyarrow(cls, events)


@needs_native
def test_one_call_converts_many_slices_like_one_call_each() -> None:
    """``convert_many`` returns what ``convert`` returns for each job, declined ones
    included, whether it releases the GIL or not."""
    native = arrow_schema._native
    assert native is not None
    jobs = []
    for i, tag in enumerate(("counterfactual_computed", "env_step", "action_taken")):
        cls = EVENT_TYPES[tag]
        plan = arrow_schema._native_plan(cls)
        events = [edge_event(cls, v % 6) for v in range(30 + i)]
        jobs += [(cls, events, *plan[:2], 0, 10), (cls, events, *plan[:2], 10, 30 + i)]
    step = EVENT_TYPES["env_step"]
    odd = [_with(step, train_loss=1)]
    jobs.append((step, odd, *arrow_schema._native_plan(step)[:2], 0, 1))

    def flat(result: Any) -> Any:
        if result is None or isinstance(result, list | tuple):
            return None if result is None else [flat(r) for r in result]
        return bytes(memoryview(result))

    expected = [flat(native.convert(*job)) for job in jobs]
    assert expected[-1] is None
    for release_gil in (False, True):
        assert [flat(r) for r in native.convert_many(jobs, release_gil)] == expected


def _runs_during_conversion(job: tuple[Any, ...], release_gil: bool) -> bool:
    """Whether this thread ran while another was inside ``convert_many(job)``.

    Deterministic: with a switch interval far longer than the test, the converting
    thread gives up the GIL only where it releases it. This thread, woken by
    ``started``, can run before the conversion returns only if it was released; it
    then sees ``converting`` still set."""
    native = arrow_schema._native
    assert native is not None
    state = {"converting": False}
    started = threading.Event()

    def convert() -> None:
        state["converting"] = True
        started.set()
        native.convert_many([job], release_gil)
        state["converting"] = False

    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        worker = threading.Thread(target=convert)
        worker.start()
        started.wait()
        seen = state["converting"]
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    return seen


@needs_native
def test_a_batch_is_converted_with_the_gil_released() -> None:
    """Another thread runs while ``convert_many(..., True)`` reads the events, and not
    while ``convert_many(..., False)`` does."""
    cls = EVENT_TYPES["env_step"]
    events = [edge_event(cls, v % 6) for v in range(2000)]
    job = (cls, events, *arrow_schema._native_plan(cls)[:2], 0, len(events))
    assert _runs_during_conversion(job, release_gil=True)
    assert not _runs_during_conversion(job, release_gil=False)


@needs_native
@pytest.mark.parametrize("release_gil", [False, True])
def test_repeated_conversions_do_not_grow_memory(release_gil: bool) -> None:
    """Buffers and arrays are released (a reference leak would grow with every call)."""
    cls = EVENT_TYPES["counterfactual_computed"]
    events = list(itertools.islice(itertools.cycle(edge_event(cls, v) for v in range(6)), 2000))
    one_call = len(ipc_bytes(events_to_table(cls, events)))

    def convert() -> None:
        events_to_tables({cls: events}, release_gil=release_gil)

    tracemalloc.start()
    try:
        convert()
        baseline, _ = tracemalloc.get_traced_memory()
        for _ in range(50):
            convert()
        grown, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert grown - baseline < one_call  # a leak would keep ~50 calls' buffers


@needs_native
def test_grouping_by_type_matches_the_python_grouping() -> None:
    """``group`` gives the dict of lists a Python loop gives: types in order of first
    appearance, each list in the given order, the same objects; and refuses non-lists."""
    native = arrow_schema._native
    assert native is not None
    kinds = [EVENT_TYPES[t] for t in ("env_step", "round_started", "reward_computed")]
    events = [edge_event(kinds[i % 7 % 3], i % 6) for i in range(200)]
    expected: dict[type, list[Event]] = {}
    for event in events:
        expected.setdefault(type(event), []).append(event)
    grouped = native.group(events)
    assert list(grouped) == list(expected)
    for cls, found in expected.items():  # the very objects, in order
        assert [id(e) for e in grouped[cls]] == [id(e) for e in found]
    assert native.group([]) == {}
    with pytest.raises(TypeError, match="takes a list"):
        native.group(tuple(events))


def test_esper_native_0_turns_the_accelerators_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NATIVE_ENV, "0")
    assert load_native("esper.telemetry._columns") is None
    assert native_status() == dict.fromkeys(MODULES, False)
    monkeypatch.setenv(NATIVE_ENV, "1")
    assert load_native("esper.telemetry.no_such_module") is None  # not built: None
    built = importlib.util.find_spec("esper.telemetry._columns") is not None
    assert native_status()["esper.telemetry._columns"] is built
    assert (load_native("esper.telemetry._columns") is not None) is built
