"""The 8x8 handwritten digits that scikit-learn ships: a real task with no download."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

#: Pixel values in the bundled data set run from 0 to 16.
DIGITS_MAX_PIXEL = 16.0
DIGITS_VAL_FRACTION = 0.2


def load_digits_split(*, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(train_x [N,1,8,8], train_y, val_x, val_y): a seeded 80/20 split, standardised
    with the training split's mean and standard deviation."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.from_numpy(np.asarray(bunch.images, dtype=np.float32)) / DIGITS_MAX_PIXEL
    labels = torch.from_numpy(np.asarray(bunch.target, dtype=np.int64))
    n = labels.numel()
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = round(n * DIGITS_VAL_FRACTION)
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    train = images[train_idx]
    mean, std = train.mean(), train.std()

    def prep(x: Tensor) -> Tensor:
        return ((x - mean) / std).unsqueeze(1).contiguous()

    return prep(train), labels[train_idx], prep(images[val_idx]), labels[val_idx]
