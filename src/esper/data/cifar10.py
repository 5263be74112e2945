"""CIFAR-10 read from the official *binary* distribution in a local directory.

Each file is a sequence of 3,073-byte records: one label byte (0-9) followed by
3,072 pixel bytes (1,024 red, 1,024 green, 1,024 blue, row-major 32x32). The files are
parsed as raw bytes; nothing is ever unpickled and nothing is downloaded.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from esper.core.datasets import (
    CIFAR_SUBDIR,
    CIFAR_TEST_FILE,
    CIFAR_TRAIN_FILES,
    cifar_how_to_get,
)
from esper.errors import DatasetError

CIFAR_CLASSES = 10
CIFAR_IMAGE_SHAPE = (3, 32, 32)
CIFAR_PIXELS = 3 * 32 * 32
CIFAR_RECORD_BYTES = 1 + CIFAR_PIXELS
CIFAR_RECORDS_PER_FILE = 10_000
PIXEL_MAX = 255.0


def resolve_cifar_dir(data_path: str | os.PathLike[str] | None) -> Path:
    """The directory holding the .bin files (``data_path`` or its ``cifar-10-batches-bin``)."""
    if not data_path:
        raise DatasetError(
            "task cifar10 needs task.data_path: " + cifar_how_to_get(Path("<data_path>"))
        )
    root = Path(data_path).expanduser()
    if not root.is_dir():
        raise DatasetError(f"CIFAR-10 directory not found: {root}; " + cifar_how_to_get(root))
    nested = root / CIFAR_SUBDIR
    if not (root / CIFAR_TEST_FILE).exists() and nested.is_dir():
        root = nested
    missing = [f for f in (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE) if not (root / f).is_file()]
    if missing:
        raise DatasetError(
            f"CIFAR-10 files missing in {root}: {', '.join(missing)}; " + cifar_how_to_get(root)
        )
    return root


def read_cifar10_batch(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 3, 32, 32], labels int64 [N]) from one binary batch file."""
    p = Path(path)
    raw = np.fromfile(p, dtype=np.uint8)
    if raw.size == 0:
        raise DatasetError(f"{p}: empty file; expected {CIFAR_RECORD_BYTES}-byte CIFAR-10 records")
    if raw.size % CIFAR_RECORD_BYTES:
        whole, extra = divmod(raw.size, CIFAR_RECORD_BYTES)
        raise DatasetError(
            f"{p}: {raw.size} bytes is not a whole number of {CIFAR_RECORD_BYTES}-byte records "
            f"(1 label byte + {CIFAR_PIXELS} pixel bytes): {whole} records and {extra} stray "
            f"bytes; the file is truncated or not the CIFAR-10 binary version "
            f"(an official batch is {CIFAR_RECORDS_PER_FILE * CIFAR_RECORD_BYTES} bytes)"
        )
    records = raw.reshape(-1, CIFAR_RECORD_BYTES)
    labels = records[:, 0].astype(np.int64)
    bad = np.flatnonzero(labels >= CIFAR_CLASSES)
    if bad.size:
        raise DatasetError(
            f"{p}: record {int(bad[0])} has label {int(labels[bad[0]])} but CIFAR-10 labels are "
            f"0-{CIFAR_CLASSES - 1} ({bad.size} bad records); is this the CIFAR-10 binary version?"
        )
    images = records[:, 1:].reshape(-1, *CIFAR_IMAGE_SHAPE)
    return images, labels


def write_cifar10_batch(
    path: str | os.PathLike[str], images: np.ndarray, labels: np.ndarray
) -> None:
    """Write records in the official binary format (atomically: temp file + rename)."""
    images = np.asarray(images, dtype=np.uint8).reshape(-1, CIFAR_PIXELS)
    labels = np.asarray(labels, dtype=np.uint8).reshape(-1, 1)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {labels.shape[0]} labels")
    data = np.concatenate([labels, images], axis=1).tobytes()
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _stack(files: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    parts = [read_cifar10_batch(f) for f in files]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def load_cifar10(data_path: str | os.PathLike[str] | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Train (data_batch_1..5) and validation (test_batch) tensors, float32 normalised
    per channel with the training set's mean and standard deviation."""
    root = resolve_cifar_dir(data_path)
    train_img, train_lab = _stack([root / f for f in CIFAR_TRAIN_FILES])
    val_img, val_lab = read_cifar10_batch(root / CIFAR_TEST_FILE)
    train_x = torch.from_numpy(train_img).float().div_(PIXEL_MAX)
    mean = train_x.mean(dim=(0, 2, 3), keepdim=True)
    std = train_x.std(dim=(0, 2, 3), keepdim=True).clamp_min(torch.finfo(torch.float32).eps)
    train_x.sub_(mean).div_(std)
    val_x = torch.from_numpy(val_img).float().div_(PIXEL_MAX).sub_(mean).div_(std)
    return train_x, torch.from_numpy(train_lab), val_x, torch.from_numpy(val_lab)
