"""schemas/ is generated from the Structs: drift fails here."""

from __future__ import annotations

import json
from pathlib import Path

from esper.cli import main
from esper.telemetry import schemas
from esper.telemetry.events import EVENT_LEVELS, EVENT_TYPES, SCHEMA_VERSION, event_tag

REPO_SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_committed_schemas_match_the_code() -> None:
    problems = schemas.check(REPO_SCHEMAS)
    assert problems == [], (
        "schemas/ is out of date; run `esper schemas --write`, review the diff, and bump "
        f"SCHEMA_VERSION if an existing field changed: {problems}"
    )


def test_generation_is_deterministic_and_complete(tmp_path: Path) -> None:
    assert schemas.generate() == schemas.generate()
    changed = schemas.write(tmp_path)
    assert len(changed) == 2 * len(EVENT_TYPES) + 1
    assert schemas.write(tmp_path) == []
    catalogue = json.loads((tmp_path / "catalogue.json").read_text())
    assert catalogue["schema_version"] == SCHEMA_VERSION
    for cls, level in EVENT_LEVELS.items():
        assert catalogue["events"][event_tag(cls)]["level"] == level.name.lower()
    for path in tmp_path.rglob("*.json"):
        text = path.read_text()
        assert text.endswith("}\n") and json.loads(text)


def test_descriptions_do_not_depend_on_msgspecs_docstring_handling() -> None:
    """msgspec 0.22 keeps a docstring's indentation in a schema's description and 0.23
    strips it: the generated files take the stripped form either way."""
    for text in schemas.generate().values():
        for description in _descriptions(json.loads(text)):
            assert "\n " not in description, description


def _descriptions(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [v for k, v in node.items() if k == "description" and isinstance(v, str)]
        return own + [d for v in node.values() for d in _descriptions(v)]
    if isinstance(node, list):
        return [d for v in node for d in _descriptions(v)]
    return []


def test_check_reports_every_kind_of_difference(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    schemas.write(tmp_path)
    (tmp_path / "json" / "env_step.schema.json").write_text("{}\n")
    (tmp_path / "arrow" / "ppo_update.json").unlink()
    (tmp_path / "arrow" / "old_event.json").write_text("{}\n")
    assert schemas.check(tmp_path) == [
        "missing: arrow/ppo_update.json",
        "stale (not generated): arrow/old_event.json",
        "differs: json/env_step.schema.json",
    ]
    assert main(["schemas", "--check", "--dir", str(tmp_path)]) == 1
    assert "env_step.schema.json" in capsys.readouterr().err
    assert main(["schemas", "--write", "--dir", str(tmp_path)]) == 0
    assert main(["schemas", "--check", "--dir", str(tmp_path)]) == 0
    assert not (tmp_path / "arrow" / "old_event.json").exists()
