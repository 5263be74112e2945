"""Rollout buffer: GAE against a slow reference, truncation, per-env rollback."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.core.constants import HEAD_NAMES
from esper.policy.actions import head_sizes
from esper.policy.masks import ActionMasks
from esper.training.learning.buffer import RolloutBuffer

N_SLOTS, OBS_DIM, HIDDEN = 3, 5, 4
SIZES = head_sizes(N_SLOTS)


def _masks(n: int, gen: torch.Generator) -> ActionMasks:
    fields = {}
    for name, size in SIZES.items():
        shape = (n, SIZES["op"], size) if name == "slot" else (n, size)
        fields[name] = torch.rand(shape, generator=gen) > 0.3
    return ActionMasks(**fields)


def _filled(
    n: int, t: int, seed: int = 0, device: str = "cpu", **flags: torch.Tensor
) -> RolloutBuffer:
    """A full buffer of random (CPU-generated, hence device-independent) transitions."""
    gen = torch.Generator().manual_seed(seed)
    buf = RolloutBuffer(n, t, OBS_DIM, N_SLOTS, SIZES, HIDDEN, device)
    buf.start((torch.randn(1, n, HIDDEN, generator=gen), torch.randn(1, n, HIDDEN, generator=gen)))
    dones = flags.get("dones", torch.zeros(n, t, dtype=torch.bool))
    for step in range(t):
        buf.add(
            step,
            obs=torch.randn(n, OBS_DIM, generator=gen),
            blueprint_ids=torch.randint(0, 12, (n, N_SLOTS), generator=gen),
            masks=_masks(n, gen),
            actions=torch.randint(0, 3, (n, len(HEAD_NAMES)), generator=gen),
            log_probs=-torch.rand(n, len(HEAD_NAMES), generator=gen),
            values=torch.randn(n, generator=gen),
            rewards_normalized=torch.randn(n, generator=gen),
            rewards_raw=torch.randn(n, generator=gen) * 3,
            dones=dones[:, step],
        )
    return buf


def reference_gae(
    rewards: list[float],
    values: list[float],
    last_value: float,
    terminal: list[bool],
    gamma: float,
    lam: float,
) -> tuple[list[float], list[float]]:
    """Plain-Python GAE for one env, written from the definition."""
    t_len = len(rewards)
    adv = [0.0] * t_len
    for t in range(t_len):
        # Sum discounted TD errors forward until the segment ends.
        total, weight = 0.0, 1.0
        for k in range(t, t_len):
            if terminal[k]:
                nxt = 0.0
            elif k == t_len - 1:
                nxt = last_value
            else:
                nxt = values[k + 1]
            delta = rewards[k] + gamma * nxt - values[k]
            total += weight * delta
            if terminal[k]:
                break
            weight *= gamma * lam
        adv[t] = total
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 4),
    t=st.integers(1, 8),
    seed=st.integers(0, 1000),
    gamma=st.sampled_from([0.0, 0.9, 0.995, 1.0]),
    lam=st.sampled_from([0.0, 0.5, 0.98, 1.0]),
)
def test_gae_matches_slow_reference(n: int, t: int, seed: int, gamma: float, lam: float) -> None:
    gen = torch.Generator().manual_seed(seed + 1)
    dones = torch.rand(n, t, generator=gen) < 0.15
    buf = _filled(n, t, seed, dones=dones)
    if t > 1:
        buf.apply_rollback(0, 0, t // 2, penalty=-10.0, penalty_normalized=-2.0)
    last = torch.randn(n, generator=gen)
    buf.compute_returns_and_advantages(last, gamma=gamma, gae_lambda=lam)
    rewards = buf.learning_rewards()
    terminal = buf.dones | buf.segment_end
    for e in range(n):
        adv, ret = reference_gae(
            rewards[e].tolist(),
            buf.values[e].tolist(),
            float(last[e]),
            terminal[e].tolist(),
            gamma,
            lam,
        )
        torch.testing.assert_close(buf.advantages[e], torch.tensor(adv), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(buf.returns[e], torch.tensor(ret), rtol=1e-4, atol=1e-4)


def test_an_open_last_step_bootstraps_from_the_given_value() -> None:
    buf = _filled(2, 3)
    buf.compute_returns_and_advantages(torch.tensor([5.0, -4.0]), gamma=0.9, gae_lambda=0.5)
    r, v = buf.learning_rewards(), buf.values
    # Last step: delta = r + gamma * V(s_T) - V(s_{T-1}).
    for e, last in enumerate((5.0, -4.0)):
        expected = r[e, 2] + 0.9 * last - v[e, 2]
        torch.testing.assert_close(buf.advantages[e, 2], expected)
    # Earlier steps: the advantage flows back from the next step.
    for e in range(2):
        delta = r[e, 1] + 0.9 * v[e, 2] - v[e, 1]
        torch.testing.assert_close(buf.advantages[e, 1], delta + 0.45 * buf.advantages[e, 2])


@pytest.mark.parametrize("rollback_first", [True, False])
@pytest.mark.parametrize("panic_step", [0, 1, 3, 5])
def test_rollback_changes_only_that_env_and_the_penalty_lands(
    rollback_first: bool, panic_step: int
) -> None:
    n, t, snapshot = 3, 6, max(panic_step - 2, 0)
    reference = _filled(n, t, seed=4)
    buf = RolloutBuffer(n, t, OBS_DIM, N_SLOTS, SIZES, HIDDEN, "cpu")
    buf.start(reference.hidden0)
    affected = None
    masks = reference.stacked_masks()
    for step in range(t):
        if rollback_first and step == panic_step:  # the trainer's order: before add(step)
            affected = buf.apply_rollback(1, snapshot, panic_step, -10.0, penalty_normalized=-3.0)
        buf.add(
            step,
            obs=reference.obs[:, step],
            blueprint_ids=reference.blueprint_ids[:, step],
            masks=masks[:, step],
            actions=reference.actions[:, step],
            log_probs=reference.log_probs[:, step],
            values=reference.values[:, step],
            rewards_normalized=reference.rewards_normalized[:, step],
            rewards_raw=reference.rewards_raw[:, step],
            dones=reference.dones[:, step],
        )
    if not rollback_first:
        affected = buf.apply_rollback(1, snapshot, panic_step, -10.0, penalty_normalized=-3.0)
    assert affected == panic_step - snapshot
    blame = max(panic_step - 1, 0)
    last = torch.tensor([0.5, 0.5, 0.5])
    for b in (buf, reference):
        b.compute_returns_and_advantages(last, gamma=0.99, gae_lambda=0.95)
    for e in (0, 2):  # other envs: bitwise identical
        assert torch.equal(buf.advantages[e], reference.advantages[e])
        assert torch.equal(buf.env_rewards(e), reference.env_rewards(e))
    raw = buf.env_rewards(1) - reference.env_rewards(1)
    assert raw[blame].item() == pytest.approx(-10.0)
    assert torch.count_nonzero(raw).item() == 1
    learn = buf.learning_rewards()[1] - reference.learning_rewards()[1]
    assert learn[blame].item() == pytest.approx(-3.0)
    assert buf.rolled_back[1].tolist() == [snapshot <= s < panic_step for s in range(t)]
    assert not buf.rolled_back[[0, 2]].any()
    r, v = buf.learning_rewards(), buf.values
    if panic_step > 0:
        # The segment ends at the blamed decision: nothing is bootstrapped across the restore.
        torch.testing.assert_close(buf.advantages[1, blame], r[1, blame] - v[1, blame])
        # ... and the penalty reaches the earlier decisions of the segment through GAE.
        if blame > 0:
            assert buf.advantages[1, blame - 1] < reference.advantages[1, blame - 1]
    else:
        assert not buf.segment_end.any()
    # Decisions after the restore start a new segment and do not see the penalty.
    after = slice(panic_step, t)
    if panic_step > 0:
        assert torch.equal(buf.advantages[1, after], reference.advantages[1, after])


def test_start_resets_flags_and_masks_round_trip() -> None:
    buf = _filled(2, 2)
    buf.apply_rollback(0, 0, 1, -10.0)
    masks = buf.stacked_masks()
    assert masks.op.shape == (2, 2, SIZES["op"]) and masks.slot.shape == (2, 2, 6, N_SLOTS)
    h = (torch.ones(1, 2, HIDDEN), torch.zeros(1, 2, HIDDEN))
    buf.start(h)
    assert not buf.full and not buf.segment_end.any() and not buf.dones.any()
    assert buf.penalties.abs().sum() == 0 and torch.equal(buf.hidden0[0], h[0])
    with pytest.raises(RuntimeError, match="incomplete"):
        buf.compute_returns_and_advantages(torch.zeros(2), gamma=0.9, gae_lambda=0.9)
    with pytest.raises(ValueError, match="out of range"):
        buf.apply_rollback(2, 0, 1, -1.0)
    with pytest.raises(ValueError, match="hidden0"):
        buf.start((torch.zeros(1, 3, HIDDEN), torch.zeros(1, 3, HIDDEN)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_buffer_matches_cpu() -> None:
    cpu, gpu = _filled(3, 5, seed=2), _filled(3, 5, seed=2, device="cuda")
    for buf in (cpu, gpu):
        buf.apply_rollback(2, 1, 3, -10.0, penalty_normalized=-2.0)
        buf.compute_returns_and_advantages(torch.ones(3), gamma=0.99, gae_lambda=0.95)
    torch.testing.assert_close(gpu.advantages.cpu(), cpu.advantages)
    torch.testing.assert_close(gpu.returns.cpu(), cpu.returns)
