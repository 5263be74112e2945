"""Checkpoints: policy, optimizer, normalisers, RNG, round index, config, telemetry seq.

Written atomically (temp file in the same directory, fsync, rename) and loaded with
``torch.load(weights_only=True)``, so a crafted file carrying pickled objects is
rejected. Everything stored is tensors, numbers, strings, lists and dicts.

The state is serialised once, and the file holds those bytes with their SHA-256:
torch's zip reader does not verify tensor data, so without the digest a flipped byte in
a weight would load silently and resume a different run.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import pickle
import re
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import torch

from esper.config import Config, config_from_dict, with_overrides
from esper.errors import CheckpointError, CheckpointSaveError, ConfigError

CHECKPOINT_FORMAT = 2
#: Format 1 (no digest) files from earlier versions still load, unverified.
_LEGACY_FORMAT = 1
#: Entries :func:`esper.training.run.train` reads, with their types.
_REQUIRED: dict[str, type] = {
    "run_id": str,
    "next_round": int,
    "seq_position": int,
    "learner": dict,
}
#: The line of torch's refusal that names the offending global, without the advice to
#: retry with ``weights_only=False`` (which would execute the payload).
_UNPICKLER_REASON = re.compile(r"WeightsUnpickler error: ([^\n]*?)(?: was not an allowed|\.?\n|$)")


def compat_fingerprint(cfg: Config) -> str:
    """What must match for a resume: everything but run length, ids, devices, how the
    envs are executed (batched or not: equal up to float summation order) and output."""
    data = msgspec.to_builtins(cfg)
    for key in (
        "rounds", "run_id", "device", "env_devices", "checkpoint_every", "torch_threads",
        "batch_envs",
    ):  # fmt: skip
        data["run"].pop(key, None)
    data.pop("telemetry", None)
    return msgspec.json.encode(data, order="sorted").decode()


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> int:
    """Atomically write ``state`` to ``path``; returns the size in bytes.

    The file is serialised in memory and written with plain OS writes, so a full disk or
    a permission problem is a :class:`CheckpointSaveError` naming the path and the cause
    (not torch's opaque ``enforce fail``), and the previous checkpoint stays untouched.
    """
    target = Path(path)
    inner = io.BytesIO()
    torch.save(state, inner)
    raw = inner.getvalue()
    payload = {
        "format": CHECKPOINT_FORMAT,
        "sha256": hashlib.sha256(raw).hexdigest(),
        "state": torch.frombuffer(bytearray(raw), dtype=torch.uint8),
    }
    outer = io.BytesIO()
    torch.save(payload, outer)
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(outer.getbuffer())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise CheckpointSaveError(_save_failure(target, exc)) from exc
    finally:
        if tmp is not None:  # a failed write leaves no temporary file behind
            Path(tmp).unlink(missing_ok=True)
    return target.stat().st_size


def _save_failure(target: Path, exc: OSError) -> str:
    cause = "no space left on device" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
    kept = "the previous one is unchanged" if target.is_file() else "none was written"
    return f"cannot save the checkpoint {target}: {cause} ({kept})"


def load_checkpoint(path: str | Path, cfg: Config) -> dict[str, Any]:
    """Load safely; reject unsafe, corrupt or incompatible checkpoints with a clear error."""
    p = Path(path)
    state = read_checkpoint(p)
    missing = [k for k, t in _REQUIRED.items() if not isinstance(state.get(k), t)]
    if missing:
        raise CheckpointError(f"{p}: incomplete checkpoint (missing or bad: {', '.join(missing)})")
    theirs = state.get("compat")
    ours = compat_fingerprint(cfg)
    if theirs != ours:
        raise CheckpointError(
            f"{p}: checkpoint was written for another configuration; "
            f"differences: {_config_diff(theirs, ours)}"
        )
    return state


def checkpoint_config(path: str | Path) -> Config:
    """The configuration a checkpoint was written with: ``--resume`` without ``--config``.

    A checkpoint inside its run directory (``<dir>/<run id>/checkpoint.pt``) also says
    where the run's telemetry lives, wherever the original command was run from.
    """
    p = Path(path)
    raw = read_checkpoint(p).get("config")
    if not isinstance(raw, str):
        raise CheckpointError(f"{p}: the checkpoint stores no configuration; pass --config FILE")
    try:
        data = msgspec.json.decode(raw)
        cfg = config_from_dict(data, source=f"{p} (stored configuration)")
    except (msgspec.DecodeError, ConfigError) as exc:
        raise CheckpointError(
            f"{p}: the stored configuration does not load here ({exc}); pass --config FILE"
        ) from None
    if cfg.run.run_id and p.parent.name == cfg.run.run_id:
        cfg = with_overrides(cfg, {"telemetry.dir": str(p.parent.parent)})
    return cfg


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The verified state of a checkpoint, whatever configuration wrote it."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"checkpoint not found: {p}")
    return _unwrap(p, _safe_load(p, p))


def _unwrap(p: Path, outer: Any) -> dict[str, Any]:
    """The state inside a verified envelope (or a legacy format-1 file's own dict)."""
    if not isinstance(outer, dict) or outer.get("format") not in (
        CHECKPOINT_FORMAT,
        _LEGACY_FORMAT,
    ):
        raise CheckpointError(f"{p}: not an Esper checkpoint (format {CHECKPOINT_FORMAT})")
    if outer["format"] == _LEGACY_FORMAT:
        return outer
    blob, digest = outer.get("state"), outer.get("sha256")
    if (
        not isinstance(blob, torch.Tensor)
        or blob.dtype != torch.uint8
        or not isinstance(digest, str)
    ):
        raise CheckpointError(f"{p}: corrupt checkpoint: the envelope lacks its state or digest")
    raw = blob.numpy().tobytes()
    if hashlib.sha256(raw).hexdigest() != digest:
        raise CheckpointError(f"{p}: corrupt checkpoint: SHA-256 of the state does not match")
    state = _safe_load(io.BytesIO(raw), p)
    if not isinstance(state, dict):
        raise CheckpointError(f"{p}: corrupt checkpoint: the state is not a mapping")
    return state


def _safe_load(source: Path | io.BytesIO, p: Path) -> Any:
    """``torch.load(weights_only=True)`` with every failure turned into a CheckpointError."""
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{p}: refused to load ({_unpickler_reason(exc)}): checkpoints are loaded with "
            "weights_only=True and may only hold tensors and plain data; this file carries "
            "pickled Python objects or is corrupt"
        ) from None
    except Exception as exc:  # torch's zip/pickle readers fail in many ways on bad bytes
        raise CheckpointError(
            f"{p}: corrupt or truncated checkpoint: {type(exc).__name__}: {exc}"
        ) from None


def _unpickler_reason(exc: Exception) -> str:
    """The specific refusal from torch's long message (which also advises unsafe loading)."""
    match = _UNPICKLER_REASON.search(str(exc))
    return match.group(1).strip() if match else type(exc).__name__


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
