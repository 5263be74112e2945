"""Blueprint registry keyed by (topology, name).

The blueprint names are fixed by the action space (``esper.core.constants``); the
registry checks at import that every name the policy can choose has a module, and it
builds seeds deterministically from an explicit generator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import msgspec
import torch
from torch import nn

from esper.core.constants import CNN_BLUEPRINTS, TRANSFORMER_BLUEPRINTS
from esper.core.enums import Topology
from esper.model.blueprints_cnn import CNN_BLUEPRINT_CLASSES
from esper.model.blueprints_transformer import TRANSFORMER_BLUEPRINT_CLASSES
from esper.model.initialization import materialize_small

#: Builds a seed for an activation of the given width (channels or model dim).
SeedFactory = Callable[[int], nn.Module]


class Blueprint(msgspec.Struct, frozen=True):
    topology: Topology
    name: str
    factory: SeedFactory
    description: str


class UnknownBlueprintError(KeyError):
    """No blueprint of that name exists for the topology."""


class BlueprintRegistry:
    """Seed factories by topology and name."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Topology, str], Blueprint] = {}

    def register(
        self, topology: Topology, name: str, factory: SeedFactory, description: str = ""
    ) -> None:
        key = (topology, name)
        if key in self._entries:
            raise ValueError(f"blueprint {name!r} already registered for {topology.value}")
        self._entries[key] = Blueprint(topology, name, factory, description)

    def has(self, topology: Topology, name: str) -> bool:
        return (topology, name) in self._entries

    def get(self, topology: Topology, name: str) -> Blueprint:
        try:
            return self._entries[(topology, name)]
        except KeyError:
            known = ", ".join(self.names(topology))
            raise UnknownBlueprintError(
                f"no blueprint {name!r} for {topology.value} hosts (known: {known})"
            ) from None

    def names(self, topology: Topology) -> tuple[str, ...]:
        return tuple(name for (topo, name) in self._entries if topo == topology)

    def __iter__(self) -> Iterator[Blueprint]:
        return iter(self._entries.values())

    def build(
        self,
        topology: Topology,
        name: str,
        width: int,
        *,
        generator: torch.Generator,
        device: torch.device | str = "cpu",
    ) -> nn.Module:
        """A freshly initialised seed module for an activation of ``width``."""
        bp = self.get(topology, name)
        return materialize_small(lambda: bp.factory(width), generator).to(device)


def _default_registry() -> BlueprintRegistry:
    reg = BlueprintRegistry()
    tables = (
        (Topology.CNN, CNN_BLUEPRINT_CLASSES, CNN_BLUEPRINTS),
        (Topology.TRANSFORMER, TRANSFORMER_BLUEPRINT_CLASSES, TRANSFORMER_BLUEPRINTS),
    )
    for topology, classes, expected in tables:
        if tuple(classes) != tuple(expected):
            raise RuntimeError(
                f"{topology.value} blueprint modules {tuple(classes)} do not match the "
                f"action space {tuple(expected)}"
            )
        for name, cls in classes.items():
            doc = (cls.__doc__ or name).strip().splitlines()
            reg.register(topology, name, cls, doc[0] if doc else name)
    return reg


DEFAULT_REGISTRY = _default_registry()
