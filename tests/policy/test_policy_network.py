"""Factored actor-critic: valid sampling, zero irrelevant log-probs, entropy, re-evaluation."""

from __future__ import annotations

import math

import pytest
import torch
from _policy_support import N_OPS, random_masks, report, seeded_masks, space
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.config import PolicyConfig
from esper.core.constants import CANONICAL_HEAD_VALUE, HEAD_NAMES, RELEVANT_HEADS
from esper.core.enums import LifecycleOp, SeedStage
from esper.policy.actions import ActionSpace
from esper.policy.features import BLUEPRINT_VOCAB, build_features, obs_dim
from esper.policy.heuristic import HeuristicPolicy
from esper.policy.masks import ActionMasks, compute_masks, stack_masks
from esper.policy.network import FactoredActorCritic
from esper.policy.protocol import Policy, PolicyInput
from esper.policy.signals import SignalTracker

N_ENVS = 4


def make_net(sp: ActionSpace, seed: int = 0) -> FactoredActorCritic:
    torch.manual_seed(seed)
    return FactoredActorCritic(
        obs_dim(sp.n_slots), sp, feature_dim=32, lstm_hidden=24, blueprint_embed_dim=3
    )


def random_inputs(sp: ActionSpace, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, obs_dim(sp.n_slots), generator=g)
    bp = torch.randint(0, BLUEPRINT_VOCAB, (n, sp.n_slots), generator=g)
    return obs, bp


def assert_valid(actions: torch.Tensor, masks: ActionMasks) -> None:
    for e in range(actions.shape[0]):
        a = actions[e].tolist()
        op = LifecycleOp(a[0])
        assert bool(masks.op[e, op]), f"env {e}: op {op.name} is masked"
        rel = RELEVANT_HEADS[op]
        for h, name in enumerate(HEAD_NAMES[1:], start=1):
            if name not in rel:
                assert a[h] == CANONICAL_HEAD_VALUE[name]
            elif name == "slot":
                assert bool(masks.slot[e, op, a[h]]), f"env {e}: slot {a[h]} masked for {op.name}"
            else:
                assert bool(masks.head(name)[e, a[h]]), f"env {e}: {name}={a[h]} masked"


def relevance(actions: torch.Tensor) -> torch.Tensor:
    return torch.tensor(
        [[n in RELEVANT_HEADS[LifecycleOp(int(op))] for n in HEAD_NAMES] for op in actions[:, 0]]
    )


@settings(max_examples=50, deadline=None)
@given(data=st.data(), n_slots=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_sampled_actions_are_valid_and_irrelevant_heads_are_zero(
    data: st.DataObject, n_slots: int, seed: int
) -> None:
    sp = space(n_slots)
    net = make_net(sp)
    masks = data.draw(random_masks(N_ENVS, sp))
    obs, bp = random_inputs(sp, N_ENVS, seed)
    gen = torch.Generator().manual_seed(seed)
    for deterministic in (False, True):
        step = net.act(
            obs,
            bp,
            masks,
            net.initial_hidden(N_ENVS, "cpu"),
            generator=gen,
            deterministic=deterministic,
        )
        assert step.actions.shape == (N_ENVS, len(HEAD_NAMES)) and step.actions.dtype == torch.long
        assert_valid(step.actions, masks)
        rel = relevance(step.actions)
        assert torch.all(step.log_probs[~rel] == 0.0)
        assert torch.all(step.entropy[~rel] == 0.0)
        assert torch.isfinite(step.log_probs).all() and torch.all(step.log_probs <= 0)
        assert torch.all(step.op_probs[~masks.op] == 0.0)
        torch.testing.assert_close(step.op_probs.sum(-1), torch.ones(N_ENVS))
        assert torch.all((step.entropy >= 0) & (step.entropy <= 1 + 1e-5))


def test_only_wait_valid_always_waits() -> None:
    sp = space(3)
    net = make_net(sp)
    masks = ActionMasks(
        op=torch.tensor([[True] + [False] * (N_OPS - 1)] * N_ENVS),
        slot=torch.zeros(N_ENVS, N_OPS, 3, dtype=torch.bool),
        **{n: torch.ones(N_ENVS, sp.head_sizes[n], dtype=torch.bool) for n in HEAD_NAMES[2:]},
    )
    obs, bp = random_inputs(sp, N_ENVS, 0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        step = net.act(obs, bp, masks, net.initial_hidden(N_ENVS, "cpu"), generator=gen)
        assert torch.all(step.actions[:, 0] == LifecycleOp.WAIT)
        assert torch.all(step.log_probs == 0.0) and torch.all(step.entropy == 0.0)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), n_slots=st.integers(1, 4))
