"""The configuration the machinery tests run on: the whole action space and the spec's
reward on the 16-channel host (``configs/full_action_space.toml``, the former defaults).

Why: the defaults narrow the growth to what pays on a narrow host (one blueprint, two
slots, auto-advancing gates, no early prune), so a test of every lifecycle op, blueprint,
gate decision or reward component names the config that offers them rather than relying
on the defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from esper.config import Config, load_config, with_overrides

FULL_ACTION_SPACE = Path(__file__).resolve().parent.parent / "configs" / "full_action_space.toml"


def machinery_config(overrides: dict[str, Any] | None = None, **dotted: Any) -> Config:
    """``configs/full_action_space.toml`` with ``overrides`` (dotted keys) applied."""
    return with_overrides(load_config(FULL_ACTION_SPACE), {**(overrides or {}), **dotted})
