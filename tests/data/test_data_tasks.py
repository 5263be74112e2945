"""Digits, synthetic and text tasks: shapes, splits, determinism, clear errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from esper.config import TaskConfig
from esper.core.enums import TaskName, Topology
from esper.data.digits import load_digits_arrays
from esper.data.synthetic import SYNTHETIC_CLASSES, make_synthetic
from esper.data.tasks import load_task, task_spec
from esper.data.text import min_text_bytes
from esper.errors import DatasetError


def test_digits_split_is_seeded_disjoint_and_standardised() -> None:
    cfg = TaskConfig()
    a = load_task(cfg, seed=0)
    b = load_task(cfg, seed=0)
    c = load_task(cfg, seed=1)
    assert a.spec == task_spec(cfg)
    assert a.spec.topology == Topology.CNN and a.spec.input_shape == (1, 8, 8)
    assert a.spec.random_guess_loss == pytest.approx(math.log(10))
    assert a.train_x.shape == (1438, 1, 8, 8) and a.val_x.shape == (359, 1, 8, 8)
    assert a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.long
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.val_y, b.val_y)
    assert not torch.equal(a.train_y, c.train_y)
    assert abs(float(a.train_x.mean())) < 1e-5 and float(a.train_x.std()) == pytest.approx(
        1.0, abs=1e-4
    )
    # The two splits partition the data set: together they hold every image exactly once.
    _, labels = load_digits_arrays()
    both = torch.cat([a.train_y, a.val_y])
    assert torch.equal(torch.bincount(both), torch.bincount(torch.from_numpy(labels)))
    assert both.numel() == labels.shape[0]


def test_digits_bundled_file_matches_sklearn() -> None:
    from sklearn.datasets import load_digits

    images, labels = load_digits_arrays()
    bunch = load_digits()
    assert (images == bunch.images).all() and (labels == bunch.target).all()


def test_synthetic_is_seeded_balanced_and_learnable() -> None:
    x, y = make_synthetic(600, seed=3)
    x2, y2 = make_synthetic(600, seed=3)
    assert x.shape == (600, 3, 32, 32) and torch.equal(x, x2) and torch.equal(y, y2)
    assert torch.bincount(y).tolist() == [60] * SYNTHETIC_CLASSES
    vx, vy = make_synthetic(300, seed=4)
    assert not torch.equal(vx[:10], x[:10])

    # Phase-invariant features (FFT magnitudes) + nearest centroid: far above chance.
    def feats(t: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft2(t).abs().flatten(1)

    f, vf = feats(x), feats(vx)
    centroids = torch.stack([f[y == c].mean(0) for c in range(SYNTHETIC_CLASSES)])
    pred = torch.cdist(vf, centroids).argmin(1)
    assert (pred == vy).float().mean() > 0.6
    data = load_task(
        TaskConfig(name=TaskName.SYNTHETIC, synthetic_train_size=50, synthetic_val_size=20), seed=0
    )
    assert data.train_x.shape == (50, 3, 32, 32) and data.val_y.shape == (20,)


def test_text_windows_are_shifted_bytes(tmp_path: Path) -> None:
    text = bytes(range(256)) * 4
    path = tmp_path / "corpus.txt"
    path.write_bytes(text)
    cfg = TaskConfig(name=TaskName.TEXT, data_path=str(path), seq_len=16)
    data = load_task(cfg, seed=0)
    assert data.spec.is_lm and data.spec.topology == Topology.TRANSFORMER
    assert data.spec.input_shape == (16,) and data.spec.num_classes == 256
    assert data.spec.random_guess_loss == pytest.approx(math.log(256))
    assert data.train_x.dtype == torch.long and data.train_x.shape[1] == 16
    assert torch.equal(data.train_x[:, 1:], data.train_y[:, :-1])
    assert torch.equal((data.train_x + 1) % 256, data.train_y)  # the corpus counts up
    assert data.val_x.shape[0] >= 1
    # Train windows come from the head, validation windows from the tail.
    assert int(data.train_x[0, 0]) == 0
    split = len(text) - int(len(text) * 0.1)  # the last 10% is validation
    assert data.train_x.shape[0] == (split - 17) // 8 + 1  # 17-byte windows, stride 8


def test_text_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not found"):
        load_task(TaskConfig(name=TaskName.TEXT, data_path=str(tmp_path / "missing.txt")), seed=0)
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * (min_text_bytes(16) - 1))
    with pytest.raises(DatasetError, match="too short for seq_len 16"):
        load_task(TaskConfig(name=TaskName.TEXT, data_path=str(short), seq_len=16), seed=0)
    short.write_bytes(b"x" * min_text_bytes(16))
    data = load_task(TaskConfig(name=TaskName.TEXT, data_path=str(short), seq_len=16), seed=0)
    assert data.val_x.shape[0] == 1 and data.train_x.shape[0] >= 1
