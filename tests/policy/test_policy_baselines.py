"""The baselines beside the heuristic: the eager grower, the random valid policy and the
static host, on hand-built slot reports (the rules) and random masks (validity)."""

from __future__ import annotations

import pytest
import torch
from _policy_support import random_masks, report, space
from hypothesis import given, settings
from hypothesis import strategies as st
from test_policy_heuristic import run, tracker

from esper.config import EagerConfig, PolicyConfig
from esper.core.constants import HEAD_NAMES, HEURISTIC_BLUEPRINT_ORDER, RELEVANT_HEADS
from esper.core.enums import LifecycleOp, SeedStage
from esper.errors import ConfigError
from esper.policy.actions import ActionSpace
from esper.policy.eager import EagerPolicy
from esper.policy.features import build_features
from esper.policy.heuristic import HeuristicPolicy
from esper.policy.masks import ActionMasks, compute_masks
from esper.policy.protocol import Policy, PolicyInput, PolicyStep
from esper.policy.random_valid import RandomValidPolicy
from esper.policy.static import StaticPolicy

Op = LifecycleOp
S = SeedStage
STILL = tracker(stable=False, plateau=0)  # a host still improving: the heuristic waits


def test_eager_grows_at_once_where_the_heuristic_waits_for_a_plateau() -> None:
    sp = space(2)
    empty = [report("s0"), report("s1")]
    (wait,), _ = run(HeuristicPolicy(sp, PolicyConfig()), [empty], [STILL])
    (grow,), _ = run(EagerPolicy(sp, PolicyConfig()), [empty], [STILL])
    assert wait.op == Op.WAIT
    assert (grow.op, grow.slot_id, grow.blueprint) == (Op.GERMINATE, "s0", "conv_heavy")
    assert (grow.tempo, grow.alpha_target) == (5, 1.0)
    # The other rules are the heuristic's: a harmful seed is pruned before growing more.
    harmful = [report("s0", S.TRAINING, blueprint="norm", contribution=-2.0, age_epochs=6)]
    (prune,), _ = run(EagerPolicy(sp, PolicyConfig()), [[*harmful, report("s1")]], [STILL])
    assert (prune.op, prune.slot_id) == (Op.PRUNE, "s0")


def test_eager_choices_are_the_policy_eager_keys() -> None:
    """Blueprint, slot order, style, tempo and alpha target come from [policy.eager]."""
    eager = EagerConfig(
        blueprints=["depthwise"],
        slot_order=["s2", "s0"],
        style="sigmoid_add",
        tempo=8,
        alpha_target=0.7,
    )
    sp = space(3)
    policy = EagerPolicy(sp, PolicyConfig(eager=eager))
    empty = [report("s0"), report("s1"), report("s2")]
    (a,), step = run(policy, [empty], [STILL])
    assert (a.op, a.slot_id, a.blueprint, a.tempo, a.alpha_target) == (
        Op.GERMINATE,
        "s2",
        "depthwise",
        8,
        0.7,
    )
    assert a.style is not None and a.style.name == "SIGMOID_ADD"
    # s2 taken: the next slot in the order; s1 is never grown (not listed).
    taken = [report("s0"), report("s1"), report("s2", S.FOSSILIZED, seed_id="x", blueprint="norm")]
    (b,), _ = run(policy, [taken], [STILL], step.hidden)
    assert (b.op, b.slot_id) == (Op.GERMINATE, "s0")
    full = [report("s0", S.FOSSILIZED, seed_id="y", blueprint="norm"), report("s1"), taken[2]]
    (c,), _ = run(policy, [full], [STILL], step.hidden)
    assert c.op == Op.WAIT
    # A blend resting below the eager alpha target is retargeted at the eager tempo.
    short = report("s0", S.BLENDING, alpha=0.5, alpha_target=0.5)
    (d,), _ = run(policy, [[short, report("s1"), report("s2")]], [STILL])
    assert (d.op, d.alpha_target, d.alpha_speed) == (Op.SET_ALPHA_TARGET, 0.7, 8)


