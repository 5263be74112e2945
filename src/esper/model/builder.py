"""Build a morphogenetic model for a task from the host configuration.

Construction never touches the global RNG: modules are created on the meta device and
initialised from a ``torch.Generator`` seeded with ``seed``, so the same seed gives the
same weights whatever else the process has sampled.
"""

from __future__ import annotations

import torch

from esper.config import HostConfig
from esper.core.constants import RECOMMENDED_SLOTS
from esper.core.enums import Topology
from esper.data.tasks import TaskSpec
from esper.model.hosts import CNNHost, HostNetwork, TransformerHost
from esper.model.initialization import init_module, materialize
from esper.model.morphogenetic import MorphogeneticModel, Reporter
from esper.model.seed_pool import SeedPool
from esper.model.slot_table import SlotTable


def build_host(
    host: HostConfig, spec: TaskSpec, *, seed: int, materialized: bool = True
) -> HostNetwork:
    """The host network for ``spec``'s topology, deterministically initialised; with
    ``materialized=False`` only its structure, on the meta device (its tensors are then
    placed and initialised by the caller: :func:`initialise_host`)."""
    if spec.topology == Topology.CNN:
        if len(spec.input_shape) != 3:
            raise ValueError(f"CNN hosts need (C, H, W) inputs, got {spec.input_shape}")
        channels, height, width = spec.input_shape

        def factory() -> HostNetwork:
            return CNNHost(
                in_channels=channels,
                spatial=min(height, width),
                num_classes=spec.num_classes,
                base_channels=host.base_channels,
                n_blocks=host.n_blocks,
                block_channels=tuple(host.block_channels),
            )
    else:
        if len(spec.input_shape) != 1:
            raise ValueError(f"transformer hosts need (seq_len,) inputs, got {spec.input_shape}")

        def factory() -> HostNetwork:
            return TransformerHost(
                vocab=spec.num_classes,
                max_len=spec.input_shape[0],
                d_model=host.d_model,
                n_heads=host.n_heads,
                n_layers=host.n_layers,
            )

    if not materialized:
        with torch.device("meta"):
            return factory()
    network = materialize(factory, host_generator(seed))
    network.finalize()
    return network


def host_generator(seed: int) -> torch.Generator:
    """The generator a host with this seed is initialised from."""
    return torch.Generator().manual_seed(seed)


def initialise_host(network: HostNetwork, seed: int) -> None:
    """Initialise a host whose tensors have been placed (exactly :func:`build_host`'s
    values for ``seed``)."""
    init_module(network, host_generator(seed))
    network.finalize()


def build_model(
    host: HostConfig,
    spec: TaskSpec,
    *,
    seed: int,
    strict_gates: bool = False,
    reporter: Reporter | None = None,
    materialized: bool = True,
    table: SlotTable | None = None,
    row: int = 0,
    pool: SeedPool | None = None,
) -> MorphogeneticModel:
    """Host + slots for ``spec`` (on CPU; move it with ``.to(device)``; with
    ``materialized=False`` the host on the meta device: :func:`build_host`). The slots'
    state lives in row ``row`` of ``table`` (default: a table of its own); ``pool``: the
    seed pool it shares with other models (default its own)."""
    network = build_host(host, spec, seed=seed, materialized=materialized)
    return MorphogeneticModel(
        network,
        seed=seed,
        slot_ids=enabled_slots(host, network),
        max_seeds=host.max_seeds,
        strict_gates=strict_gates or host.strict_gates,
        auto_advance=host.auto_advance,
        reporter=reporter,
        table=table,
        row=row,
        pool=pool,
    )


def enabled_slots(host: HostConfig, network: HostNetwork) -> tuple[str, ...] | None:
    """The slots a model enables (None: every slot the host offers): ``host.slots``, or
    where it is unset the recommended slots of the host's topology that it offers."""
    if host.slots is not None:
        return tuple(host.slots) or None
    offered = {p.slot_id for p in network.positions}
    return tuple(s for s in RECOMMENDED_SLOTS[network.topology] if s in offered) or None