def test_entropy_is_normalised_by_log_valid_choices(data: st.DataObject, n_slots: int) -> None:
    sp = space(n_slots)
    net = make_net(sp)
    with torch.no_grad():  # zero heads: uniform over valid choices, entropy exactly 1
        for head in [net.op_head, *net.sub_heads.values()]:
            head.weight.zero_()
            head.bias.zero_()
    masks = data.draw(random_masks(N_ENVS, sp))
    obs, bp = random_inputs(sp, N_ENVS, 1)
    step = net.act(obs, bp, masks, net.initial_hidden(N_ENVS, "cpu"), generator=torch.Generator())
    for e in range(N_ENVS):
        op = int(step.actions[e, 0])
        for h, name in enumerate(HEAD_NAMES):
            if name not in RELEVANT_HEADS[LifecycleOp(op)]:
                continue
            row = (
                masks.op[e]
                if name == "op"
                else (masks.slot[e, op] if name == "slot" else masks.head(name)[e])
            )
            n_valid = int(row.sum())
            want = 1.0 if n_valid > 1 else 0.0
            assert math.isclose(float(step.entropy[e, h]), want, abs_tol=1e-5), (name, n_valid)
            assert math.isclose(float(step.log_probs[e, h]), -math.log(n_valid), abs_tol=1e-5)


def test_op_entropy_matches_op_probs() -> None:
    sp = space(3)
    net = make_net(sp, seed=3)
    masks = seeded_masks(N_ENVS, sp, 0)
    obs, bp = random_inputs(sp, N_ENVS, 5)
    step = net.act(obs, bp, masks, net.initial_hidden(N_ENVS, "cpu"), generator=torch.Generator())
    p = step.op_probs
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)
    n_valid = masks.op.sum(-1)
    want = torch.where(n_valid > 1, ent / n_valid.clamp(min=2).float().log(), torch.zeros_like(ent))
    torch.testing.assert_close(step.entropy[:, 0], want, atol=1e-5, rtol=1e-5)


def _rollout(net, sp, masks_seq, resets=None, seed=0):
    n, t_len = N_ENVS, len(masks_seq)
    gen = torch.Generator().manual_seed(seed)
    hidden0 = net.initial_hidden(n, "cpu")
    hidden0 = (hidden0[0] + 0.1, hidden0[1] - 0.2)  # a non-trivial stored initial state
    hidden = hidden0
    obs_l, bp_l, act_l, lp_l, val_l, ent_l = [], [], [], [], [], []
    for t in range(t_len):
        if resets is not None:
            keep = (~resets[:, t]).float().view(1, -1, 1)
            hidden = (hidden[0] * keep, hidden[1] * keep)
        obs, bp = random_inputs(sp, n, 100 + t)
        step = net.act(obs, bp, masks_seq[t], hidden, generator=gen)
        hidden = step.hidden
        obs_l.append(obs), bp_l.append(bp), act_l.append(step.actions)
        lp_l.append(step.log_probs), val_l.append(step.value), ent_l.append(step.entropy)
    stack = lambda xs: torch.stack(xs, dim=1)  # noqa: E731
    return hidden0, stack(obs_l), stack(bp_l), stack(act_l), stack(lp_l), stack(val_l), stack(ent_l)


@settings(max_examples=10, deadline=None)
@given(data=st.data(), with_resets=st.booleans())
def test_evaluate_actions_reproduces_sampling(data: st.DataObject, with_resets: bool) -> None:
    sp = space(3)
    net = make_net(sp, seed=7)
    t_len = 6
    masks_seq = [data.draw(random_masks(N_ENVS, sp)) for _ in range(t_len)]
    resets = None
    if with_resets:
        resets = torch.zeros(N_ENVS, t_len, dtype=torch.bool)
        resets[1, 3] = resets[2, 0] = True
    h0, obs, bp, actions, lp, values, ent = _rollout(net, sp, masks_seq, resets)
    out = net.evaluate_actions(obs, bp, stack_masks(masks_seq), actions, h0, resets=resets)
    assert out.log_probs.shape == (N_ENVS, t_len, len(HEAD_NAMES))
    torch.testing.assert_close(out.log_probs, lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.values, values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.entropy, ent, atol=1e-5, rtol=1e-5)
    flat_actions = actions.reshape(-1, len(HEAD_NAMES))
    assert torch.all(out.log_probs.reshape(-1, len(HEAD_NAMES))[~relevance(flat_actions)] == 0)


