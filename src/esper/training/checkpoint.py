"""Checkpoints: policy, optimizer, normalisers, RNG, round index, config, telemetry seq.

Written atomically (temp file in the same directory, fsync, rename) and loaded with
``torch.load(weights_only=True)``, so a crafted file carrying pickled objects is
rejected. Everything stored is tensors, numbers, strings, lists and dicts.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import torch

from esper.config import Config
from esper.errors import CheckpointError

CHECKPOINT_FORMAT = 1


def compat_fingerprint(cfg: Config) -> str:
    """What must match for a resume: everything but run length, ids, devices and output."""
    data = msgspec.to_builtins(cfg)
    for key in ("rounds", "run_id", "device", "env_devices", "checkpoint_every", "torch_threads"):
        data["run"].pop(key, None)
    data.pop("telemetry", None)
    return msgspec.json.encode(data, order="sorted").decode()


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> int:
    """Atomically write ``state`` to ``path``; returns the size in bytes."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": CHECKPOINT_FORMAT, **state}
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target.stat().st_size


def load_checkpoint(path: str | Path, cfg: Config) -> dict[str, Any]:
    """Load safely; reject unsafe, corrupt or incompatible checkpoints with a clear error."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"checkpoint not found: {p}")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{p}: refused to load (not a plain-tensor checkpoint; weights_only=True): "
            f"{str(exc).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise CheckpointError(f"{p}: corrupt or truncated checkpoint: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{p}: not an Esper checkpoint (format {CHECKPOINT_FORMAT})")
    theirs = state.get("compat")
    ours = compat_fingerprint(cfg)
    if theirs != ours:
        raise CheckpointError(
            f"{p}: checkpoint was written for another configuration; "
            f"differences: {_config_diff(theirs, ours)}"
        )
    return state


def _config_diff(theirs: Any, ours: str) -> str:
    if not isinstance(theirs, str):
        return "checkpoint has no configuration"
    a, b = msgspec.json.decode(theirs), msgspec.json.decode(ours)
    diffs: list[str] = []

    def walk(x: Any, y: Any, prefix: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), f"{prefix}.{k}")
        elif x != y:
            diffs.append(f"{prefix}: checkpoint {x!r} vs now {y!r}")

    walk(a, b, "$")
    return "; ".join(diffs[:5]) or "unknown"
