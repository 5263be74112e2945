"""Host construction: geometry, determinism without global RNG, configuration errors."""

from __future__ import annotations

import functools

import pytest
import torch
from _model_support import (
    DIGITS_SPEC,
    IMAGE32_SPEC,
    TEXT_SPEC,
    TINY_TRANSFORMER,
    drive_to,
    germinate,
    host_config,
    perturb_seed,
    sample_input,
)

from esper.config import TaskConfig
from esper.core.constants import CNN_BLUEPRINTS, TRANSFORMER_BLUEPRINTS
from esper.core.enums import GerminationStyle, Initiator, SeedStage, TaskName, Topology
from esper.data.tasks import task_spec
from esper.model import DEFAULT_REGISTRY, build_model


def test_cnn_geometry_for_digits_and_32px_images() -> None:
    digits = build_model(host_config(), DIGITS_SPEC, seed=0)
    assert digits.topology == Topology.CNN
    assert digits.slot_ids == ("r0c0", "r1c0", "r0c1", "r1c1", "r0c2")
    assert [digits.slot(s).width for s in digits.slot_ids] == [16, 16, 32, 32, 64]
    assert digits(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    image = build_model(host_config(base_channels=8, n_blocks=4), IMAGE32_SPEC, seed=0)
    # 32 -> 16 -> 8 -> 4: a pool after each block but the last.
    assert image.slot_ids == ("r0c0", "r1c0", "r0c1", "r1c1", "r0c2", "r1c2", "r0c3")
    assert image(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    # Pools stop once the map would drop below 2x2: 8 -> 4 -> 2, then no more.
    deep = build_model(host_config(base_channels=4, n_blocks=5), DIGITS_SPEC, seed=0)
    assert deep.slot_ids == ("r0c0", "r1c0", "r0c1", "r1c1", "r0c2", "r0c3", "r0c4")
    assert deep(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_transformer_geometry_and_causality() -> None:
    model = build_model(TINY_TRANSFORMER, TEXT_SPEC, seed=0).eval()
    assert model.topology == Topology.TRANSFORMER
    assert model.slot_ids == ("r0c0", "r0c1", "r0c2", "r0c3")
    for i, slot in enumerate(model.slot_ids):  # causal seeds everywhere, blended in
        germinate(model, slot, TRANSFORMER_BLUEPRINTS[i + 2], GerminationStyle.GATED_GATE)
        drive_to(model, slot, SeedStage.HOLDING)
        perturb_seed(model, slot, seed=i)
    x = sample_input(Topology.TRANSFORMER, 2)
    logits = model(x)
    assert logits.shape == (2, TEXT_SPEC.input_shape[0], 256)
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 256  # only the last token differs
    assert torch.equal(model(changed)[:, :-1], logits[:, :-1])


def test_same_seed_same_weights_and_no_global_rng_use() -> None:
    torch.manual_seed(1234)
    before = torch.random.get_rng_state()
    a = build_model(host_config(), DIGITS_SPEC, seed=5)
    b = build_model(host_config(), DIGITS_SPEC, seed=5)
    for m in (a, b):
        m.germinate(
            "r0c1",
            "conv_heavy",
            GerminationStyle.GATED_GATE,
            3,
            1.0,
            seed_id="x",
            current_acc=0.0,
            initiator=Initiator.POLICY,
        )
    assert torch.equal(torch.random.get_rng_state(), before)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    c = build_model(host_config(), DIGITS_SPEC, seed=6)
    assert not torch.equal(c.host.segments[0][0].weight, a.host.segments[0][0].weight)


@pytest.mark.parametrize("topology", [Topology.CNN, Topology.TRANSFORMER])
def test_small_modules_built_on_the_cpu_equal_those_built_on_meta(topology: Topology) -> None:
    """Seeds and blend gates are built on the CPU under a forked RNG (faster at their
    size): the same values as construction on the meta device, no global RNG used."""
    from esper.model.blending import BlendGate
    from esper.model.initialization import materialize, materialize_small

    width = 8
    blueprints = [DEFAULT_REGISTRY.get(topology, n) for n in DEFAULT_REGISTRY.names(topology)]
    factories = [lambda: BlendGate(width, topology)]
    factories += [functools.partial(bp.factory, width) for bp in blueprints]
    before = torch.random.get_rng_state()
    for factory in factories:
        small = materialize_small(factory, torch.Generator().manual_seed(7))
        meta = materialize(factory, torch.Generator().manual_seed(7))
        a, b = small.state_dict(), meta.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_slot_subset_and_errors() -> None:
    model = build_model(host_config(slots=["r0c2", "r0c0"]), DIGITS_SPEC, seed=0)
    assert model.slot_ids == ("r0c0", "r0c2")  # host order
    assert model.eval().fused_forward(torch.randn(1, 1, 8, 8), torch.zeros(3, 2)).shape == (
        3,
        1,
        10,
    )
    with pytest.raises(ValueError, match="unknown slot"):
        build_model(host_config(slots=["r9c9"]), DIGITS_SPEC, seed=0)
    with pytest.raises(ValueError, match="divisible"):
        build_model(host_config(d_model=10, n_heads=3), TEXT_SPEC, seed=0)
    with pytest.raises(KeyError, match="unknown slot"):
        model.advance("r1c0", initiator=Initiator.POLICY)


def test_registry_covers_the_action_space() -> None:
    assert DEFAULT_REGISTRY.names(Topology.CNN) == CNN_BLUEPRINTS
    assert DEFAULT_REGISTRY.names(Topology.TRANSFORMER) == TRANSFORMER_BLUEPRINTS
    assert not DEFAULT_REGISTRY.has(Topology.CNN, "lora")
    with pytest.raises(KeyError, match="known"):
        DEFAULT_REGISTRY.get(Topology.TRANSFORMER, "depthwise")


def test_strict_gates_from_config_and_task_specs() -> None:
    model = build_model(host_config(strict_gates=True), DIGITS_SPEC, seed=0)
    assert model.strict_gates and all(model.slot(s).strict for s in model.slot_ids)
    assert task_spec(TaskConfig(name=TaskName.CIFAR10, data_path="x")).input_shape == (3, 32, 32)
