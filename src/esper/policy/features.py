"""Observation features for all envs at once: base signals plus per-slot seed state.

Everything the features read (slot reports, tracker histories, last actions) is already
on the host, so the whole [N, OBS_DIM] matrix is assembled in numpy and moved to the
policy device in one transfer, with no device synchronisation. Unknown measurements
(NaN in the reports) become 0; whether a measurement exists is its own flag feature.
Blueprints are not one-hot encoded here: their ids go to a learned embedding in the
network (0 means "no seed"). With a host family (``hosts`` given) the host's descriptors
follow: its size and depth, and per slot its width, place and relative seed cost, so
one policy can grow each member differently.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np
import torch
from torch import Tensor

from esper.core.constants import (
    ACC_PERCENT_SCALE,
    ALL_BLUEPRINTS,
    G2_MIN_GRADIENT_HEALTH,
    OBS_HISTORY_LEN,
    PLATEAU_FEATURE_CAP,
    TEMPOS,
)
from esper.core.enums import AlphaMode, BlendOp, LifecycleOp, SeedStage
from esper.core.host_family import HostDescriptor, slot_cost
from esper.core.records import SlotReport
from esper.policy.signals import SignalTracker

STAGES: Final = tuple(SeedStage)
ALPHA_MODES: Final = tuple(AlphaMode)
BLEND_OPS: Final = tuple(BlendOp)
ACTIVE_STAGES: Final = (
    SeedStage.GERMINATED,
    SeedStage.TRAINING,
    SeedStage.BLENDING,
    SeedStage.HOLDING,
    SeedStage.FOSSILIZED,
)
#: Embedding vocabulary: 0 is "no seed", 1 + i is ALL_BLUEPRINTS[i].
BLUEPRINT_VOCAB: Final = len(ALL_BLUEPRINTS) + 1
_BLUEPRINT_ID: Final = {name: i + 1 for i, name in enumerate(ALL_BLUEPRINTS)}
_STAGE_CODE: Final = {s: i for i, s in enumerate(STAGES)}
_MODE_CODE: Final = {m: i for i, m in enumerate(ALPHA_MODES)}
_BLEND_CODE: Final = {b: i for i, b in enumerate(BLEND_OPS)}
_MAX_TEMPO: Final = float(max(TEMPOS))

#: (name, width) of each base feature, in column order.
BASE_LAYOUT: Final[tuple[tuple[str, int], ...]] = (
    ("epoch_frac", 1),
    ("val_loss_symlog", 1),
    ("val_acc", 1),
    ("loss_history_symlog", OBS_HISTORY_LEN),
    ("acc_history", OBS_HISTORY_LEN),
    ("stage_fraction", len(STAGES)),
    ("last_success", 1),
    ("last_op", len(LifecycleOp)),
    ("plateau", 1),
    ("host_stabilised", 1),
)
#: (name, width) of each per-slot feature, in column order (repeated for every slot).
SLOT_LAYOUT: Final[tuple[tuple[str, int], ...]] = (
    ("active", 1),
    ("stage", len(STAGES)),
    ("alpha", 1),
    ("contribution_symlog", 1),
    ("contribution_velocity_symlog", 1),
    ("improvement_symlog", 1),
    ("tempo", 1),
    ("alpha_target", 1),
    ("alpha_mode", len(ALPHA_MODES)),
    ("alpha_progress", 1),
    ("alpha_velocity", 1),
    ("blend_op", len(BLEND_OPS)),
    ("grad_ratio_symlog", 1),
    ("grad_health", 1),
    ("grad_measured", 1),
    ("grad_unhealthy", 1),
    ("epochs_in_stage", 1),
    ("counterfactual_freshness", 1),
    ("age", 1),
    ("scheduled_prune", 1),
)
#: With a host family: (name, width) of the host's features, after the per-slot ones ...
HOST_LAYOUT: Final[tuple[tuple[str, int], ...]] = (("host_params_log", 1), ("host_depth", 1))
#: ... then these for every slot (:class:`esper.core.host_family.SlotDescriptor`).
SLOT_HOST_LAYOUT: Final[tuple[tuple[str, int], ...]] = (
    ("slot_width_log", 1),
    ("slot_position", 1),
    ("slot_cost", 1),
)
BASE_DIM: Final = sum(w for _, w in BASE_LAYOUT)
SLOT_DIM: Final = sum(w for _, w in SLOT_LAYOUT)
HOST_DIM: Final = sum(w for _, w in HOST_LAYOUT)
SLOT_HOST_DIM: Final = sum(w for _, w in SLOT_HOST_LAYOUT)
#: Scales that bring the host descriptors near [0, 1] for the digits-sized hosts: log10
#: of the parameters, blocks, log2 of a slot's channels.
HOST_PARAMS_LOG_SCALE: Final = 5.0
HOST_DEPTH_SCALE: Final = 4.0
SLOT_WIDTH_LOG_SCALE: Final = 6.0

# Column order of the raw per-slot matrix extracted from the reports.
_RAW_FIELDS: Final = (
    "stage",
    "alpha",
    "contribution",
    "contribution_velocity",
    "improvement",
    "tempo",
    "alpha_target",
    "alpha_mode",
    "alpha_steps_done",
    "alpha_steps_total",
    "alpha_velocity",
    "blend_op",
    "grad_norm_ratio",
    "grad_health",
    "epochs_in_stage",
    "epochs_since_contribution",
    "age_epochs",
    "scheduled_prune",
    "blueprint",
)
_R: Final = {name: i for i, name in enumerate(_RAW_FIELDS)}


def obs_dim(n_slots: int, *, host_features: bool = False) -> int:
    """Observation width: ``BASE_DIM + n_slots * SLOT_DIM``, plus ``HOST_DIM + n_slots *
    SLOT_HOST_DIM`` with the host descriptors (a host family)."""
    extra = HOST_DIM + n_slots * SLOT_HOST_DIM if host_features else 0
    return BASE_DIM + n_slots * SLOT_DIM + extra


def host_features(hosts: Sequence[HostDescriptor], slot_order: Sequence[str]) -> np.ndarray:
    """[N, HOST_DIM + S * SLOT_HOST_DIM]: each env's host size, depth and per slot its
    width, place and the relative cost of a convolution there."""
    rows = []
    for host in hosts:
        by_id = {d.slot_id: d for d in host.slots}
        if set(by_id) != set(slot_order):
            raise ValueError(
                f"host {host.name!r} describes slots {sorted(by_id)}, not {slot_order}"
            )
        row = [
            math.log10(max(host.params, 1)) / HOST_PARAMS_LOG_SCALE,
            host.depth / HOST_DEPTH_SCALE,
        ]
        for slot_id in slot_order:
            d = by_id[slot_id]
            row += [
                math.log2(max(d.width, 1)) / SLOT_WIDTH_LOG_SCALE,
                d.position,
                slot_cost(d.width, host.params),
            ]
        rows.append(row)
    return np.array(rows, dtype=np.float64).reshape(len(hosts), -1)


def symlog(x: np.ndarray) -> np.ndarray:
    """Sign-preserving log compression: keeps small values linear, tames large ones."""
    out: np.ndarray = np.sign(x) * np.log1p(np.abs(x))
    return out


def _one_hot(codes: np.ndarray, width: int) -> np.ndarray:
    return np.asarray(np.eye(width, dtype=np.float64)[codes])


def _raw_slot_matrix(reports: Sequence[Sequence[SlotReport]]) -> np.ndarray:
    """[N, S, len(_RAW_FIELDS)] float64 numbers read straight from the reports."""
    n, s = len(reports), len(reports[0])
    rows = [
        (
            _STAGE_CODE[r.stage],
            r.alpha,
            r.contribution,
            r.contribution_velocity,
            r.improvement,
            r.tempo,
            r.alpha_target,
            _MODE_CODE[r.alpha_mode],
            r.alpha_steps_done,
            r.alpha_steps_total,
            r.alpha_velocity,
            _BLEND_CODE[r.blend_op],
            r.grad_norm_ratio,
            r.grad_health,
            r.epochs_in_stage,
            r.epochs_since_contribution,
            r.age_epochs,
            r.scheduled_prune,
            _BLUEPRINT_ID.get(r.blueprint, 0),
        )
        for env in reports
        for r in env
    ]
    return np.array(rows, dtype=np.float64).reshape(n, s, len(_RAW_FIELDS))


def _slot_features(raw: np.ndarray, max_epochs: int) -> np.ndarray:
    """[N, S, SLOT_DIM] from the raw report matrix (vectorised over envs and slots)."""
    stage = raw[..., _R["stage"]].astype(np.int64)
    active = np.isin(stage, [_STAGE_CODE[s] for s in ACTIVE_STAGES]).astype(np.float64)
    total = raw[..., _R["alpha_steps_total"]]
    progress = np.where(total > 0, raw[..., _R["alpha_steps_done"]] / np.maximum(total, 1), 0.0)
    health = raw[..., _R["grad_health"]]
    measured = np.isfinite(health)
    since = raw[..., _R["epochs_since_contribution"]]
    freshness = np.where(since >= 0, 1.0 / (1.0 + np.maximum(since, 0.0)), 0.0)
    horizon = float(max(max_epochs, 1))
    col = raw[..., None, :]  # [N, S, 1, F] so each piece below is [N, S, width]
    pieces = [
        active[..., None],
        _one_hot(stage, len(STAGES)),
        col[..., _R["alpha"]],
        symlog(col[..., _R["contribution"]]),
        symlog(col[..., _R["contribution_velocity"]]),
        symlog(col[..., _R["improvement"]]),
        col[..., _R["tempo"]] / _MAX_TEMPO,
        col[..., _R["alpha_target"]],
        _one_hot(raw[..., _R["alpha_mode"]].astype(np.int64), len(ALPHA_MODES)),
        progress[..., None],
        col[..., _R["alpha_velocity"]],
        _one_hot(raw[..., _R["blend_op"]].astype(np.int64), len(BLEND_OPS)) * active[..., None],
        symlog(col[..., _R["grad_norm_ratio"]]),
        health[..., None],
        measured[..., None].astype(np.float64),
        (measured & (np.nan_to_num(health) < G2_MIN_GRADIENT_HEALTH))[..., None].astype(np.float64),
        col[..., _R["epochs_in_stage"]] / horizon,
        freshness[..., None],
        col[..., _R["age_epochs"]] / horizon,
        col[..., _R["scheduled_prune"]],
    ]
    return np.concatenate(pieces, axis=-1)


def _padded_history(values: Sequence[float], length: int) -> list[float]:
    """The last ``length`` values, oldest first, front-padded with the oldest known one."""
    hist = list(values)[-length:]
    if not hist:
        return [0.0] * length
    return [hist[0]] * (length - len(hist)) + hist


def _base_features(
    trackers: Sequence[SignalTracker],
    stage: np.ndarray,
    epoch: int,
    max_epochs: int,
    last_ops: Sequence[int],
    last_success: Sequence[bool],
) -> np.ndarray:
    """[N, BASE_DIM] from the trackers, slot stages and last actions."""
    n = len(trackers)
    loss_hist = np.array(
        [_padded_history(t.loss_history, OBS_HISTORY_LEN) for t in trackers], dtype=np.float64
    )
    acc_hist = np.array(
        [_padded_history(t.acc_history, OBS_HISTORY_LEN) for t in trackers], dtype=np.float64
    )
    signals = np.array(
        [(t.last_loss, t.last_acc, t.plateau_count, t.host_stabilised) for t in trackers],
        dtype=np.float64,
    ).reshape(n, 4)
    ops = np.array([int(o) for o in last_ops], dtype=np.int64)
    pieces = [
        np.full((n, 1), epoch / max(max_epochs, 1)),
        symlog(signals[:, 0:1]),
        signals[:, 1:2] / ACC_PERCENT_SCALE,
        symlog(loss_hist),
        acc_hist / ACC_PERCENT_SCALE,
        _one_hot(stage, len(STAGES)).mean(axis=1),
        np.array(last_success, dtype=np.float64).reshape(n, 1),
        _one_hot(ops, len(LifecycleOp)),
        np.minimum(signals[:, 2:3], PLATEAU_FEATURE_CAP) / PLATEAU_FEATURE_CAP,
        signals[:, 3:4],
    ]
    return np.concatenate(pieces, axis=1)


def build_features(
    *,
    trackers: Sequence[SignalTracker],
    reports: Sequence[Sequence[SlotReport]],
    epoch: int,
    max_epochs: int,
    last_ops: Sequence[int],
    last_success: Sequence[bool],
    device: torch.device | str,
    hosts: Sequence[HostDescriptor] | None = None,
) -> tuple[Tensor, Tensor]:
    """(obs [N, obs_dim(S)] float32, blueprint_ids [N, S] long), one transfer each.

    Every env must list its slots in the same order (the action space's slot order).
    ``hosts`` (a host family): every env's host descriptor, appended as
    :data:`HOST_LAYOUT` and :data:`SLOT_HOST_LAYOUT` columns.
    """
    n = len(reports)
    if not (n == len(trackers) == len(last_ops) == len(last_success)) or n == 0:
        raise ValueError("trackers, reports, last_ops and last_success must be non-empty and align")
    slot_order = tuple(r.slot_id for r in reports[0])
    if any(tuple(r.slot_id for r in env) != slot_order for env in reports):
        raise ValueError("every env must report the same slots in the same order")
    raw = _raw_slot_matrix(reports)
    stage = raw[..., _R["stage"]].astype(np.int64)
    base = _base_features(trackers, stage, epoch, max_epochs, last_ops, last_success)
    slots = _slot_features(raw, max_epochs).reshape(n, -1)
    parts = [base, slots]
    if hosts is not None:
        if len(hosts) != n:
            raise ValueError(f"{len(hosts)} host descriptors for {n} envs")
        parts.append(host_features(hosts, slot_order))
    obs = np.nan_to_num(np.concatenate(parts, axis=1), nan=0.0, posinf=0.0, neginf=0.0)
    active = np.isin(stage, [_STAGE_CODE[s] for s in ACTIVE_STAGES])
    bp_ids = np.where(active, raw[..., _R["blueprint"]], 0).astype(np.int64)
    return (
        torch.from_numpy(obs.astype(np.float32)).to(device, non_blocking=True),
        torch.from_numpy(bp_ids).to(device, non_blocking=True),
    )
