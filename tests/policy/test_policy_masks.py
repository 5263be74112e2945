"""Action masks: lifecycle rules, vectorised build vs a per-slot reference, stacking."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
from _policy_support import N_OPS, env_reports, report, space
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.core.constants import (
    ALL_BLUEPRINTS,
    G2_MIN_TRAINING_EPOCHS,
    MIN_PRUNE_AGE,
    TRANSFORMER_BLUEPRINTS,
)
from esper.core.enums import AlphaMode, LifecycleOp, SeedStage, Topology
from esper.core.records import SlotReport
from esper.policy.actions import ActionSpace
from esper.policy.masks import ActionMasks, build_mask_arrays, compute_masks, stack_masks

S = SeedStage
Op = LifecycleOp


def masks_for(env: Sequence[SlotReport], *, max_seeds: int = 3, topology=Topology.CNN):
    sp = ActionSpace(tuple(r.slot_id for r in env), topology)
    return compute_masks([env], sp, max_seeds=max_seeds, device="cpu")[0]


def valid_ops(m: ActionMasks) -> set[LifecycleOp]:
    return {Op(i) for i in range(N_OPS) if bool(m.op[i])}


def test_fresh_host_can_only_wait_or_germinate() -> None:
    m = masks_for([report("a"), report("b")])
    assert valid_ops(m) == {Op.WAIT, Op.GERMINATE}
    assert m.slot[Op.GERMINATE].tolist() == [True, True]


@pytest.mark.parametrize("blocking", [S.GERMINATED, S.TRAINING, S.PRUNED, S.EMBARGOED, S.RESETTING])
def test_young_or_cooling_seed_blocks_germination(blocking: SeedStage) -> None:
    m = masks_for([report("a", blocking, age_epochs=1), report("b")])
    assert not bool(m.op[Op.GERMINATE])


def test_seed_limit_counts_occupied_slots() -> None:
    env = [report("a", S.HOLDING), report("b", S.FOSSILIZED), report("c")]
    assert bool(masks_for(env, max_seeds=3).op[Op.GERMINATE])
    assert not bool(masks_for(env, max_seeds=2).op[Op.GERMINATE])
    assert masks_for(env, max_seeds=3).slot[Op.GERMINATE].tolist() == [False, False, True]


def test_prune_needs_age_rest_and_not_fossilized() -> None:
    young = report("a", S.TRAINING, age_epochs=MIN_PRUNE_AGE - 1)
    old = report("b", S.BLENDING, age_epochs=MIN_PRUNE_AGE)
    moving = report("c", S.BLENDING, age_epochs=9, alpha_mode=AlphaMode.UP)
    fossil = report("d", S.FOSSILIZED, age_epochs=20)
    m = masks_for([young, old, moving, fossil])
    assert m.slot[Op.PRUNE].tolist() == [False, True, False, False]


def test_advance_fossilize_and_retarget_rules() -> None:
    env = [
        report("g", S.GERMINATED),
        report("t", S.TRAINING, epochs_in_stage=G2_MIN_TRAINING_EPOCHS),
        report("b", S.BLENDING, alpha=1.0, alpha_target=1.0),
        report("bm", S.BLENDING, alpha_mode=AlphaMode.UP, alpha_target=1.0),
        report("h", S.HOLDING, alpha=1.0),
        report("f", S.FOSSILIZED, alpha=1.0),
    ]
    m = masks_for(env)
    assert m.slot[Op.ADVANCE].tolist() == [True, True, True, False, False, False]
    assert m.slot[Op.FOSSILIZE].tolist() == [False, False, False, False, True, False]
    assert m.slot[Op.SET_ALPHA_TARGET].tolist() == [False, False, True, False, True, False]
    # The GERMINATED seed blocks germination; every seed is too young to prune.
    assert valid_ops(m) == set(Op) - {Op.GERMINATE, Op.PRUNE}


def test_advance_is_masked_where_its_gate_must_refuse() -> None:
    """G2 refuses a TRAINING seed before its minimum epochs, G3 a blend resting below
    alpha 1: the mask rules those out instead of letting the policy pay for them."""
    env = [
        report("t", S.TRAINING, epochs_in_stage=G2_MIN_TRAINING_EPOCHS - 1),
        report("b", S.BLENDING, alpha=0.7, alpha_target=0.7),
    ]
    m = masks_for(env)
    assert m.slot[Op.ADVANCE].tolist() == [False, False]
    assert m.slot[Op.SET_ALPHA_TARGET].tolist() == [False, True]  # retarget to 1.0 first


def test_scheduled_prune_freezes_the_slot() -> None:
    m = masks_for([report("h", S.HOLDING, age_epochs=9, scheduled_prune=True)])
    assert valid_ops(m) == {Op.WAIT}


def test_transformer_hosts_mask_cnn_blueprints() -> None:
    m = masks_for([report("a")], topology=Topology.TRANSFORMER)
    allowed = {ALL_BLUEPRINTS[i] for i in range(len(ALL_BLUEPRINTS)) if bool(m.blueprint[i])}
    assert allowed == set(TRANSFORMER_BLUEPRINTS)
    for head in ("style", "tempo", "alpha_target", "alpha_speed", "alpha_curve"):
        assert bool(m.head(head).all())


def test_reports_are_matched_to_space_order() -> None:
    sp = ActionSpace(("a", "b"), Topology.CNN)
    m = compute_masks([[report("b", S.HOLDING), report("a")]], sp, max_seeds=3, device="cpu")
    assert m.slot[0, Op.FOSSILIZE].tolist() == [False, True]
    with pytest.raises(ValueError, match="do not match"):
        compute_masks([[report("a"), report("z")]], sp, max_seeds=3, device="cpu")


# --- vectorised build vs a slow per-slot reference ---------------------------------------

_OCCUPYING = {S.GERMINATED, S.TRAINING, S.BLENDING, S.HOLDING, S.FOSSILIZED}
_BLOCKING = {S.GERMINATED, S.TRAINING, S.PRUNED, S.EMBARGOED, S.RESETTING}


def reference_masks(env: Sequence[SlotReport], max_seeds: int) -> tuple[list, list]:
    blocked = any(r.stage in _BLOCKING for r in env)
    room = sum(r.stage in _OCCUPYING for r in env) < max_seeds
    slot = [[False] * len(env) for _ in range(N_OPS)]
    for s, r in enumerate(env):
        steady, rest = not r.scheduled_prune, r.alpha_mode == AlphaMode.HOLD
        slot[Op.WAIT][s] = True
        slot[Op.GERMINATE][s] = r.stage == S.DORMANT and not blocked and room
        trained = r.stage == S.TRAINING and r.epochs_in_stage >= G2_MIN_TRAINING_EPOCHS
        blended = r.stage == S.BLENDING and rest and r.alpha_target == 1.0
        slot[Op.ADVANCE][s] = steady and (r.stage == S.GERMINATED or trained or blended)
        slot[Op.FOSSILIZE][s] = steady and r.stage == S.HOLDING
        slot[Op.PRUNE][s] = (
            steady
            and rest
            and r.age_epochs >= MIN_PRUNE_AGE
            and r.stage in (S.GERMINATED, S.TRAINING, S.BLENDING, S.HOLDING)
        )
        slot[Op.SET_ALPHA_TARGET][s] = steady and rest and r.stage in (S.BLENDING, S.HOLDING)
    op = [o == Op.WAIT or any(slot[o]) for o in range(N_OPS)]
    return op, slot


@settings(max_examples=50, deadline=None)
@given(data=st.data(), n_envs=st.integers(1, 4), max_seeds=st.integers(1, 4))
def test_vectorised_masks_match_reference(data: st.DataObject, n_envs: int, max_seeds: int) -> None:
    sp = space(4)
    reports = data.draw(env_reports(n_envs, sp.slot_ids))
    masks = compute_masks(reports, sp, max_seeds=max_seeds, device="cpu")
    for e, env in enumerate(reports):
        op, slot = reference_masks(env, max_seeds)
        assert masks.op[e].tolist() == op
        assert masks.slot[e].tolist() == slot
        assert bool(masks.op[e, Op.WAIT])
        # An op is valid exactly when some slot is valid for it.
        assert masks.op[e, 1:].tolist() == masks.slot[e, 1:].any(-1).tolist()


def test_build_mask_arrays_is_host_side() -> None:
    arrays = build_mask_arrays([[report("s0")]], space(1), max_seeds=3)
    assert all(isinstance(a, np.ndarray) for a in arrays.values())


def test_stack_index_flatten_and_host_roundtrip() -> None:
    sp = space(3)
    steps = [
        compute_masks(
            [
                [report(s, S.TRAINING if t == e else S.DORMANT) for s in sp.slot_ids]
                for e in range(2)
            ],
            sp,
            max_seeds=3,
            device="cpu",
        )
        for t in range(4)
    ]
    stacked = stack_masks(steps)
    assert stacked.batch_shape == (2, 4)
    assert stacked.slot.shape == (2, 4, N_OPS, 3)
    assert torch.equal(stacked[:, 2].op, steps[2].op)
    flat = stacked.flatten_batch()
    assert flat.op.shape == (8, N_OPS)
    assert torch.equal(flat.slot[1 * 4 + 3], steps[3].slot[1])
    host = stacked.to_host()
    assert host["slot"].shape == (8, N_OPS, 3) and host["slot"].dtype == bool
    assert np.array_equal(host["blueprint"], flat.blueprint.numpy())
    with pytest.raises(ValueError):
        stack_masks([])


def test_germination_deadline_masks_only_germinate() -> None:
    from esper.core.constants import GERMINATE_MIN_STEPS_LEFT

    env = [report("a"), report("b")]
    sp = ActionSpace(("a", "b"), Topology.CNN)
    for steps_left, germinate in [
        (None, True),
        (GERMINATE_MIN_STEPS_LEFT, True),
        (GERMINATE_MIN_STEPS_LEFT - 1, False),
    ]:
        m = compute_masks([env], sp, max_seeds=3, device="cpu", steps_left=steps_left)[0]
        assert valid_ops(m) == ({Op.WAIT, Op.GERMINATE} if germinate else {Op.WAIT})


def test_prune_after_blending_masks_prune_of_unmeasured_seeds_only() -> None:
    age = MIN_PRUNE_AGE + 1
    env = [
        report("a", S.GERMINATED, age_epochs=age),
        report("b", S.TRAINING, age_epochs=age),
        report("c", S.BLENDING, age_epochs=age),
        report("d", S.HOLDING, age_epochs=age),
    ]
    sp = ActionSpace(tuple(r.slot_id for r in env), Topology.CNN)
    default = compute_masks([env], sp, max_seeds=4, device="cpu")[0]
    gated = compute_masks([env], sp, max_seeds=4, device="cpu", prune_after_blending=True)[0]
    assert default.slot[Op.PRUNE].tolist() == [True, True, True, True]
    assert gated.slot[Op.PRUNE].tolist() == [False, False, True, True]
    for op in Op:  # nothing but PRUNE changes
        if op != Op.PRUNE:
            assert torch.equal(default.slot[op], gated.slot[op])
    only_young = [report("a", S.TRAINING, age_epochs=age), report("b")]
    sp2 = ActionSpace(("a", "b"), Topology.CNN)
    m = compute_masks([only_young], sp2, max_seeds=4, device="cpu", prune_after_blending=True)[0]
    assert Op.PRUNE not in valid_ops(m)
