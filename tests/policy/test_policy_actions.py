"""Action space, head sizes and the pure decode/encode of head indices."""

from __future__ import annotations

import pytest
from _policy_support import space
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.core.constants import (
    ALL_BLUEPRINTS,
    ALPHA_SPEEDS,
    ALPHA_TARGETS,
    CANONICAL_HEAD_VALUE,
    CNN_BLUEPRINTS,
    HEAD_NAMES,
    RELEVANT_HEADS,
    TEMPOS,
    TRANSFORMER_BLUEPRINTS,
)
from esper.core.enums import AlphaCurve, GerminationStyle, LifecycleOp, Topology
from esper.policy.actions import (
    ActionSpace,
    DecodedAction,
    decode_action,
    encode_action,
    head_sizes,
)


def test_head_sizes_follow_head_names() -> None:
    sizes = space(5).head_sizes
    assert tuple(sizes) == HEAD_NAMES
    assert sizes == {
        "op": 6,
        "slot": 5,
        "blueprint": len(ALL_BLUEPRINTS),
        "style": 4,
        "tempo": 3,
        "alpha_target": 3,
        "alpha_speed": 4,
        "alpha_curve": 5,
    }
    assert head_sizes(2)["slot"] == 2


def test_space_validates_slots() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ActionSpace((), Topology.CNN)
    with pytest.raises(ValueError, match="duplicate"):
        ActionSpace(("a", "a"), Topology.CNN)


@pytest.mark.parametrize(
    ("topology", "names"),
    [(Topology.CNN, CNN_BLUEPRINTS), (Topology.TRANSFORMER, TRANSFORMER_BLUEPRINTS)],
)
def test_blueprint_validity_by_topology(topology: Topology, names: tuple[str, ...]) -> None:
    valid = ActionSpace(("a",), topology).blueprint_valid
    assert {ALL_BLUEPRINTS[i] for i, ok in enumerate(valid) if ok} == set(names)


def test_decode_germinate() -> None:
    sp = space(3)
    idx = [int(LifecycleOp.GERMINATE), 2, ALL_BLUEPRINTS.index("conv_small"), 3, 1, 0, 2, 4]
    a = decode_action(idx, sp)
    assert a == DecodedAction(
        op=LifecycleOp.GERMINATE,
        slot_id="s2",
        blueprint="conv_small",
        style=GerminationStyle.GATED_GATE,
        tempo=TEMPOS[1],
        alpha_target=ALPHA_TARGETS[0],
    )
    # alpha_speed/alpha_curve are irrelevant for GERMINATE: canonical whatever was sent.
    assert a.alpha_speed == ALPHA_SPEEDS[CANONICAL_HEAD_VALUE["alpha_speed"]]
    assert a.alpha_curve == AlphaCurve.LINEAR
    assert a.relevant_heads == RELEVANT_HEADS[LifecycleOp.GERMINATE]


def test_decode_wait_drops_everything() -> None:
    a = decode_action([0, 1, 5, 2, 2, 0, 3, 3], space(2))
    assert a == DecodedAction(op=LifecycleOp.WAIT)
    assert a.slot_id is None and a.blueprint is None


def test_decode_rejects_bad_indices() -> None:
    with pytest.raises(ValueError, match="expected 8"):
        decode_action([0, 0], space(2))
    with pytest.raises(ValueError, match="slot"):
        decode_action([1, 2, 0, 0, 0, 0, 0, 0], space(2))


@settings(max_examples=50, deadline=None)
@given(data=st.data(), n_slots=st.integers(1, 6))
def test_encode_inverts_decode(data: st.DataObject, n_slots: int) -> None:
    sp = space(n_slots)
    sizes = sp.head_sizes
    idx = [data.draw(st.integers(0, sizes[name] - 1)) for name in HEAD_NAMES]
    decoded = decode_action(idx, sp)
    encoded = encode_action(decoded, sp)
    rel = decoded.relevant_heads
    for h, name in enumerate(HEAD_NAMES):
        assert encoded[h] == (idx[h] if name in rel else CANONICAL_HEAD_VALUE[name])
    assert decode_action(encoded, sp) == decoded


def test_encode_requires_slot_for_slot_ops() -> None:
    with pytest.raises(ValueError, match="slot"):
        encode_action(DecodedAction(op=LifecycleOp.PRUNE), space(2))