def test_evaluate_actions_gradients_are_finite() -> None:
    sp = space(2)
    net = make_net(sp, seed=1)
    masks_seq = [seeded_masks(N_ENVS, sp, t) for t in range(3)]
    h0, obs, bp, actions, *_ = _rollout(net, sp, masks_seq)
    out = net.evaluate_actions(obs, bp, stack_masks(masks_seq), actions, h0)
    (out.log_probs.sum() + out.entropy.sum() + out.values.sum()).backward()
    grads = [p.grad for p in net.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_sampling_is_deterministic_given_a_generator() -> None:
    sp = space(4)
    masks = seeded_masks(N_ENVS, sp, 0)
    obs, bp = random_inputs(sp, N_ENVS, 9)
    runs = []
    for _ in range(2):
        net = make_net(sp, seed=11)
        gen = torch.Generator().manual_seed(42)
        runs.append(net.act(obs, bp, masks, net.initial_hidden(N_ENVS, "cpu"), generator=gen))
    assert torch.equal(runs[0].actions, runs[1].actions)
    assert torch.equal(runs[0].log_probs, runs[1].log_probs)


def test_network_is_a_policy_in_both_call_forms() -> None:
    sp = space(2)
    net = make_net(sp)
    assert isinstance(net, Policy)
    masks = seeded_masks(2, sp, 0)
    obs, bp = random_inputs(sp, 2, 0)
    inp = PolicyInput(obs=obs, blueprint_ids=bp, masks=masks, reports=[], trackers=[])
    h = net.initial_hidden(2, "cpu")
    via_input = net.act(inp, h, generator=torch.Generator().manual_seed(3))
    via_tensors = net.act(obs, bp, masks, h, generator=torch.Generator().manual_seed(3))
    for a, b in zip(via_input[:5], via_tensors[:5], strict=True):
        assert torch.equal(a, b)
    assert via_input.actions.shape == (2, len(HEAD_NAMES))
    assert via_input.hidden[0].shape == (1, 2, 24)
    torch.testing.assert_close(net.predict_value(obs, bp, h), via_input.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_policy_runs_on_cuda_with_a_device_generator() -> None:
    sp = space(3)
    net = make_net(sp).to("cuda")
    envs = [
        [report(s) for s in sp.slot_ids],
        [report("s0", SeedStage.TRAINING)] + [report(s) for s in sp.slot_ids[1:]],
    ]
    trackers = [SignalTracker(), SignalTracker()]
    masks = compute_masks(envs, sp, max_seeds=3, device="cuda")
    obs, bp = build_features(
        trackers=trackers,
        reports=envs,
        epoch=0,
        max_epochs=5,
        last_ops=[0, 0],
        last_success=[True, True],
        device="cuda",
    )
    gen = torch.Generator(device="cuda").manual_seed(0)
    h0 = net.initial_hidden(2, "cuda")
    step = net.act(obs, bp, masks, h0, generator=gen)
    assert step.actions.device.type == "cuda"
    assert_valid(step.actions.cpu(), masks.to("cpu"))
    out = net.evaluate_actions(
        obs[:, None], bp[:, None], stack_masks([masks]), step.actions[:, None], h0
    )
    torch.testing.assert_close(out.log_probs[:, 0], step.log_probs, atol=1e-5, rtol=1e-5)
    heuristic = HeuristicPolicy(sp, PolicyConfig())
    inp = PolicyInput(obs=obs, blueprint_ids=bp, masks=masks, reports=envs, trackers=trackers)
    h_step = heuristic.act(inp, heuristic.initial_hidden(2, "cuda"))
    assert h_step.actions.device.type == "cuda"


def test_op_prior_sets_the_initial_op_distribution() -> None:
    """With near-zero head weights the initial op probabilities follow the prior's logits."""
    sp = space(3)
    masks = seeded_masks(N_ENVS, sp, 0)
    masks.op[:] = True  # every op valid, so the ratio is the prior's alone
    obs, bp = random_inputs(sp, N_ENVS, 5)
    prior = [0.0, 0.0, 0.0, -2.0, 0.0, 1.0]
    torch.manual_seed(0)
    net = FactoredActorCritic(
        obs_dim(sp.n_slots),
        sp,
        feature_dim=32,
        lstm_hidden=24,
        blueprint_embed_dim=3,
        op_prior=prior,
    )
    p = net.act(obs, bp, masks, net.initial_hidden(N_ENVS, "cpu")).op_probs
    prune = p[:, LifecycleOp.PRUNE] / p[:, LifecycleOp.WAIT]
    advance = p[:, LifecycleOp.ADVANCE] / p[:, LifecycleOp.WAIT]
    torch.testing.assert_close(prune, torch.full_like(prune, math.exp(-2.0)), rtol=0.1, atol=0)
    torch.testing.assert_close(advance, torch.full_like(advance, math.e), rtol=0.1, atol=0)
    # The prior is where learning starts, not a constraint: the bias is a trained parameter.
    assert net.op_head.bias.requires_grad
    uniform = make_net(sp).act(obs, bp, masks, net.initial_hidden(N_ENVS, "cpu")).op_probs
    torch.testing.assert_close(uniform, torch.full_like(uniform, 1 / N_OPS), rtol=0.1, atol=0)
