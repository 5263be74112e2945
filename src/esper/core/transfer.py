"""The one sanctioned device-to-host transfer of the hot path.

Every read of device data that the trainer makes on purpose (the step's statistics, the
policy's decision, the rewards, one packet per PPO epoch) goes through :func:`host_copy`,
so a test can tell those from stray syncs (``.item()``, ``bool(t)``, a library's
validation read): :class:`esper.training.launch_count.SyncGuard` fails on any read made
elsewhere.
"""

from __future__ import annotations

from typing import Any

import torch


def host_copy(t: torch.Tensor) -> list[Any]:
    """``t`` as (nested) Python numbers: one device-to-host copy.

    On CUDA it is exempt from ``torch.cuda.set_sync_debug_mode`` (this transfer is meant
    to wait), so that mode can flag every other sync.
    """
    if t.device.type == "cuda" and torch.cuda.get_sync_debug_mode() != 0:
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            values: list[Any] = t.cpu().tolist()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        return values
    values = t.cpu().tolist()
    return values