def test_an_eager_slot_the_host_lacks_is_named() -> None:
    cfg = PolicyConfig(eager=EagerConfig(slot_order=["s0", "r9c9"]))
    with pytest.raises(ConfigError, match=r"\$\.policy\.eager\.slot_order\[1\]: .*'r9c9'"):
        EagerPolicy(space(2), cfg)


def test_the_eager_rotation_defaults_to_the_heuristic_order() -> None:
    assert EagerConfig().blueprints == list(HEURISTIC_BLUEPRINT_ORDER)


def _input(masks: ActionMasks, sp: ActionSpace) -> PolicyInput:
    n = masks.op.shape[0]
    reports = [[report(s) for s in sp.slot_ids] for _ in range(n)]
    obs, bp = build_features(
        trackers=[STILL] * n,
        reports=reports,
        epoch=0,
        max_epochs=10,
        last_ops=[0] * n,
        last_success=[True] * n,
        device="cpu",
    )
    return PolicyInput(
        obs=obs, blueprint_ids=bp, masks=masks, reports=reports, trackers=[STILL] * n
    )


def _check_valid(step: PolicyStep, masks: ActionMasks) -> None:
    for e, row in enumerate(step.actions.tolist()):
        op = Op(row[0])
        assert bool(masks.op[e, op])
        for h, name in enumerate(HEAD_NAMES[1:], start=1):
            if name not in RELEVANT_HEADS[op]:
                continue
            mask = masks.slot[e, op] if name == "slot" else masks.head(name)[e]
            assert bool(mask[row[h]]), (op, name, row)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n_envs=st.integers(1, 4))
def test_random_actions_are_valid_and_reproducible(data: st.DataObject, n_envs: int) -> None:
    sp = space(3)
    masks = data.draw(random_masks(n_envs, sp))
    policy = RandomValidPolicy(sp, PolicyConfig())
    assert isinstance(policy, Policy)
    inp = _input(masks, sp)
    hidden = policy.initial_hidden(n_envs, "cpu")
    first = policy.act(inp, hidden, generator=torch.Generator().manual_seed(5))
    again = policy.act(inp, hidden, generator=torch.Generator().manual_seed(5))
    _check_valid(first, masks)
    assert torch.equal(first.actions, again.actions)
    # Uniform: the op's log-prob is -log(#valid ops); irrelevant heads score exactly 0.
    n_valid = masks.op.sum(dim=1).float()
    assert torch.allclose(first.log_probs[:, 0], -n_valid.log())
    assert torch.allclose(first.op_probs.sum(dim=1), torch.ones(n_envs))


def test_random_draws_every_valid_op_and_a_spread_of_choices() -> None:
    sp = space(4)
    masks = compute_masks([[report(s) for s in sp.slot_ids]] * 64, sp, max_seeds=3, device="cpu")
    step = RandomValidPolicy(sp).act(
        _input(masks, sp), RandomValidPolicy(sp).initial_hidden(64, "cpu"),
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    ops = set(step.actions[:, 0].tolist())
    valid = set(torch.nonzero(masks.op[0]).flatten().tolist())
    assert ops == valid  # WAIT and GERMINATE on empty slots, both drawn in 64 envs
    germinate = step.actions[step.actions[:, 0] == Op.GERMINATE]
    assert len(set(germinate[:, HEAD_NAMES.index("slot")].tolist())) > 1


def test_static_always_waits() -> None:
    sp = space(2)
    masks = compute_masks([[report("s0"), report("s1")]] * 3, sp, max_seeds=3, device="cpu")
    policy = StaticPolicy(sp)
    step = policy.act(_input(masks, sp), policy.initial_hidden(3, "cpu"))
    assert step.actions[:, 0].tolist() == [Op.WAIT] * 3
    assert torch.all(step.op_probs[:, Op.WAIT] == 1) and torch.all(step.log_probs == 0)
    _check_valid(step, masks)
