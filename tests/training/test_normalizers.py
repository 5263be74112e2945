"""Running statistics: batched merges equal one-shot statistics; state round-trips."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.training.learning.normalizers import RewardNormalizer, RunningMeanStd, ValueNormalizer


@settings(max_examples=50, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 20), min_size=1, max_size=6),
    seed=st.integers(0, 10_000),
)
def test_batched_merge_equals_full_statistics(sizes: list[int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batches = [torch.randn(n, 3, generator=gen) * 5 + 2 for n in sizes]
    rms = RunningMeanStd(3)
    for b in batches:
        rms.update(b)
    full = torch.cat(batches).double()
    torch.testing.assert_close(rms.mean, full.mean(0))
    torch.testing.assert_close(rms.var, full.var(0, unbiased=False))
    assert int(rms.count) == sum(sizes)


def test_normalize_clips_and_handles_leading_dims() -> None:
    rms = RunningMeanStd((2,), clip=3.0)
    rms.update(torch.tensor([[0.0, 10.0], [2.0, 10.0]]))  # var of feature 1 is 0
    out = rms.normalize(torch.tensor([[[1.0, 11.0]]]))
    assert out.shape == (1, 1, 2)
    assert out[0, 0, 0].item() == 0.0
    assert out[0, 0, 1].item() == 3.0  # (11-10)/sqrt(eps) clipped to +3


def test_frozen_update_is_a_no_op_and_state_round_trips() -> None:
    rms = RunningMeanStd(4)
    rms.update(torch.randn(10, 4))
    rms.freeze()
    before = rms.state_dict()
    rms.update(torch.randn(10, 4) + 100)
    after = rms.state_dict()
    for key in ("mean", "var", "count"):
        assert torch.equal(before[key], after[key])
    buf = io.BytesIO()
    torch.save(rms.state_dict(), buf)
    buf.seek(0)
    other = RunningMeanStd(4)
    other.load_state_dict(torch.load(buf, weights_only=True))
    assert other.frozen
    x = torch.randn(5, 4)
    assert torch.equal(other.normalize(x), rms.normalize(x))


def test_reward_normalizer_divides_by_return_std_without_shifting() -> None:
    norm = RewardNormalizer(gamma=0.9)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        norm.update(torch.randn(8, generator=gen) + 3.0)
    r = torch.tensor([1.0, -1.0, 0.0])
    out = norm.normalize(r)
    assert out[2].item() == 0.0  # no mean shift: zero stays zero, signs survive
    assert out[0].item() > 0 > out[1].item()
    # Returns of mean-3 rewards with gamma 0.9 are ~30: their std is far above 1.
    assert out[0].item() < 1.0
    assert norm.normalize(torch.tensor([1e9])).item() == 10.0  # clip 10


def test_reward_normalizer_without_gamma_uses_reward_std_and_round_trips() -> None:
    norm = RewardNormalizer()
    norm.update(torch.tensor([2.0, -2.0, 2.0, -2.0]))
    torch.testing.assert_close(norm.normalize(torch.tensor([4.0])), torch.tensor([2.0]))
    assert norm.normalize_scalar(-10.0) == pytest.approx(-5.0)
    other = RewardNormalizer()
    other.load_state_dict(norm.state_dict())
    assert torch.equal(other.normalize(torch.tensor([3.0])), norm.normalize(torch.tensor([3.0])))


def test_reward_normalizer_resets_returns_on_done() -> None:
    a = RewardNormalizer(gamma=1.0)
    a.update(torch.tensor([5.0]), torch.tensor([True]))
    a.update(torch.tensor([1.0]))
    b = RewardNormalizer(gamma=1.0)
    b.update(torch.tensor([5.0]))
    b.update(torch.tensor([1.0]))
    # With the reset the second return is 1, without it 6: different variances.
    assert not torch.equal(a.rms.var, b.rms.var)
    torch.testing.assert_close(a.rms.var, torch.tensor(4.0, dtype=torch.float64))


def test_value_normalizer_is_std_only_and_inverts() -> None:
    vn = ValueNormalizer()
    vn.update(torch.tensor([3.0, -3.0, 3.0, -3.0]))
    torch.testing.assert_close(vn.scale, torch.tensor(3.0, dtype=torch.float64))
    v = torch.tensor([6.0, 0.0, -1.5])
    torch.testing.assert_close(vn.normalize(v), torch.tensor([2.0, 0.0, -0.5]))
    torch.testing.assert_close(vn.denormalize(vn.normalize(v)), v)
    other = ValueNormalizer()
    other.load_state_dict(vn.state_dict())
    assert torch.equal(other.scale, vn.scale)
