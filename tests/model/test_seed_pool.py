"""The seed pool: a removed seed's modules serve a later germination, initialised to the
values a newly built module gets (so runs are the same with or without the pool)."""

from __future__ import annotations

import pytest
import torch
from _model_support import germinate, perturb_seed, tiny_model

from esper.core.constants import CNN_BLUEPRINTS, TRANSFORMER_BLUEPRINTS
from esper.core.enums import GerminationStyle, Initiator, PruneReason, SeedStage, Topology
from esper.model import MorphogeneticModel
from esper.model.seed_pool import SeedPool

#: Ticks enough for any cooldown to end.
MAX_COOLDOWN_TICKS = 50


def _model(
    topology: Topology, *, channels_last: bool, pool: SeedPool | None = None
) -> MorphogeneticModel:
    model = tiny_model(topology)
    if pool is not None:
        model.pool = pool
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model


def _prune_to_dormant(model: MorphogeneticModel, slot: str) -> None:
    assert model.prune(slot, speed=0, reason=PruneReason.POLICY, initiator=Initiator.POLICY)
    for _ in range(MAX_COOLDOWN_TICKS):
        if model.slot(slot).stage == SeedStage.DORMANT:
            return
        model.tick(50.0)
    raise AssertionError("the pruned slot never became dormant")


def _tensors(model: MorphogeneticModel, slot: str) -> dict[str, torch.Tensor]:
    return {**dict(model.slot(slot).named_parameters()), **dict(model.slot(slot).named_buffers())}


def _assert_same_seed(a: MorphogeneticModel, b: MorphogeneticModel, slot: str) -> None:
    ta, tb = _tensors(a, slot), _tensors(b, slot)
    assert ta.keys() == tb.keys()
    for name, t in ta.items():
        assert torch.equal(t, tb[name]), name
        assert t.stride() == tb[name].stride(), name  # the same memory format
        assert t.requires_grad == tb[name].requires_grad, name


CASES = [(Topology.CNN, bp, cl) for bp in CNN_BLUEPRINTS for cl in (False, True)] + [
    (Topology.TRANSFORMER, bp, False) for bp in TRANSFORMER_BLUEPRINTS
]


@pytest.mark.parametrize(("topology", "blueprint", "channels_last"), CASES)
@pytest.mark.parametrize("style", [GerminationStyle.LINEAR_ADD, GerminationStyle.GATED_GATE])
def test_a_removed_seed_is_grown_again_with_the_values_of_a_new_one(
    topology: Topology, blueprint: str, channels_last: bool, style: GerminationStyle
) -> None:
    reused, built = (_model(topology, channels_last=channels_last) for _ in range(2))
    slot = reused.slot_ids[0]
    for model in (reused, built):
        germinate(model, slot, blueprint, style)
        perturb_seed(model, slot)  # trained: its values are no longer the initial ones
    first = reused.slot(slot).seed
    first_gate = reused.slot(slot).gate
    old_storage = [t.detach() for t in _tensors(reused, slot).values()]  # kept alive
    for model in (reused, built):
        for p in model.seed_parameters(slot):
            p.grad = torch.ones_like(p)
            p.requires_grad_(False)  # as a scheduled prune leaves them
        _prune_to_dormant(model, slot)
    built.pool = SeedPool()  # nothing to reuse: its second seed is built
    for model in (reused, built):
        germinate(model, slot, blueprint, style)
    assert reused.slot(slot).seed is first
    assert reused.slot(slot).gate is first_gate
    assert built.slot(slot).seed is not first
    _assert_same_seed(reused, built, slot)
    assert all(p.grad is None and p.requires_grad for p in reused.seed_parameters(slot))
    # New tensors: the old ones may be a batched store's row that another seed now uses.
    for t in old_storage:
        t.fill_(7.0)
    _assert_same_seed(reused, built, slot)


def test_one_pool_serves_the_germinations_of_every_model_that_shares_it() -> None:
    shared = SeedPool()
    donor, taker = (_model(Topology.CNN, channels_last=True, pool=shared) for _ in range(2))
    alone = _model(Topology.CNN, channels_last=True)
    slot = donor.slot_ids[0]
    germinate(donor, slot, "conv_heavy")
    module = donor.slot(slot).seed
    _prune_to_dormant(donor, slot)
    assert len(shared) == 1
    germinate(taker, slot, "conv_heavy")
    germinate(alone, slot, "conv_heavy")
    assert taker.slot(slot).seed is module and len(shared) == 0
    _assert_same_seed(taker, alone, slot)


def test_a_module_laid_out_unlike_the_host_is_not_reused() -> None:
    """A spare from a model in another memory format (or on another device) is left
    alone: the seed is built, laid out like its own host."""
    shared = SeedPool()
    plain = _model(Topology.CNN, channels_last=False, pool=shared)
    last = _model(Topology.CNN, channels_last=True, pool=shared)
    alone = _model(Topology.CNN, channels_last=True)
    slot = plain.slot_ids[0]
    germinate(plain, slot, "conv_heavy")
    module = plain.slot(slot).seed
    _prune_to_dormant(plain, slot)
    germinate(last, slot, "conv_heavy")
    germinate(alone, slot, "conv_heavy")
    assert last.slot(slot).seed is not module
    _assert_same_seed(last, alone, slot)
