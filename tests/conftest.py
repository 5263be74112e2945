"""Shared test configuration: hypothesis profile, torch threads, ``browser`` markers."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "esper",
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "esper"))

CHROMIUM = Path("/usr/bin/chromium")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``browser`` tests without Chromium, except under CI where they must run."""
    if CHROMIUM.exists() or os.environ.get("CI"):
        return
    skip = pytest.mark.skip(reason=f"needs headless Chromium at {CHROMIUM}")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _single_intra_op_thread() -> Iterator[None]:
    """Tiny tensors gain nothing from intra-op threads, and on a busy 2-core machine the
    spinning workers make each op orders of magnitude slower. Applied only when torch is
    already imported, so torch-free tests stay torch-free; restored after each test."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
