"""The fused counterfactual forward equals K separate forwards with forced alphas."""

from __future__ import annotations

import pytest
import torch
from _model_support import drive_to, germinate, perturb_seed, sample_input, tiny_model

from esper.core.enums import GerminationStyle, SeedStage, Topology

#: Stage per slot; driven in reverse so slot 0 is still mid-blend at the end.
STAGES = [SeedStage.BLENDING, SeedStage.HOLDING, SeedStage.FOSSILIZED, SeedStage.TRAINING]


def _grown(topology: Topology):
    model = tiny_model(topology, seed=2)
    blueprints = (
        ("conv_heavy", "attention", "bottleneck", "norm")
        if topology == Topology.CNN
        else ("mlp", "attention", "lora", "norm")
    )
    styles = list(GerminationStyle)
    for i in reversed(range(len(STAGES))):
        slot = model.slot_ids[i]
        germinate(model, slot, blueprints[i % len(blueprints)], styles[i % len(styles)], tempo=5)
        drive_to(model, slot, STAGES[i])
        perturb_seed(model, slot, seed=i, scale=0.4)
    model.tick(50.0)
    assert 0.0 < model.slot(model.slot_ids[0]).alpha.alpha < 1.0
    return model.eval()


@pytest.mark.parametrize("topology", [Topology.CNN, Topology.TRANSFORMER])
def test_fused_forward_equals_separate_forced_forwards(topology: Topology) -> None:
    model = _grown(topology)
    x = sample_input(topology, 5)
    n = len(model.slot_ids)
    real = model.current_alphas()
    alphas = torch.stack(
        [
            real,
            torch.zeros(n),
            torch.rand(n, generator=torch.Generator().manual_seed(0)),
            torch.where(torch.arange(n) == 1, 0.0, real),  # leave-one-out of slot 1
        ]
    )
    with torch.inference_mode():
        fused = model.fused_forward(x, alphas)
        assert fused.shape == (4, *model(x).shape)
        for k in range(alphas.shape[0]):
            separate = model(x, alphas[k])
            assert torch.allclose(fused[k], separate, rtol=1e-5, atol=1e-6), k
        # Row 0 (the real alphas) is the model as it stands.
        assert torch.allclose(fused[0], model(x), rtol=1e-5, atol=1e-6)
        # Configs differ where a blended seed is switched off.
        assert not torch.allclose(fused[0], fused[1])


def test_forced_alpha_zero_removes_blended_seeds_exactly() -> None:
    model = _grown(Topology.CNN)
    bare = tiny_model(Topology.CNN, seed=2).eval()
    x = sample_input(Topology.CNN, 4)
    with torch.inference_mode():
        off = model(x, torch.zeros(len(model.slot_ids)))
        assert torch.equal(off, bare(x))


def test_fused_forward_refuses_train_mode_and_bad_shapes() -> None:
    model = _grown(Topology.CNN).train()
    x = sample_input(Topology.CNN, 2)
    with pytest.raises(RuntimeError, match="eval"):
        model.fused_forward(x, torch.zeros(2, len(model.slot_ids)))
    model.eval()
    with pytest.raises(ValueError, match="alphas must be"):
        model.fused_forward(x, torch.zeros(2, len(model.slot_ids) + 1))


def test_fused_forward_keeps_channels_last() -> None:
    model = _grown(Topology.CNN).to(memory_format=torch.channels_last)
    x = sample_input(Topology.CNN, 3).contiguous(memory_format=torch.channels_last)
    alphas = torch.stack([model.current_alphas(), torch.zeros(len(model.slot_ids))])
    with torch.inference_mode():
        fused = model.fused_forward(x, alphas)
        assert torch.allclose(fused[1], model(x, alphas[1]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("topology", [Topology.CNN, Topology.TRANSFORMER])
@pytest.mark.parametrize("style", list(GerminationStyle))
def test_mixed_precision_keeps_the_host_dtype(topology: Topology, style: GerminationStyle) -> None:
    """Under autocast a seed may return float32 next to a bf16 host stream; the blends
    and the straight-through output must cast it back instead of failing."""
    model = tiny_model(topology, seed=1)
    blueprints = ("norm", "depthwise") if topology == Topology.CNN else ("norm", "attention")
    for i, stage in enumerate((SeedStage.TRAINING, SeedStage.HOLDING)):
        slot = model.slot_ids[i]
        germinate(model, slot, blueprints[i], style)
        drive_to(model, slot, stage)
        perturb_seed(model, slot, seed=i)
    x = sample_input(topology, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    out.float().logsumexp(-1).mean().backward()
    assert out.dtype == torch.bfloat16
    assert any(p.grad is not None for p in model.seed_parameters(model.slot_ids[0]))
    model.eval()
    alphas = torch.stack([model.current_alphas(), torch.zeros(len(model.slot_ids))])
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        fused = model.fused_forward(x, alphas)
    assert fused.dtype == torch.bfloat16 and fused.shape[:2] == (2, 3)
