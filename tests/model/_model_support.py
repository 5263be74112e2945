"""Shared builders for the model tests: tiny hosts and helpers that drive seeds.

(Not a conftest: imported by name so helper functions stay explicit.)
"""

from __future__ import annotations

import math

import msgspec
import torch
from _machinery import machinery_config

from esper.config import HostConfig, TaskConfig
from esper.core.enums import GerminationStyle, Initiator, SeedStage, TaskName, Topology
from esper.data.tasks import TaskSpec, task_spec
from esper.model import MorphogeneticModel, build_model
from esper.telemetry.events import LifecycleEvent

DIGITS_SPEC = task_spec(TaskConfig())
IMAGE32_SPEC = task_spec(TaskConfig(name=TaskName.SYNTHETIC))
TEXT_SEQ = 12
TEXT_SPEC = TaskSpec(
    name=TaskName.TEXT,
    topology=Topology.TRANSFORMER,
    input_shape=(TEXT_SEQ,),
    num_classes=256,
    random_guess_loss=math.log(256),
    is_lm=True,
)
#: The whole action space's host settings (every slot; gates wait for ADVANCE).
MACHINERY_HOST = machinery_config().host


def host_config(**changes: object) -> HostConfig:
    """:data:`MACHINERY_HOST` (16-channel CNN) with ``changes``."""
    return msgspec.structs.replace(MACHINERY_HOST, **changes)


TINY_CNN = host_config(base_channels=4, n_blocks=3, max_seeds=8)
TINY_TRANSFORMER = host_config(d_model=16, n_heads=2, n_layers=4, max_seeds=8)
#: Gradient values that every seed counts as healthy (norm 1 -> per-param RMS ~1e-2).
HEALTHY_NORM = 1.0


def tiny_model(
    topology: Topology = Topology.CNN,
    *,
    seed: int = 0,
    strict: bool = False,
    records: list[LifecycleEvent] | None = None,
) -> MorphogeneticModel:
    if topology == Topology.CNN:
        return build_model(
            TINY_CNN,
            DIGITS_SPEC,
            seed=seed,
            strict_gates=strict,
            reporter=None if records is None else records.append,
        )
    return build_model(
        TINY_TRANSFORMER,
        TEXT_SPEC,
        seed=seed,
        strict_gates=strict,
        reporter=None if records is None else records.append,
    )


def sample_input(topology: Topology, batch: int = 6, *, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if topology == Topology.CNN:
        return torch.randn(batch, *DIGITS_SPEC.input_shape, generator=g)
    return torch.randint(0, 256, (batch, TEXT_SEQ), generator=g)


def healthy_grads(model: MorphogeneticModel) -> list[float]:
    return [HEALTHY_NORM] * (2 * len(model.slot_ids))


def germinate(
    model: MorphogeneticModel,
    slot: str,
    blueprint: str,
    style: GerminationStyle = GerminationStyle.LINEAR_ADD,
    *,
    tempo: int = 3,
    target: float = 1.0,
) -> None:
    ok = model.germinate(
        slot,
        blueprint,
        style,
        tempo,
        target,
        seed_id=f"seed-{slot}",
        current_acc=50.0,
        initiator=Initiator.POLICY,
    )
    assert ok


def drive_to(model: MorphogeneticModel, slot: str, stage: SeedStage, *, acc: float = 50.0) -> None:
    """Push an already germinated seed through the gates until it reaches ``stage``.

    Accuracy rises one point per tick so that strict gates' improvement checks pass too.
    """
    order = [
        SeedStage.GERMINATED,
        SeedStage.TRAINING,
        SeedStage.BLENDING,
        SeedStage.HOLDING,
        SeedStage.FOSSILIZED,
    ]
    for step in range(100):
        current = model.slot(slot).stage
        if current == stage:
            return
        assert order.index(current) < order.index(stage), (current, stage)
        if current == SeedStage.HOLDING:
            model.record_contribution(slot, 2.0)
            assert model.fossilize(slot, initiator=Initiator.POLICY)
            continue
        if not model.advance(slot, initiator=Initiator.POLICY):
            model.apply_grad_norms(healthy_grads(model))
            model.tick(acc + step)
    raise AssertionError(f"could not drive {slot} to {stage}")


def perturb_seed(
    model: MorphogeneticModel, slot: str, *, seed: int = 1, scale: float = 0.3
) -> None:
    """Make a seed non-identity (its zero-initialised last layer gets random weights)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.seed_parameters(slot):
            p.add_(scale * torch.randn(p.shape, generator=g).to(p.dtype))
