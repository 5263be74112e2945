"""The one sanctioned device-to-host transfer of the hot path.

Every read of device data that the trainer makes on purpose (the step's statistics, the
policy's decision, one packet per PPO epoch) goes through :func:`host_copy`, so a test
can tell those from stray syncs (``.item()``, ``bool(t)``, a library's validation
read): :class:`esper.training.launch_count.SyncGuard` fails on any read made elsewhere.
Tensors that live on the host by design (the rewards) are read with :func:`host_array`,
which refuses a device tensor, so it never hides a transfer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def host_copy(t: torch.Tensor, *, array: bool = False) -> Any:
    """``t`` as (nested) Python numbers, or with ``array`` as a numpy array (the step's
    columns): one device-to-host copy.

    On CUDA it is exempt from ``torch.cuda.set_sync_debug_mode`` (this transfer is meant
    to wait), so that mode can flag every other sync.
    """
    if t.device.type == "cuda" and torch.cuda.get_sync_debug_mode() != 0:
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            return _read(t, array)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return _read(t, array)


def _read(t: torch.Tensor, array: bool) -> Any:
    host = t.detach().cpu()
    # A CPU tensor's .cpu() is itself: copy, so later in-place updates cannot show through.
    return host.numpy().copy() if array else host.tolist()


def host_array(t: torch.Tensor) -> np.ndarray:
    """A tensor that lives on the host by design (the step's rewards and their
    normaliser) as a numpy copy: no device is involved, so it is neither a transfer nor
    a sync, and the sync guard lets it pass. A device tensor is refused: reading one is
    a transfer (:func:`host_copy`)."""
    if t.device.type != "cpu":
        raise ValueError(f"host_array: a {t.device.type} tensor; device reads use host_copy")
    out: np.ndarray = t.detach().numpy().copy()
    return out
