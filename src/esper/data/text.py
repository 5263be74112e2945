"""Byte-level language modelling over a local text file.

The file is split into a training head and a validation tail (no window crosses the
boundary); each example is a window of seq_len + 1 bytes: inputs are the first seq_len
bytes, targets the same window shifted by one.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from esper.core.datasets import TEXT_SOURCE
from esper.errors import DatasetError

TEXT_VAL_FRACTION = 0.1
#: Training windows overlap by half (stride seq_len // TRAIN_STRIDE_DIVISOR).
TRAIN_STRIDE_DIVISOR = 2


def min_text_bytes(seq_len: int) -> int:
    """Smallest file that gives both splits at least one window."""
    window = seq_len + 1
    return max(int(window / TEXT_VAL_FRACTION) + 1, 2 * window)


def windows(data: bytes, seq_len: int, stride: int) -> tuple[Tensor, Tensor]:
    """(inputs [N, seq_len], targets [N, seq_len]) as long byte ids."""
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    w = t.unfold(0, seq_len + 1, stride)
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def load_text(
    data_path: str | os.PathLike[str] | None, *, seq_len: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    if not data_path:
        raise DatasetError(f"task text needs task.data_path: {TEXT_SOURCE}")
    p = Path(data_path).expanduser()
    if not p.is_file():
        raise DatasetError(f"text file not found: {p}; point task.data_path at a local text file")
    data = p.read_bytes()
    need = min_text_bytes(seq_len)
    if len(data) < need:
        raise DatasetError(
            f"{p}: {len(data)} bytes is too short for seq_len {seq_len}: need at least "
            f"{need} bytes so that the training and validation splits each hold a "
            f"{seq_len + 1}-byte window"
        )
    split = len(data) - max(int(len(data) * TEXT_VAL_FRACTION), seq_len + 1)
    train_x, train_y = windows(data[:split], seq_len, max(1, seq_len // TRAIN_STRIDE_DIVISOR))
    val_x, val_y = windows(data[split:], seq_len, seq_len)
    return train_x, train_y, val_x, val_y
