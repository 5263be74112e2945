"""Which tensors are kept channels-last (the CNN hosts' layout on CPUs)."""

from __future__ import annotations

import torch
from torch import Tensor

IMAGE_DIMS = 4


def is_channels_last(t: Tensor) -> bool:
    """A 4-d tensor laid out channels-last (and not also plain contiguous, as 1x1 maps are)."""
    return (
        t.dim() == IMAGE_DIMS
        and not t.is_contiguous()
        and t.is_contiguous(memory_format=torch.channels_last)
    )
