"""Generate ``schemas/`` from the event Structs, and compare it with what is committed.

Three artefacts, all derived from :mod:`esper.telemetry.events` and deterministic
(sorted keys, two-space indent, trailing newline):

- ``schemas/json/<type>.schema.json``: JSON Schema of each event (msgspec);
- ``schemas/arrow/<type>.json``: the Arrow/Parquet table schema of each event type;
- ``schemas/catalogue.json``: schema version, envelope, and per type its level and fields.

A test regenerates them and fails on any difference, so a schema change is always a
reviewed change (with a :data:`~esper.telemetry.events.SCHEMA_VERSION` bump when an
existing field changes).
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any, Final

import msgspec
import msgspec.inspect as mi

from esper.telemetry.arrow_schema import column_names, schema_description
from esper.telemetry.events import (
    ENVELOPE_FIELDS,
    EVENT_LEVELS,
    EVENT_TYPES,
    SCHEMA_VERSION,
    Event,
)
from esper.telemetry.paths import tmp_path_for

CATALOGUE_NAME: Final = "catalogue.json"
JSON_DIR: Final = "json"
ARROW_DIR: Final = "arrow"
#: Files the generator owns under ``schemas/`` (anything else there is reported as extra).
GENERATED_SUFFIXES: Final = (".json",)


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _type_name(info: mi.Type) -> str:
    if isinstance(info, mi.ListType):
        return f"list[{_type_name(info.item_type)}]"
    names = {mi.StrType: "str", mi.IntType: "int", mi.FloatType: "float", mi.BoolType: "bool"}
    return names[type(info)]


def _catalogue_entry(cls: type[Event]) -> dict[str, Any]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    types = {f.name: _type_name(f.type) for f in info.fields}
    return {
        "level": EVENT_LEVELS[cls].name.lower(),
        "fields": [
            {"name": name, "type": types[name]}
            for name in column_names(cls)
            if name not in ENVELOPE_FIELDS
        ],
    }


def generate() -> dict[str, str]:
    """Every generated file, as ``{relative path: content}``."""
    files: dict[str, str] = {}
    catalogue: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "envelope": list(ENVELOPE_FIELDS),
        "events": {},
    }
    for tag in sorted(EVENT_TYPES):
        cls = EVENT_TYPES[tag]
        json_schema = _clean_descriptions(msgspec.json.schema(cls))
        files[f"{JSON_DIR}/{tag}.schema.json"] = _dump(json_schema)
        files[f"{ARROW_DIR}/{tag}.json"] = _dump(
            {
                "event_type": tag,
                "schema_version": SCHEMA_VERSION,
                "fields": schema_description(cls),
            }
        )
        catalogue["events"][tag] = _catalogue_entry(cls)
    files[CATALOGUE_NAME] = _dump(catalogue)
    return files


def _clean_descriptions(node: Any) -> Any:
    """The schema with each docstring-derived ``description`` dedented
    (``inspect.cleandoc``): msgspec 0.22 keeps a docstring's indentation and 0.23
    removes it, and the committed files must not depend on which one is installed."""
    if isinstance(node, dict):
        return {
            k: inspect.cleandoc(v) if k == "description" and isinstance(v, str)
            else _clean_descriptions(v)
            for k, v in node.items()
        }  # fmt: skip
    if isinstance(node, list):
        return [_clean_descriptions(v) for v in node]
    return node


def _existing(root: Path) -> dict[str, str]:
    if not root.is_dir():
        return {}
    return {
        p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in GENERATED_SUFFIXES
    }


def check(root: Path) -> list[str]:
    """Differences between ``root`` and what the code generates (empty: up to date)."""
    wanted = generate()
    have = _existing(root)
    problems = [f"missing: {name}" for name in sorted(wanted.keys() - have.keys())]
    problems += [f"stale (not generated): {name}" for name in sorted(have.keys() - wanted.keys())]
    problems += [
        f"differs: {name}"
        for name in sorted(wanted.keys() & have.keys())
        if wanted[name] != have[name]
    ]
    return problems


def write(root: Path) -> list[str]:
    """Regenerate ``root``; return the relative paths that changed or were removed."""
    wanted = generate()
    have = _existing(root)
    changed: list[str] = []
    for name, content in wanted.items():
        if have.get(name) == content:
            continue
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_path_for(path)
        tmp.write_text(content, encoding="utf-8")
        os.replace(tmp, path)
        changed.append(name)
    for name in sorted(have.keys() - wanted.keys()):
        (root / name).unlink()
        changed.append(name)
    return sorted(changed)


def default_schemas_dir() -> Path:
    """``schemas/`` of the source checkout this package runs from, else ``./schemas``."""
    repo = Path(__file__).resolve().parents[3]
    if (repo / "pyproject.toml").is_file() and (repo / "src" / "esper").is_dir():
        return repo / "schemas"
    return Path.cwd() / "schemas"
