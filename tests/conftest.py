"""Shared test configuration: hypothesis profile, torch threads, ``browser`` and
``namespaces`` markers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
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
    """Skip ``browser`` tests without Chromium, except under CI where they must run, and
    ``namespaces`` tests where unprivileged namespaces are not available."""
    skips: dict[str, pytest.MarkDecorator] = {}
    if not (CHROMIUM.exists() or os.environ.get("CI")):
        skips["browser"] = pytest.mark.skip(reason=f"needs headless Chromium at {CHROMIUM}")
    if any(item.get_closest_marker("namespaces") for item in items) and not _namespaces_available():
        skips["namespaces"] = pytest.mark.skip(
            reason="needs unprivileged user and mount namespaces (unshare -rm), not available here"
        )
    for item in items:
        for marker, skip in skips.items():
            if item.get_closest_marker(marker):
                item.add_marker(skip)


def _namespaces_available() -> bool:
    """Whether ``unshare --user --map-root-user --mount`` works (a private tmpfs can be
    mounted: how the disk-full tests get a real ENOSPC)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "true"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_delivered() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt in the tests, however pytest was started: a shell
    starts a background job (``pytest &``, a CI step run that way) with SIGINT ignored,
    and a test that presses Ctrl-C in this process would then see nothing happen."""
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


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
