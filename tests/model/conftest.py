"""Model tests run tiny networks: one intra-op thread each.

Intra-op parallelism cannot speed up 8x8 convolutions, and on a shared 2-core machine
OpenMP barriers make such ops tens of times slower under load. The previous thread
count is restored after every test, so nothing leaks to other test directories.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_intra_op_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
