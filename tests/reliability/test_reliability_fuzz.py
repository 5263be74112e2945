"""Fuzzing (hypothesis) of the two inputs users hand us: config files and run directories.

- Configs: random nested mappings (valid keys with random values, random keys, random
  nesting) through ``config_from_dict``, and random file contents through
  ``load_config``: the only failure allowed is :class:`esper.config.ConfigError`.
- Event streams: random sequences of catalogue events with random field values, written
  by the real hub and writer, then randomly damaged on disk (truncated, overwritten or
  foreign part files, broken manifests, a crash left ``running``); every analysis
  function either succeeds or raises :class:`esper_analysis.errors.AnalysisError`.
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from esper_analysis import (
    action_distribution,
    build_report,
    capture_baseline,
    check_baseline,
    event_counts,
    load_run,
    load_runs,
    ppo_health,
    reward_breakdown,
    rollback_audit,
    seed_lifecycles,
    throughput,
)
from esper_analysis.errors import AnalysisError
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from esper.config import Config, config_from_dict, load_config
from esper.core import enums
from esper.core.enums import TelemetryLevel
from esper.errors import ConfigError
from esper.telemetry.events import ENVELOPE_FIELDS, EVENT_TYPES, Event
from esper.telemetry.hub import open_run

FUZZ = settings(
    max_examples=int(os.environ.get("ESPER_FUZZ_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# --- configs ------------------------------------------------------------------------------

_SECTIONS = {
    name: msgspec.inspect.type_info(type(getattr(Config(), name)))
    for name in Config.__struct_fields__
}
_KEYS = sorted(
    {name for name in Config.__struct_fields__}
    | {f.name for info in _SECTIONS.values() for f in info.fields}  # type: ignore[attr-defined]
)
_ENUM_WORDS = sorted(
    {
        str(v)
        for obj in vars(enums).values()
        if isinstance(obj, type) and issubclass(obj, enum.Enum)
        for m in obj
        for v in (m.name, m.name.lower(), m.value)
    }
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-3, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from([*_ENUM_WORDS, "cpu", "cuda", "cuda:0", "cuda:x", "runs", ""]),
)
keys = st.one_of(st.sampled_from(_KEYS), st.text(max_size=8))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def config_mappings(draw: st.DrawFn) -> Any:
    """Mostly the real shape (sections of real keys) with random values, sometimes junk."""
    shape = draw(st.sampled_from(["sections", "junk", "mutated"]))
    if shape == "junk":
        return draw(values)
    if shape == "mutated":
        data = msgspec.to_builtins(Config())
        section = draw(st.sampled_from(sorted(data)))
        key = draw(st.sampled_from([*sorted(data[section]), "extra"]))
        data[section][key] = draw(values)
        return data
    sections = draw(st.lists(st.sampled_from(sorted(_SECTIONS)), unique=True, max_size=4))
    out: dict[str, Any] = {}
    for name in sections:
        fields = [f.name for f in _SECTIONS[name].fields]  # type: ignore[attr-defined]
        chosen = draw(st.lists(st.sampled_from(fields), unique=True, max_size=4))
        out[name] = {k: draw(values) for k in chosen}
    return out


@FUZZ
@given(data=config_mappings())
def test_config_from_dict_raises_only_config_errors(data: Any) -> None:
    try:
        cfg = config_from_dict(data)
    except ConfigError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert isinstance(cfg, Config)
    cfg.fingerprint()  # a config that loads can be hashed and serialised
    assert config_from_dict(json.loads(cfg.to_json())) == cfg


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return (
            "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        )
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    return json.dumps(str(v))


def _toml(data: Any) -> str:
    """A TOML-ish rendering: right for the common shapes, deliberately sloppy otherwise."""
    if not isinstance(data, dict):
        return _toml_value(data)
    lines = []
    for section, body in data.items():
        if isinstance(body, dict):
            lines.append(f"[{section}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in body.items() if v is not None]
        elif body is not None:
            lines.append(f"{section} = {_toml_value(body)}")
    return "\n".join(lines) + "\n"


@FUZZ
@given(
    data=config_mappings(),
    suffix=st.sampled_from([".toml", ".json", ".TOML", ".yaml", ""]),
    noise=st.one_of(st.none(), st.binary(max_size=64)),
)
def test_load_config_raises_only_config_errors(data: Any, suffix: str, noise: bytes | None) -> None:
    if noise is not None:
        raw = noise
    elif suffix.lower() == ".json":
        raw = json.dumps(data, default=str).encode()
    else:
        raw = _toml(data).encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"config{suffix}"
        path.write_bytes(raw)
        try:
            cfg = load_config(path)
        except ConfigError as exc:
            assert str(exc) and "\n" not in str(exc).strip()
            return
    assert isinstance(cfg, Config)


# --- event streams ------------------------------------------------------------------------

_WORDS = [*_ENUM_WORDS, "r0c0", "r0c1", "conv_small", "norm", "finished", "running"]
_STAMPED = frozenset({"run_id", "seq", "ts_ns", "rank"})
_FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.floats(-5, 5)
_INTS = st.integers(-1, 4) | st.integers(-(2**62), 2**62)
_STRS = st.sampled_from(_WORDS) | st.text(max_size=6)
_SCALAR = {mi.IntType: _INTS, mi.FloatType: _FLOATS, mi.BoolType: st.booleans(), mi.StrType: _STRS}
_ENVELOPE = {"round": st.integers(-1, 3), "env": st.integers(-1, 2), "step": st.integers(-1, 4)}


def _field(info: mi.Type) -> st.SearchStrategy[Any]:
    if isinstance(info, mi.ListType | mi.VarTupleType):
        return st.lists(_SCALAR[type(info.item_type)], max_size=4)
    return _SCALAR[type(info)]


def _event_strategy(cls: type[Event]) -> st.SearchStrategy[Event]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    fields = {
        f.name: _ENVELOPE[f.name] if f.name in _ENVELOPE else _field(f.type)
        for f in info.fields
        if f.name not in _STAMPED
    }
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


events = st.one_of(*[_event_strategy(cls) for cls in EVENT_TYPES.values()])

Damage = Callable[[Path, Any], None]
#: "PAR1" + footer length + "PAR1": anything shorter has no pages to damage.
_MIN_PARQUET_BYTES = 12


def _parts(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "events").rglob("*.parquet"))


#: Positions are drawn on a fixed scale and mapped onto the file at hand: file sizes and
#: part counts depend on flush timing and timestamps, and Hypothesis needs draws that do
#: not depend on external state (else it raises FlakyStrategyDefinition on replay).
_POSITION_SCALE = 2**20


def _position(draw: Any, n: int) -> int:
    """An index in ``range(n)`` (n >= 1) drawn independently of ``n``."""
    return draw(st.integers(0, _POSITION_SCALE - 1)) * n // _POSITION_SCALE


def _pick(paths: list[Path], draw: Any) -> Path | None:
    """A part file with at least a Parquet header and trailer, if there is one."""
    sizable = [p for p in paths if p.stat().st_size >= _MIN_PARQUET_BYTES]
    return sizable[_position(draw, len(sizable))] if sizable else None


def _truncate(run_dir: Path, draw: Any) -> None:
    if (p := _pick(_parts(run_dir), draw)) is not None:
        raw = p.read_bytes()
        p.write_bytes(raw[: _position(draw, len(raw))])


def _scribble(run_dir: Path, draw: Any) -> None:
    if (p := _pick(_parts(run_dir), draw)) is not None:
        raw = bytearray(p.read_bytes())
        for _ in range(draw(st.integers(1, 40))):
            raw[_position(draw, len(raw))] = draw(st.integers(0, 255))
        p.write_bytes(bytes(raw))


def _zero_pages(run_dir: Path, draw: Any) -> None:
    if (p := _pick(_parts(run_dir), draw)) is not None:
        raw = bytearray(p.read_bytes())
        footer = int.from_bytes(raw[-8:-4], "little") + 8
        end = max(len(raw) - footer, 4)
        raw[4:end] = bytes(end - 4)
        p.write_bytes(bytes(raw))


def _foreign_part(run_dir: Path, draw: Any) -> None:
    tag = draw(st.sampled_from(sorted(EVENT_TYPES)))
    target = run_dir / "events" / f"type={tag}" / "rank=0" / "part-900000.parquet"
    target.parent.mkdir(parents=True, exist_ok=True)
    column = draw(st.sampled_from(["seq", "round", "env", "total", "status", "slots"]))
    table = draw(
        st.sampled_from(
            [
                pa.table({column: ["x", "y"]}),
                pa.table({column: [1.5, None]}),
                pa.table({column: [[1], [2, 3]]}),
                pa.table({"unrelated": [1, 2]}),
            ]
        )
    )
    pq.write_table(table, target)


def _empty_part(run_dir: Path, draw: Any) -> None:
    tag = draw(st.sampled_from(sorted(EVENT_TYPES)))
    target = run_dir / "events" / f"type={tag}" / "rank=0" / "part-900001.parquet"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"")


def _manifest_dict(path: Path) -> dict[str, Any]:
    """The manifest as a dict, or an empty one if an earlier damage broke it."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _break_manifest(run_dir: Path, draw: Any) -> None:
    path = run_dir / "manifest.json"
    choice = draw(st.sampled_from(["delete", "garbage", "types", "array"]))
    if choice == "delete":
        path.unlink(missing_ok=True)
    elif choice == "garbage":
        path.write_bytes(draw(st.binary(max_size=30)))
    elif choice == "array":
        path.write_text("[1, 2]")
    else:
        data = _manifest_dict(path)
        key = draw(
            st.sampled_from(
                [
                    "status",
                    "schema_version",
                    "pid",
                    "heartbeat_ns",
                    "flush_interval_s",
                    "counts",
                    "pending_compactions",
                    "rank",
                    "last_seq",
                    "run_id",
                ]
            )
        )
        data[key] = draw(values)
        path.write_text(json.dumps(data, default=str))


