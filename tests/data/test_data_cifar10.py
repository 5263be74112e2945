"""The CIFAR-10 binary reader: generated files round-trip; bad ones fail clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from esper.config import TaskConfig
from esper.core.enums import TaskName
from esper.data.cifar10 import (
    CIFAR_RECORD_BYTES,
    CIFAR_TEST_FILE,
    CIFAR_TRAIN_FILES,
    load_cifar10,
    read_cifar10_batch,
    write_cifar10_batch,
)
from esper.data.tasks import load_task
from esper.errors import DatasetError, UserError

PER_FILE = 6


def _batch(seed: int, n: int = PER_FILE) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    return images, labels


def _write_dataset(root: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    root.mkdir(parents=True, exist_ok=True)
    written = {}
    for i, name in enumerate((*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE)):
        written[name] = _batch(i)
        write_cifar10_batch(root / name, *written[name])
    return written


def test_reader_matches_the_official_record_layout(tmp_path: Path) -> None:
    images, labels = _batch(0, 3)
    # Build the bytes by hand: label byte, then R plane, G plane, B plane (row-major).
    raw = b"".join(
        bytes([int(lab)]) + img.tobytes() for img, lab in zip(images, labels, strict=True)
    )
    path = tmp_path / "data_batch_1.bin"
    path.write_bytes(raw)
    got_images, got_labels = read_cifar10_batch(path)
    assert got_images.shape == (3, 3, 32, 32) and got_images.dtype == np.uint8
    assert np.array_equal(got_images, images) and np.array_equal(got_labels, labels)
    assert got_images[1, 2, 0, 5] == raw[CIFAR_RECORD_BYTES + 1 + 2 * 1024 + 5]


def test_load_reads_train_and_test_and_normalises(tmp_path: Path) -> None:
    written = _write_dataset(tmp_path / "cifar-10-batches-bin")
    # The parent of the extracted folder works too.
    train_x, train_y, val_x, val_y = load_cifar10(tmp_path)
    assert train_x.shape == (5 * PER_FILE, 3, 32, 32) and train_x.dtype == torch.float32
    assert val_x.shape == (PER_FILE, 3, 32, 32)
    expected_y = np.concatenate([written[f][1] for f in CIFAR_TRAIN_FILES])
    assert torch.equal(train_y, torch.from_numpy(expected_y.astype(np.int64)))
    assert torch.equal(val_y, torch.from_numpy(written[CIFAR_TEST_FILE][1].astype(np.int64)))
    per_channel_mean = train_x.mean(dim=(0, 2, 3))
    assert torch.allclose(per_channel_mean, torch.zeros(3), atol=1e-5)
    assert torch.allclose(train_x.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-4)
    # Pixels keep the file's order: undoing the per-channel normalisation gives the bytes.
    raw = np.concatenate([written[f][0] for f in CIFAR_TRAIN_FILES]).astype(np.float32) / 255.0
    mean = raw.mean(axis=(0, 2, 3), keepdims=True)
    std = raw.std(axis=(0, 2, 3), ddof=1, keepdims=True)
    assert np.allclose(train_x.numpy(), (raw - mean) / std, atol=1e-5)
    raw_val = written[CIFAR_TEST_FILE][0].astype(np.float32) / 255.0
    assert np.allclose(val_x.numpy(), (raw_val - mean) / std, atol=1e-5)
    data = load_task(TaskConfig(name=TaskName.CIFAR10, data_path=str(tmp_path)), seed=0)
    assert data.spec.input_shape == (3, 32, 32) and data.spec.num_classes == 10


def test_truncated_file_is_rejected_with_the_file_and_size(tmp_path: Path) -> None:
    _write_dataset(tmp_path)
    bad = tmp_path / CIFAR_TRAIN_FILES[2]
    bad.write_bytes(bad.read_bytes()[:-100])
    with pytest.raises(DatasetError) as err:
        load_cifar10(tmp_path)
    msg = str(err.value)
    assert str(bad) in msg and "not a whole number of 3073-byte records" in msg
    assert "truncated" in msg


def test_bad_labels_and_empty_files_are_rejected(tmp_path: Path) -> None:
    images, labels = _batch(1, 4)
    labels[2] = 17
    write_cifar10_batch(tmp_path / "x.bin", images, labels)
    with pytest.raises(DatasetError, match=r"record 2 has label 17"):
        read_cifar10_batch(tmp_path / "x.bin")
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(DatasetError, match="empty file"):
        read_cifar10_batch(tmp_path / "empty.bin")


def test_missing_directory_says_what_to_download_and_where(tmp_path: Path) -> None:
    where = tmp_path / "nowhere"
    with pytest.raises(DatasetError) as err:
        load_cifar10(where)
    msg = str(err.value)
    assert "CIFAR-10 binary version" in msg and "cifar-10-binary.tar.gz" in msg
    assert str(where) in msg and "https://www.cs.toronto.edu/~kriz/cifar.html" in msg
    assert isinstance(err.value, UserError)
    with pytest.raises(DatasetError, match=r"needs task\.data_path"):
        load_cifar10(None)


def test_missing_files_are_listed(tmp_path: Path) -> None:
    _write_dataset(tmp_path)
    (tmp_path / CIFAR_TRAIN_FILES[4]).unlink()
    (tmp_path / CIFAR_TEST_FILE).unlink()
    with pytest.raises(DatasetError, match=r"missing in .*data_batch_5\.bin, test_batch\.bin"):
        load_cifar10(tmp_path)
