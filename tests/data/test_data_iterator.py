"""SharedBatchIterator: one seeded loader split across envs without overlap."""

from __future__ import annotations

import pytest
import torch

from esper.data.iterator import SharedBatchIterator, val_batches


def _data(n: int = 103) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 2, 3, 3).contiguous()
    return x, torch.arange(n)


def _collect(it: SharedBatchIterator, epoch: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    return list(it.epoch(epoch))


def test_epochs_are_deterministic_and_differ_between_epochs() -> None:
    x, y = _data()
    a = SharedBatchIterator(x, y, n_envs=3, batch_size=8, seed=5)
    b = SharedBatchIterator(x, y, n_envs=3, batch_size=8, seed=5)
    ea, eb = _collect(a, 2), _collect(b, 2)
    assert len(ea) == len(eb) == a.batches_per_epoch == 5  # 34 samples per env
    for step_a, step_b in zip(ea, eb, strict=True):
        for (xa, ya), (xb, yb) in zip(step_a, step_b, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # Epoch e does not depend on earlier epochs having been drawn.
    assert torch.equal(_collect(a, 2)[0][0][1], ea[0][0][1])
    assert not torch.equal(_collect(a, 3)[0][0][1], ea[0][0][1])
    other_seed = SharedBatchIterator(x, y, n_envs=3, batch_size=8, seed=6)
    assert not torch.equal(_collect(other_seed, 2)[0][0][1], ea[0][0][1])


def test_envs_get_disjoint_equal_shares_of_every_epoch() -> None:
    x, y = _data()
    it = SharedBatchIterator(x, y, n_envs=4, batch_size=7, seed=0)
    steps = _collect(it, 0)
    per_env: list[list[int]] = [[] for _ in range(4)]
    for step in steps:
        assert len(step) == 4
        sizes = {b[1].numel() for b in step}
        assert len(sizes) == 1  # same batch size for every env at every step
        for env, (xb, yb) in enumerate(step):
            assert torch.equal(xb[:, 0, 0, 0].long(), yb)  # inputs travel with their targets
            per_env[env] += yb.tolist()
    seen = [set(ids) for ids in per_env]
    assert all(len(ids) == 25 for ids in per_env)  # 103 // 4
    assert all(seen[i].isdisjoint(seen[j]) for i in range(4) for j in range(i + 1, 4))
    assert len(set().union(*seen)) == 100


def test_samples_per_env_caps_the_share() -> None:
    x, y = _data()
    it = SharedBatchIterator(x, y, n_envs=2, batch_size=4, seed=0, samples_per_env=10)
    steps = _collect(it, 0)
    assert [s[0][1].numel() for s in steps] == [4, 4, 2]
    assert it.per_env == 10 and len(it) == 3


def test_channels_last_layout_and_devices() -> None:
    x, y = _data()
    it = SharedBatchIterator(x, y, n_envs=2, batch_size=8, seed=0, channels_last=True)
    xb, _ = next(iter(it.epoch(0)))[1]
    assert xb.is_contiguous(memory_format=torch.channels_last)
    val = it.val_batches(x, y, 40, limit=90)
    assert [b[1].numel() for b in val] == [40, 40, 10]
    assert all(b[0].is_contiguous(memory_format=torch.channels_last) for b in val)
    assert torch.equal(torch.cat([b[1] for b in val]), y[:90])
    plain = val_batches(x, y, 50)
    assert [b[1].numel() for b in plain] == [50, 50, 3] and plain[0][0].device.type == "cpu"


def test_rejects_impossible_splits() -> None:
    x, y = _data(3)
    with pytest.raises(ValueError, match="cannot be split"):
        SharedBatchIterator(x, y, n_envs=4, batch_size=2, seed=0)
    with pytest.raises(ValueError, match="targets"):
        SharedBatchIterator(x, y[:2], n_envs=1, batch_size=2, seed=0)


def test_without_the_split_every_env_trains_on_the_same_samples() -> None:
    """env_split off: the env count no longer divides the data; each env sees the same
    shuffled samples (the first samples_per_env of the epoch's permutation)."""
    x, y = _data()
    split = SharedBatchIterator(x, y, n_envs=4, batch_size=8, seed=3)
    shared = SharedBatchIterator(x, y, n_envs=4, batch_size=8, seed=3, split=False)
    assert shared.per_env == 103 and split.per_env == 25
    for step in _collect(shared, 1):
        assert all(torch.equal(b[1], step[0][1]) and torch.equal(b[0], step[0][0]) for b in step)
    ids = torch.cat([step[0][1] for step in _collect(shared, 1)])
    assert sorted(ids.tolist()) == list(range(103))  # the whole set, shuffled
    assert not torch.equal(ids, torch.cat([s[0][1] for s in _collect(shared, 2)]))
    capped = SharedBatchIterator(
        x, y, n_envs=200, batch_size=8, seed=3, split=False, samples_per_env=25
    )
    first = torch.cat([step[0][1] for step in _collect(capped, 1)])
    assert torch.equal(first, ids[:25])  # a prefix of the same permutation
    assert len(_collect(capped, 1)[0]) == 200  # more envs than samples is fine without the split


def test_rank_shards_without_the_split_see_the_same_samples() -> None:
    from esper.training.loop.distributed import RankShardIterator

    x, y = _data()
    kwargs = dict(batch_size=8, seed=3, samples_per_env=20, device=torch.device("cpu"))
    one = SharedBatchIterator(x, y, n_envs=4, split=False, **kwargs)  # type: ignore[arg-type]
    rank1 = RankShardIterator(
        x,
        y,
        n_envs=2,
        env_offset=2,
        n_global=4,
        channels_last=False,
        split=False,
        **kwargs,  # type: ignore[arg-type]
    )
    assert torch.equal(rank1.epoch_indices(0), one.epoch_indices(0)[2:4])


@pytest.mark.parametrize("split", [True, False])
def test_stacked_epochs_give_every_env_its_own_batches(split: bool) -> None:
    """``epoch_stacked`` (the batched host path's) yields, per step, exactly the
    per-env batches of ``epoch``, also for targets with their own dims (text: one
    target per position)."""
    x = torch.arange(50 * 6).view(50, 6)  # token sequences
    y = x + 1000  # next-token targets: [samples, seq_len]
    it = SharedBatchIterator(x, y, n_envs=3, batch_size=4, seed=1, split=split)
    stacked = list(it.epoch_stacked(0))
    per_env = _collect(it, 0)
    assert len(stacked) == len(per_env) == it.batches_per_epoch
    for (xs, ys), step in zip(stacked, per_env, strict=True):
        for i, (xe, ye) in enumerate(step):
            assert torch.equal(xs[i], xe) and torch.equal(ys[i], ye)
