"""Modules of removed seeds, kept so that a later germination initialises one instead
of building it.

Why: constructing an ``nn.Module`` is most of a seed's build (about 70 % of its 80-430
us per blueprint on a 2-core EPYC; a germination cost about 540 us, 4-6 % of a batched
round's host time), and a GPU waits on the host for it. A module taken from the pool is
initialised from the germination's generator exactly as a new one is
(:func:`~esper.model.initialization.reinitialise`), so a run is the same with or without
the pool, and a resumed run (whose pool starts empty) the same as an uninterrupted one.

One pool serves all the models of a trainer (the env factory's): a seed removed in one
env (a prune, a rollback, the end of a round) serves a germination in any other. The
pool holds what was removed and not taken again: at most about one module per slot of
every env (all of a round's seeds are removed at its end, then taken back).
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from esper.core.enums import Topology

#: The key of blend gates (not a blueprint name: those are identifiers).
GATE = "<blend gate>"


class SeedPool:
    """Free modules by (topology, blueprint or :data:`GATE`, slot width)."""

    def __init__(self) -> None:
        self._free: dict[tuple[Topology, str, int], list[nn.Module]] = {}

    def put(self, topology: Topology, name: str, width: int, module: nn.Module) -> None:
        """Keep ``module`` without its values: its tensors get storage of their own (the
        same shapes and layout, uninitialised), so the pool never keeps alive what they
        viewed (a batched store's rows, of a round that has ended)."""
        for t in itertools.chain(module.parameters(), module.buffers()):
            t.data = torch.empty_like(t.data)
        self._free.setdefault((topology, name, width), []).append(module)

    def take(self, topology: Topology, name: str, width: int) -> nn.Module | None:
        """A free module of this kind (removed from the pool), or None."""
        free = self._free.get((topology, name, width))
        return free.pop() if free else None

    def __len__(self) -> int:
        return sum(map(len, self._free.values()))
