"""Gradient isolation in TRAINING, identity at germination, and the blend operators."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _model_support import drive_to, germinate, perturb_seed, sample_input, tiny_model

from esper.core.constants import CNN_BLUEPRINTS, TRANSFORMER_BLUEPRINTS
from esper.core.enums import BlendOp, GerminationStyle, SeedStage, Topology
from esper.model.slot import SeedSlot

TOPOLOGY_BLUEPRINTS = [
    (Topology.CNN, CNN_BLUEPRINTS),
    (Topology.TRANSFORMER, TRANSFORMER_BLUEPRINTS),
]


def _loss(model, x: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    target = torch.zeros(logits.shape[:-1], dtype=torch.long)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


@pytest.mark.parametrize(("topology", "blueprints"), TOPOLOGY_BLUEPRINTS)
def test_training_seeds_leave_host_gradients_bitwise_unchanged(topology, blueprints) -> None:
    x = sample_input(topology, 5)
    alone = tiny_model(topology, seed=7)
    with_seeds = tiny_model(topology, seed=7)
    for i, slot in enumerate(with_seeds.slot_ids):
        germinate(
            with_seeds,
            slot,
            blueprints[i % len(blueprints)],
            list(GerminationStyle)[i % len(GerminationStyle)],
        )
        drive_to(with_seeds, slot, SeedStage.TRAINING)
        perturb_seed(with_seeds, slot, seed=i)  # make the seeds do something
    _loss(alone, x).backward()
    _loss(with_seeds, x).backward()
    for (name, a), b in zip(
        alone.host.named_parameters(), with_seeds.host_parameters(), strict=True
    ):
        assert a.grad is not None and b.grad is not None
        assert torch.equal(a.grad, b.grad), name
    for slot in with_seeds.slot_ids:
        seed_grads = [p.grad for p in with_seeds.seed_parameters(slot) if p.grad is not None]
        assert seed_grads and any(bool(g.abs().sum() > 0) for g in seed_grads), slot


def test_training_forward_under_no_grad_skips_the_seed_and_matches() -> None:
    model = tiny_model(seed=3)
    x = sample_input(Topology.CNN)
    before = model(x)
    germinate(model, model.slot_ids[0], "conv_heavy")
    drive_to(model, model.slot_ids[0], SeedStage.TRAINING)
    perturb_seed(model, model.slot_ids[0])
    with torch.no_grad():
        assert torch.equal(model(x), before.detach())
    assert torch.equal(model(x), before)


@pytest.mark.parametrize(("topology", "blueprints"), TOPOLOGY_BLUEPRINTS)
@pytest.mark.parametrize("style", list(GerminationStyle))
def test_germinating_any_blueprint_leaves_the_output_unchanged(topology, blueprints, style) -> None:
    model = tiny_model(topology, seed=11).eval()
    x = sample_input(topology, 4)
    reference = model(x)
    slots = model.slot_ids
    for i, bp in enumerate(blueprints):
        slot = slots[i % len(slots)]
        if model.slot(slot).stage != SeedStage.DORMANT:
            continue
        germinate(model, slot, bp, style)
        assert torch.equal(model(x), reference), (bp, "GERMINATED")
    stages = [SeedStage.TRAINING, SeedStage.BLENDING, SeedStage.HOLDING, SeedStage.FOSSILIZED]
    for stage in stages:  # identity-initialised seeds stay exact identities at any alpha
        for slot in model.live_seed_slots():
            drive_to(model, slot, stage)
        assert torch.equal(model(x), reference), stage


def _hand_gate(gate, x: torch.Tensor) -> torch.Tensor:
    pooled = x.mean(dim=(2, 3))
    hidden = torch.clamp(pooled @ gate.fc1.weight.T + gate.fc1.bias, min=0)
    return torch.sigmoid(hidden @ gate.fc2.weight.T + gate.fc2.bias).view(-1, 1, 1, 1)


@pytest.mark.parametrize("style", list(GerminationStyle))
@pytest.mark.parametrize("alpha", [1.0, 0.35])
def test_blend_operators_match_a_hand_computation(style: GerminationStyle, alpha: float) -> None:
    model = tiny_model(seed=5)
    slot_id = model.slot_ids[2]
    germinate(model, slot_id, "conv_small", style)
    drive_to(model, slot_id, SeedStage.HOLDING)
    perturb_seed(model, slot_id, scale=0.5)
    slot: SeedSlot = model.slot(slot_id)
    if alpha != 1.0:
        slot.alpha.force(alpha)  # an arbitrary alpha, as the counterfactual forward uses
    h = torch.randn(3, slot.width, 4, 4, generator=torch.Generator().manual_seed(0))
    seed = slot.seed
    assert seed is not None
    with torch.no_grad():
        s = seed(h)
        assert not torch.allclose(s, h)
        out = slot(h)
        op = slot.life.blend_op
        if op == BlendOp.ADD:
            expected = h + alpha * (s - h)
        elif op == BlendOp.MULTIPLY:
            expected = h * (1 + alpha * torch.tanh(s - h))
        else:
            weight = torch.clamp(alpha * _hand_gate(slot.gate, h), 0, 1)
            expected = h + weight * (s - h)
    assert torch.allclose(out, expected, rtol=1e-6, atol=1e-6)
    if alpha == 1.0 and op == BlendOp.ADD:
        assert torch.equal(out, s)  # full blend is exactly the seed's output


def test_every_seed_preserves_shape_and_starts_as_identity() -> None:
    for topology, blueprints in TOPOLOGY_BLUEPRINTS:
        model = tiny_model(topology)
        for bp in blueprints:
            for slot_id in model.slot_ids:
                width = model.slot(slot_id).width
                seed, _ = model.build_seed_modules(
                    slot_id, bp, GerminationStyle.LINEAR_ADD, torch.Generator().manual_seed(0)
                )
                shape = (2, width, 4, 4) if topology == Topology.CNN else (2, 5, width)
                h = torch.randn(shape)
                assert torch.equal(seed(h), h), (topology, bp, slot_id)
