"""Morphogenetic models: hosts, seed slots, lifecycle, blueprints and blending.

Model code reports lifecycle changes as the events themselves (plain Structs from
:mod:`esper.telemetry.events`) through a callback; it never touches the hub or writer.
"""

from esper.model.builder import build_host, build_model
from esper.model.lifecycle import IllegalTransitionError
from esper.model.metrics import ParamCounts
from esper.model.morphogenetic import MorphogeneticModel, Reporter
from esper.model.registry import DEFAULT_REGISTRY, BlueprintRegistry

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