def _crash(run_dir: Path, draw: Any) -> None:
    """What a kill -9 leaves: status running, a dead pid, no run_finished."""
    path = run_dir / "manifest.json"
    if path.exists():
        data = _manifest_dict(path)
        data.update(status="running", pid=2**22 + 11, heartbeat_ns=0)
        path.write_text(json.dumps(data))
    shutil.rmtree(run_dir / "events" / "type=run_finished", ignore_errors=True)


DAMAGES: dict[str, Damage] = {
    "truncate": _truncate,
    "scribble": _scribble,
    "zero_pages": _zero_pages,
    "foreign_part": _foreign_part,
    "empty_part": _empty_part,
    "break_manifest": _break_manifest,
    "crash": _crash,
}

ANALYSES: list[Callable[[Any], Any]] = [
    event_counts,
    reward_breakdown,
    rollback_audit,
    seed_lifecycles,
    action_distribution,
    ppo_health,
    throughput,
    capture_baseline,
    lambda run: check_baseline(run, capture_baseline(run)),
    build_report,
]


def _write_run(root: Path, stream: list[Event]) -> Path:
    with open_run(root, "fuzz", level=TelemetryLevel.DEBUG, flush_interval_s=0.02) as hub:
        for event in stream:
            hub.emit(event)
    return root / "fuzz"


