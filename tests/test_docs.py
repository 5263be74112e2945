"""Documentation cannot silently fall behind the config."""

from __future__ import annotations

from pathlib import Path

import msgspec

from esper.config import Config

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def _keys(node: msgspec.Struct, prefix: str = "") -> list[str]:
    """Every key path of a config struct, nested tables (``policy.eager``) included."""
    out = []
    for name in type(node).__struct_fields__:
        value = getattr(node, name)
        out.append(f"{prefix}{name}")
        if isinstance(value, msgspec.Struct):
            out += _keys(value, f"{prefix}{name}.")
    return out


def test_every_config_key_is_documented() -> None:
    text = DOC.read_text()
    keys = [k for k in _keys(Config()) if "." in k]
    missing = [k for k in keys if f"`{k}`" not in text]
    assert "policy.eager.slot_order" in keys
    assert not missing, f"docs/config.md lacks: {missing}"


def test_documented_defaults_match_the_config() -> None:
    """A row ``| `key` | `value` |`` (optionally ``: what it means``) must show the default
    the code really has. TOML inline tables (``{prune = -2.0}``) are not JSON: skipped."""
    import functools
    import re

    cfg = msgspec.to_builtins(Config())
    rows = re.findall(r"^\| `([a-z_.]+)` \| `([^`]*)`(?:: [^|]*)? \|$", DOC.read_text(), re.M)
    rows = [row for row in rows if not row[1].startswith("{")]
    assert len(rows) > 80 and any(key.startswith("policy.eager.") for key, _ in rows)
    wrong = [
        f"{key}: doc {shown}, code {actual}"
        for key, shown in rows
        if msgspec.json.decode(shown) != (actual := functools.reduce(dict.get, key.split("."), cfg))
    ]
    assert not wrong, wrong


def test_readme_config_example_loads(tmp_path: Path) -> None:
    import re

    from esper.config import load_config

    readme = DOC.parents[1] / "README.md"
    blocks = re.findall(r"```toml\n(.*?)```", readme.read_text(), re.S)
    assert blocks
    for i, block in enumerate(blocks):
        path = tmp_path / f"example{i}.toml"
        path.write_text(block)
        load_config(path)  # raises ConfigError naming the key if the example is stale


def test_every_bundled_preset_loads() -> None:
    """configs/*.toml are user-facing presets: each must load and validate."""
    from esper.config import load_config

    presets = sorted((DOC.parents[1] / "configs").glob("*.toml"))
    assert len(presets) >= 2
    for preset in presets:
        load_config(preset)
