"""The 8x8 handwritten digits that scikit-learn ships: a real task with no download.

The data is the CSV scikit-learn bundles (``sklearn/datasets/data/digits.csv.gz``,
what ``sklearn.datasets.load_digits`` reads). It is read directly when present because
importing scikit-learn costs seconds per run; otherwise ``load_digits`` is used.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

#: Pixel values in the bundled data set run from 0 to 16.
DIGITS_MAX_PIXEL = 16.0
DIGITS_VAL_FRACTION = 0.2
DIGITS_SIDE = 8
DIGITS_SAMPLES = 1797
_BUNDLED_CSV = ("datasets", "data", "digits.csv.gz")


def _bundled_csv() -> Path | None:
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)), *_BUNDLED_CSV)
    return path if path.is_file() else None


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images float32 [1797, 8, 8] in 0..16, labels int64 [1797])."""
    path = _bundled_csv()
    if path is not None:
        with gzip.open(path, "rt") as fh:
            table = np.loadtxt(fh, delimiter=",", dtype=np.float64)
        if table.shape == (DIGITS_SAMPLES, DIGITS_SIDE * DIGITS_SIDE + 1):
            images = table[:, :-1].reshape(-1, DIGITS_SIDE, DIGITS_SIDE).astype(np.float32)
            return images, table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.asarray(bunch.images, dtype=np.float32), np.asarray(bunch.target, dtype=np.int64)


def load_digits_split(*, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(train_x [N,1,8,8], train_y, val_x, val_y): a seeded 80/20 split, standardised
    with the training split's mean and standard deviation."""
    raw_images, raw_labels = load_digits_arrays()
    images = torch.from_numpy(raw_images) / DIGITS_MAX_PIXEL
    labels = torch.from_numpy(raw_labels)
    n = labels.numel()
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = round(n * DIGITS_VAL_FRACTION)
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    train = images[train_idx]
    mean, std = train.mean(), train.std()

    def prep(x: Tensor) -> Tensor:
        return ((x - mean) / std).unsqueeze(1).contiguous()

    return prep(train), labels[train_idx], prep(images[val_idx]), labels[val_idx]
