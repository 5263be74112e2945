"""Morphogenetic models: hosts, seed slots, lifecycle, blueprints and blending.

Model code reports lifecycle changes as the events themselves (plain Structs from
:mod:`esper.telemetry.events`) through a callback; it never touches the hub or writer.

The package's names are loaded on first use (PEP 562), so that the torch-free modules
(``slot_table``, ``lifecycle``, ``alpha``, ``metrics``, ``gates``, ``slot_state``,
``ticks``) can be imported without torch: the telemetry demo drives them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from esper.model.builder import build_host, build_model
    from esper.model.lifecycle import IllegalTransitionError
    from esper.model.metrics import ParamCounts
    from esper.model.morphogenetic import MorphogeneticModel, Reporter
    from esper.model.registry import DEFAULT_REGISTRY, BlueprintRegistry

#: Public name -> the module that defines it.
_EXPORTS = {
    "DEFAULT_REGISTRY": "esper.model.registry",
    "BlueprintRegistry": "esper.model.registry",
    "IllegalTransitionError": "esper.model.lifecycle",
    "MorphogeneticModel": "esper.model.morphogenetic",
    "ParamCounts": "esper.model.metrics",
    "Reporter": "esper.model.morphogenetic",
    "build_host": "esper.model.builder",
    "build_model": "esper.model.builder",
}

__all__ = [
    "DEFAULT_REGISTRY",
    "BlueprintRegistry",
    "IllegalTransitionError",
    "MorphogeneticModel",
    "ParamCounts",
    "Reporter",
    "build_host",
    "build_model",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
