"""Heuristic policy rules on hand-built slot reports, and validity under the masks."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from _policy_support import env_reports, report, space
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.config import PolicyConfig
from esper.core.constants import (
    ALL_BLUEPRINTS,
    G2_MIN_TRAINING_EPOCHS,
    HEAD_NAMES,
    HEURISTIC_BLUEPRINT_ORDER,
    HEURISTIC_STALL_EPOCHS,
    TRANSFORMER_BLUEPRINTS,
)
from esper.core.enums import AlphaMode, LifecycleOp, SeedStage, Topology
from esper.core.records import SlotReport
from esper.policy.actions import ActionSpace, DecodedAction, decode_action
from esper.policy.features import build_features
from esper.policy.heuristic import HeuristicPolicy
from esper.policy.masks import compute_masks
from esper.policy.protocol import Hidden, Policy, PolicyInput, PolicyStep
from esper.policy.signals import SignalTracker

S = SeedStage
Op = LifecycleOp
CFG = PolicyConfig(plateau_patience=2, fossilize_threshold_pp=1.0, prune_threshold_pp=-0.5)


def tracker(*, stable: bool, plateau: int) -> SignalTracker:
    t = SignalTracker()
    t.host_stabilised = stable
    t.plateau_count = plateau
    return t


def run(
    policy: HeuristicPolicy,
    envs: Sequence[Sequence[SlotReport]],
    trackers: Sequence[SignalTracker],
    hidden: Hidden | None = None,
    max_seeds: int = 3,
) -> tuple[list[DecodedAction], PolicyStep]:
    sp = policy.space
    masks = compute_masks(envs, sp, max_seeds=max_seeds, device="cpu")
    obs, bp = build_features(
        trackers=trackers,
        reports=envs,
        epoch=0,
        max_epochs=10,
        last_ops=[0] * len(envs),
        last_success=[True] * len(envs),
        device="cpu",
    )
    inp = PolicyInput(obs=obs, blueprint_ids=bp, masks=masks, reports=envs, trackers=trackers)
    hidden = hidden if hidden is not None else policy.initial_hidden(len(envs), "cpu")
    step = policy.act(inp, hidden)
    return [decode_action(row.tolist(), sp) for row in step.actions], step


def one(envs_slots: list[SlotReport], t: SignalTracker | None = None) -> DecodedAction:
    sp = ActionSpace(tuple(r.slot_id for r in envs_slots), Topology.CNN)
    actions, _ = run(
        HeuristicPolicy(sp, CFG), [envs_slots], [t or tracker(stable=False, plateau=0)]
    )
    return actions[0]


def test_waits_until_host_is_stable_and_plateaued() -> None:
    empty = [report("a"), report("b")]
    assert one(empty, tracker(stable=False, plateau=9)).op == Op.WAIT
    assert one(empty, tracker(stable=True, plateau=1)).op == Op.WAIT
    a = one(empty, tracker(stable=True, plateau=2))
    assert (a.op, a.slot_id, a.blueprint) == (Op.GERMINATE, "a", HEURISTIC_BLUEPRINT_ORDER[0])
    assert a.alpha_target == 1.0


def test_lifecycle_progression_rules() -> None:
    adv = DecodedAction(op=Op.ADVANCE, slot_id="a")
    assert one([report("a", S.GERMINATED)]) == adv
    assert one([report("a", S.TRAINING, epochs_in_stage=3, grad_health=0.9)]).op == Op.WAIT
    ready = report("a", S.TRAINING, epochs_in_stage=G2_MIN_TRAINING_EPOCHS, grad_health=0.9)
    assert one([ready]) == adv
    sick = report("a", S.TRAINING, epochs_in_stage=G2_MIN_TRAINING_EPOCHS, grad_health=0.1)
    assert one([sick]).op == Op.WAIT
    assert one([report("a", S.BLENDING, alpha=1.0, alpha_target=1.0)]) == adv
    ramping = report("a", S.BLENDING, alpha=0.4, alpha_target=1.0, alpha_mode=AlphaMode.UP)
    assert one([ramping]).op == Op.WAIT
    short = one([report("a", S.BLENDING, alpha=0.7, alpha_target=0.7)])
    assert (short.op, short.alpha_target) == (Op.SET_ALPHA_TARGET, 1.0)


def test_fossilize_prune_and_stall_rules() -> None:
    good = report("a", S.HOLDING, alpha=1.0, contribution=2.0, age_epochs=20)
    assert one([good]) == DecodedAction(op=Op.FOSSILIZE, slot_id="a")
    bad = report("a", S.BLENDING, alpha=0.5, contribution=-3.0, age_epochs=8)
    assert one([bad]) == DecodedAction(op=Op.PRUNE, slot_id="a")
    young_bad = report("a", S.BLENDING, alpha=0.5, contribution=-3.0, age_epochs=2)
    assert one([young_bad]).op != Op.PRUNE  # the mask forbids it: never an invalid action
    meh = report("a", S.HOLDING, alpha=1.0, contribution=0.2, age_epochs=20)
    assert one([meh]).op == Op.WAIT
    stalled = report(
        "a",
        S.HOLDING,
        alpha=1.0,
        contribution=0.2,
        age_epochs=20,
        epochs_in_stage=HEURISTIC_STALL_EPOCHS,
    )
    assert one([stalled]).op == Op.PRUNE
    # Harm is handled before anything else in the env.
    env = [good, report("b", S.TRAINING, contribution=-1.0, age_epochs=9)]
    assert one(env) == DecodedAction(op=Op.PRUNE, slot_id="b")


def test_blueprint_rotation_and_prune_penalty() -> None:
    sp = space(2)
    policy = HeuristicPolicy(sp, CFG)
    calm = tracker(stable=True, plateau=5)
    empty = [report("s0"), report("s1")]
    hidden = policy.initial_hidden(1, "cpu")
    chosen = []
    for _ in range(3):
        (a,), step = run(policy, [empty], [calm], hidden)
        chosen.append(a.blueprint)
        hidden = step.hidden
    # Largest capacity first: a narrow host's tiny seeds (norm: 8 parameters) add nothing.
    assert chosen == ["conv_heavy", "conv_small", "bottleneck"]
    assert sorted(HEURISTIC_BLUEPRINT_ORDER) == sorted(ALL_BLUEPRINTS)
    # Fresh episode: pruning a harmful "conv_heavy" seed penalises it, so rotation skips it.
    hidden = policy.initial_hidden(1, "cpu")
    harmful = [
        report("s0", S.TRAINING, blueprint="conv_heavy", contribution=-2.0, age_epochs=6),
        report("s1"),
    ]
    (a,), step = run(policy, [harmful], [calm], hidden)
    assert a.op == Op.PRUNE
    (b,), _ = run(policy, [empty], [calm], step.hidden)
    assert b.op == Op.GERMINATE and b.blueprint == HEURISTIC_BLUEPRINT_ORDER[1]


def test_heuristic_numbers_come_from_the_policy_section() -> None:
    """Every heuristic number is a ``[policy]`` key the rules really read."""
    cfg = PolicyConfig(
        plateau_patience=2,
        heuristic_blueprints=["depthwise", "norm"],
        heuristic_style="sigmoid_add",
        heuristic_tempo=8,
        heuristic_alpha_target=0.7,
        heuristic_stall_epochs=2,
        heuristic_prune_penalty=3.0,
        heuristic_penalty_decay=0.5,
    )
    sp = space(2)
    policy = HeuristicPolicy(sp, cfg)
    calm = tracker(stable=True, plateau=5)
    empty = [report("s0"), report("s1")]
    (a,), step = run(policy, [empty], [calm])
    assert (a.op, a.blueprint, a.tempo, a.alpha_target) == (Op.GERMINATE, "depthwise", 8, 0.7)
    assert a.style.name == "SIGMOID_ADD"
    (b,), _ = run(policy, [empty], [calm], step.hidden)
    assert b.blueprint == "norm"  # rotation wraps over the configured list only
    # A blend resting below the configured target is retargeted at the configured tempo;
    # resting at 0.7 it waits (G3 needs alpha 1, so ADVANCE is masked).
    short = report("s0", S.BLENDING, alpha=0.5, alpha_target=0.5)
    retarget = one_with(policy, [short, report("s1")])
    assert (retarget.op, retarget.alpha_target, retarget.alpha_speed) == (
        Op.SET_ALPHA_TARGET,
        0.7,
        8,
    )
    resting = report("s0", S.BLENDING, alpha=0.7, alpha_target=0.7)
    assert one_with(policy, [resting, report("s1")]).op == Op.WAIT
    # Stall after 2 epochs (default 5), and the prune penalty / decay land in the memory.
    meh = report("s0", S.HOLDING, alpha=1.0, contribution=0.2, age_epochs=20, epochs_in_stage=2)
    assert one_with(policy, [meh, report("s1")]).op == Op.PRUNE
    assert one([meh, report("s1")]).op == Op.WAIT
    bad = report("s0", S.HOLDING, blueprint="depthwise", contribution=0.2, age_epochs=20,
                 epochs_in_stage=2, alpha=1.0)  # fmt: skip
    (c,), step = run(policy, [[bad, report("s1")]], [calm])
    assert c.op == Op.PRUNE
    assert float(step.hidden[0][0, 0, ALL_BLUEPRINTS.index("depthwise")]) == 3.0
    (_,), step = run(policy, [empty], [tracker(stable=False, plateau=0)], step.hidden)
    assert float(step.hidden[0][0, 0, ALL_BLUEPRINTS.index("depthwise")]) == 1.5


def one_with(policy: HeuristicPolicy, env: list[SlotReport]) -> DecodedAction:
    actions, _ = run(policy, [env], [tracker(stable=False, plateau=0)])
    return actions[0]


def test_transformer_rotation_stays_in_topology() -> None:
    sp = ActionSpace(("s0",), Topology.TRANSFORMER)
    policy = HeuristicPolicy(sp, CFG)
    hidden = policy.initial_hidden(1, "cpu")
    seen = []
    for _ in range(len(TRANSFORMER_BLUEPRINTS)):
        (a,), step = run(policy, [[report("s0")]], [tracker(stable=True, plateau=5)], hidden)
        seen.append(a.blueprint)
        hidden = step.hidden
    assert sorted(seen) == sorted(TRANSFORMER_BLUEPRINTS)


def test_step_outputs_follow_the_protocol() -> None:
    sp = space(2)
    policy = HeuristicPolicy(sp, CFG)
    assert isinstance(policy, Policy)
    envs = [[report("s0", S.GERMINATED), report("s1")], [report("s0"), report("s1")]]
    _, step = run(policy, envs, [tracker(stable=False, plateau=0)] * 2)
    assert step.actions.shape == (2, len(HEAD_NAMES)) and step.actions.dtype == torch.long
    assert torch.all(step.log_probs == 0) and torch.all(step.value == 0)
    assert torch.all(step.entropy == 0)
    assert step.op_probs[0, Op.ADVANCE] == 1 and step.op_probs[1, Op.WAIT] == 1


@settings(max_examples=50, deadline=None)
@given(data=st.data(), n_envs=st.integers(1, 3), max_seeds=st.integers(1, 3))
def test_heuristic_actions_are_always_valid(
    data: st.DataObject, n_envs: int, max_seeds: int
) -> None:
    sp = space(3)
    envs = data.draw(env_reports(n_envs, sp.slot_ids))
    trackers = [
        tracker(stable=data.draw(st.booleans()), plateau=data.draw(st.integers(0, 5)))
        for _ in range(n_envs)
    ]
    masks = compute_masks(envs, sp, max_seeds=max_seeds, device="cpu")
    actions, _ = run(HeuristicPolicy(sp, CFG), envs, trackers, max_seeds=max_seeds)
    for e, a in enumerate(actions):
        assert bool(masks.op[e, a.op])
        if a.slot_id is not None:
            assert bool(masks.slot[e, a.op, sp.slot_index(a.slot_id)])
        if a.blueprint is not None:
            assert bool(masks.blueprint[e, ALL_BLUEPRINTS.index(a.blueprint)])