def _analyse_everything(run_dir: Path) -> None:
    """Every analysis either works or raises the analysis layer's documented error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # skipped files and unknown types warn by design
        try:
            run = load_run(run_dir)
            load_runs(run_dir.parent)
            _ = run.status, run.recovery, run.event_types
        except AnalysisError:
            return
        for analysis in ANALYSES:
            with contextlib.suppress(AnalysisError):
                analysis(run)


# No shrinking: every example writes a run; shrinking one failure can take minutes, and
# the failing example is printed as found (with its seed) either way.
@settings(FUZZ, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(
    stream=st.lists(events, max_size=40),
    damage=st.lists(st.sampled_from(sorted(DAMAGES)), max_size=3),
    data=st.data(),
)
def test_analysis_survives_random_streams_and_damage(
    stream: list[Event], damage: list[str], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = _write_run(Path(tmp), stream)
        _analyse_everything(run_dir)  # the intact run first
        for name in damage:
            DAMAGES[name](run_dir, data.draw)
        _analyse_everything(run_dir)


#: The soak's examples: 4x the quick test's, with streams twice as long and more damage
#: (ESPER_FUZZ_SOAK_EXAMPLES=300 for a longer search; about 0.4 s an example on 2 cores).
SOAK_EXAMPLES = int(os.environ.get("ESPER_FUZZ_SOAK_EXAMPLES", "100"))


@pytest.mark.slow
@settings(FUZZ, max_examples=SOAK_EXAMPLES, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(
    stream=st.lists(events, max_size=80),
    damage=st.lists(st.sampled_from(sorted(DAMAGES)), max_size=4),
    data=st.data(),
)
def test_analysis_survives_many_more_streams(
    stream: list[Event], damage: list[str], data: st.DataObject
) -> None:
    test_analysis_survives_random_streams_and_damage.hypothesis.inner_test(  # type: ignore[attr-defined]
        stream, damage, data
    )


def test_envelope_fields_are_what_the_fuzzer_assumes() -> None:
    assert set(_ENVELOPE) | _STAMPED == set(ENVELOPE_FIELDS)


@pytest.mark.parametrize("name", sorted(DAMAGES))
@settings(FUZZ, max_examples=5, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(stream=st.lists(events, min_size=1, max_size=20), data=st.data())
def test_each_damage_kind_is_survived(name: str, stream: list[Event], data: st.DataObject) -> None:
    """Every kind of damage gets examples of its own, whatever the mixed test draws."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = _write_run(Path(tmp), stream)
        DAMAGES[name](run_dir, data.draw)
        _analyse_everything(run_dir)
