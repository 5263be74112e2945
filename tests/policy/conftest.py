"""Policy tests run single-threaded: their tensors are tiny, and on a busy 2-core machine
intra-op threading makes each op orders of magnitude slower (spin-waiting workers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
