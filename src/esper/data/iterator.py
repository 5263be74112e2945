"""One shared, seeded batch iterator for all N envs.

The training set is preloaded on the device once. Every epoch draws one permutation
from a ``torch.Generator`` seeded with ``seed + epoch`` (so epoch e is the same
whatever happened before it, e.g. after a resume), gathers the used samples with a
single index operation, and gives env i the i-th contiguous share: within an epoch no
two envs see the same sample, and every env gets the same number of batches. Without
the split (``split=False``) every env trains on the same samples, so the env count can
grow without shrinking what each host learns from.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

Batch = tuple[Tensor, Tensor]
IMAGE_DIMS = 4


def _layout(x: Tensor, channels_last: bool) -> Tensor:
    if channels_last and x.dim() == IMAGE_DIMS:
        return x.contiguous(memory_format=torch.channels_last)
    return x.contiguous()


def val_batches(
    val_x: Tensor,
    val_y: Tensor,
    batch_size: int,
    limit: int | None = None,
    *,
    device: torch.device | str = "cpu",
    channels_last: bool = False,
) -> list[Batch]:
    """Fixed validation batches (the first ``limit`` samples), preloaded on ``device``."""
    n = val_y.shape[0] if limit is None else min(limit, val_y.shape[0])
    x = _layout(val_x[:n].to(device), channels_last)
    y = val_y[:n].to(device)
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n, batch_size)]


class SharedBatchIterator:
    """Splits each epoch's shuffled training set across ``n_envs`` envs (or, with
    ``split=False``, gives each env the same samples)."""

    def __init__(
        self,
        train_x: Tensor,
        train_y: Tensor,
        *,
        n_envs: int,
        batch_size: int,
        seed: int,
        samples_per_env: int | None = None,
        device: torch.device | str = "cpu",
        channels_last: bool = False,
        split: bool = True,
    ) -> None:
        n = train_y.shape[0]
        if train_x.shape[0] != n:
            raise ValueError(f"{train_x.shape[0]} inputs but {n} targets")
        if n_envs < 1 or batch_size < 1:
            raise ValueError("n_envs and batch_size must be >= 1")
        if split and n < n_envs:
            raise ValueError(f"{n} training samples cannot be split across {n_envs} envs")
        self.n_envs = n_envs
        self.batch_size = batch_size
        self.seed = seed
        self.device = torch.device(device)
        self.channels_last = channels_last
        self.split = split
        share = n // n_envs if split else n
        self.per_env = share if samples_per_env is None else min(share, samples_per_env)
        self.train_x = train_x.to(self.device)
        self.train_y = train_y.to(self.device)

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.per_env // self.batch_size)

    def __len__(self) -> int:
        return self.batches_per_epoch

    def epoch_rows(self, epoch_index: int, n_rows: int) -> Tensor:
        """[n_rows, per_env] sample indices of an epoch (CPU): the first ``n_rows`` shares
        of its permutation, or its first ``per_env`` samples in every row without the split."""
        gen = torch.Generator().manual_seed(self.seed + epoch_index)
        perm = torch.randperm(self.train_y.shape[0], generator=gen)
        if not self.split:
            return perm[: self.per_env].expand(n_rows, self.per_env)
        return perm[: n_rows * self.per_env].view(n_rows, self.per_env)

    def epoch_indices(self, epoch_index: int) -> Tensor:
        """[n_envs, per_env] sample indices of an epoch (CPU), row i for env i."""
        return self.epoch_rows(epoch_index, self.n_envs)

    def epoch(self, epoch_index: int) -> Iterator[list[Batch]]:
        """Per step, one (x, y) batch per env; the last batch may be smaller."""
        rows = self.epoch_indices(epoch_index)
        # Without the split every row is the same: gather it once, every env slices it.
        idx, stride = (rows.reshape(-1), self.per_env) if self.split else (rows[0], 0)
        idx = idx.to(self.device, non_blocking=True)
        x = _layout(self.train_x.index_select(0, idx), self.channels_last)
        y = self.train_y.index_select(0, idx)
        for start in range(0, self.per_env, self.batch_size):
            stop = min(start + self.batch_size, self.per_env)
            batches = []
            for env in range(self.n_envs):
                lo, hi = env * stride + start, env * stride + stop
                batches.append((x[lo:hi], y[lo:hi]))  # dim-0 slices keep channels-last strides
            yield batches

    def epoch_stacked(self, epoch_index: int) -> Iterator[tuple[Tensor, Tensor]]:
        """:meth:`epoch` for batched envs: per step, inputs [n_envs, B, ...] and targets
        [n_envs, B], views of the epoch's one gather (no copy per env or batch)."""
        rows = self.epoch_indices(epoch_index)
        idx = (rows.reshape(-1) if self.split else rows[0]).to(self.device, non_blocking=True)
        x = _layout(self.train_x.index_select(0, idx), self.channels_last)
        y = self.train_y.index_select(0, idx)
        if self.split:
            xs = x.view(self.n_envs, self.per_env, *x.shape[1:])
            ys = y.view(self.n_envs, self.per_env, *y.shape[1:])  # text: [.., seq_len]
        else:
            xs, ys = x.expand(self.n_envs, *x.shape), y.expand(self.n_envs, *y.shape)
        for start in range(0, self.per_env, self.batch_size):
            stop = min(start + self.batch_size, self.per_env)
            yield xs[:, start:stop], ys[:, start:stop]

    def val_batches(
        self, val_x: Tensor, val_y: Tensor, batch_size: int, limit: int | None = None
    ) -> list[Batch]:
        """Validation batches on this iterator's device and memory format."""
        return val_batches(
            val_x, val_y, batch_size, limit, device=self.device, channels_last=self.channels_last
        )
