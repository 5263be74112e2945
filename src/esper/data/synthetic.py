"""Procedural 32x32 colour images with learnable class structure, any size, seeded.

Class c is an oriented sinusoidal grating with a class-specific orientation, spatial
frequency and colour; each sample gets a random phase and contrast and Gaussian noise.
A CNN must learn orientation/frequency/colour detectors to separate the classes, so the
task exercises the same machinery as a real image task at benchmark scale.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SYNTHETIC_CLASSES = 10
SIZE = 32
CHANNELS = 3
#: Grating frequencies (cycles per image) cycle through BASE + k * STEP, k < N_FREQ.
FREQ_BASE = 2.0
FREQ_STEP = 1.5
N_FREQ = 3
CONTRAST_MIN = 0.6
CONTRAST_MAX = 1.0
NOISE_STD = 0.6
#: Validation images come from a different stream than training images.
VAL_SEED_OFFSET = 7_777_777


def _class_params(num_classes: int) -> tuple[Tensor, Tensor, Tensor]:
    """Orientation, frequency and RGB colour of every class (fixed, not random)."""
    c = torch.arange(num_classes, dtype=torch.float32)
    theta = math.pi * c / num_classes
    freq = FREQ_BASE + FREQ_STEP * (c % N_FREQ)
    phases = torch.tensor([0.0, 2.0 * math.pi / 3.0, 4.0 * math.pi / 3.0])
    colour = torch.cos(c[:, None] * 2.0 * math.pi / num_classes + phases[None, :])
    colour = 0.5 + 0.5 * colour  # in [0, 1], distinct per class
    return theta, freq, colour


def make_synthetic(
    n: int, *, seed: int, num_classes: int = SYNTHETIC_CLASSES
) -> tuple[Tensor, Tensor]:
    """(x float32 [n, 3, 32, 32], y long [n]), balanced classes in random order."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randperm(n, generator=gen) % num_classes
    theta, freq, colour = _class_params(num_classes)
    grid = torch.arange(SIZE, dtype=torch.float32) / SIZE
    yy, xx = torch.meshgrid(grid, grid, indexing="ij")
    t, f = theta[y][:, None, None], freq[y][:, None, None]
    phase = torch.rand(n, generator=gen)[:, None, None] * 2.0 * math.pi
    proj = xx * torch.cos(t) + yy * torch.sin(t)
    grating = torch.sin(2.0 * math.pi * f * proj + phase)
    contrast = CONTRAST_MIN + (CONTRAST_MAX - CONTRAST_MIN) * torch.rand(n, generator=gen)
    x = grating[:, None] * (colour[y] * contrast[:, None])[:, :, None, None]
    x = x + NOISE_STD * torch.randn(n, CHANNELS, SIZE, SIZE, generator=gen)
    return x.contiguous(), y.long()


def synthetic_split(
    n_train: int, n_val: int, *, seed: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    train_x, train_y = make_synthetic(n_train, seed=seed)
    val_x, val_y = make_synthetic(n_val, seed=seed + VAL_SEED_OFFSET)
    return train_x, train_y, val_x, val_y
