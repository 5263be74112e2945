"""Observation features for all envs at once: base signals plus per-slot seed state.

Everything the features read (the round's slot table and signals, last actions) is
already on the host, so the whole [N, OBS_DIM] matrix is assembled in numpy, for all
envs at once, and moved to the policy device in one transfer, with no device
synchronisation. Unknown measurements
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
from esper.model.reports import columns_of_reports, report_columns
from esper.model.slot_table import STAGE_CODE, SlotTable, code_set
from esper.policy.signals import Signals, SignalTracker

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
_ACTIVE_CODES: Final = code_set(ACTIVE_STAGES, STAGE_CODE)
_MAX_TEMPO: Final = float(max(TEMPOS))
#: The slot columns that enter the features as they are (as float64, one per feature).
_AS_FLOAT: Final = (
    "alpha", "contribution", "contribution_velocity", "improvement", "tempo", "alpha_target",
    "alpha_velocity", "grad_norm_ratio", "epochs_in_stage", "age_epochs", "scheduled_prune",
)  # fmt: skip

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


#: What the features read of the slots: a round's table, or reports ``[N][S]``.
SlotSource = SlotTable | Sequence[Sequence[SlotReport]]
#: What they read of the envs' signals: a round's table, or one tracker per env.
SignalSource = Signals | Sequence[SignalTracker]


def slot_columns(slots: SlotSource) -> dict[str, np.ndarray]:
    """The reported slot fields as ``[N, S]`` arrays (:func:`report_columns`)."""
    if isinstance(slots, SlotTable):
        return report_columns(slots)
    return columns_of_reports(slots)


def _slot_features(c: dict[str, np.ndarray], max_epochs: int) -> np.ndarray:
    """[N, S, SLOT_DIM] from the slot columns (vectorised over envs and slots)."""
    stage = c["stage"]
    active = _ACTIVE_CODES[stage].astype(np.float64)
    total = c["alpha_steps_total"].astype(np.float64)
    done = c["alpha_steps_done"].astype(np.float64)
    progress = np.where(total > 0, done / np.maximum(total, 1), 0.0)
    health = c["grad_health"]
    measured = np.isfinite(health)
    since = c["epochs_since_contribution"].astype(np.float64)
    freshness = np.where(since >= 0, 1.0 / (1.0 + np.maximum(since, 0.0)), 0.0)
    horizon = float(max(max_epochs, 1))
    col = {name: np.asarray(c[name], dtype=np.float64)[..., None] for name in _AS_FLOAT}
    pieces = [
        active[..., None],
        _one_hot(stage, len(STAGES)),
        col["alpha"],
        symlog(col["contribution"]),
        symlog(col["contribution_velocity"]),
        symlog(col["improvement"]),
        col["tempo"] / _MAX_TEMPO,
        col["alpha_target"],
        _one_hot(c["alpha_mode"], len(ALPHA_MODES)),
        progress[..., None],
        col["alpha_velocity"],
        _one_hot(c["blend_op"], len(BLEND_OPS)) * active[..., None],
        symlog(col["grad_norm_ratio"]),
        health[..., None],
        measured[..., None].astype(np.float64),
        (measured & (np.nan_to_num(health) < G2_MIN_GRADIENT_HEALTH))[..., None].astype(np.float64),
        col["epochs_in_stage"] / horizon,
        freshness[..., None],
        col["age_epochs"] / horizon,
        col["scheduled_prune"],
    ]
    return np.concatenate(pieces, axis=-1)


def signal_table(trackers: SignalSource) -> Signals:
    """The signals as one table (trackers' rows gathered into a new one)."""
    if isinstance(trackers, Signals):
        return trackers
    first = trackers[0].table
    out = Signals(
        len(trackers),
        history_len=first.history_len,
        plateau_gain_pp=first.plateau_gain_pp,
        stabilise_gain_pp=first.stabilise_gain_pp,
        stabilise_epochs=first.stabilise_epochs,
    )
    for i, t in enumerate(trackers):
        out.copy_row(t.table, t.row, i)
    return out


def _base_features(
    signals: Signals,
    stage: np.ndarray,
    epoch: int,
    max_epochs: int,
    last_ops: np.ndarray,
    last_success: np.ndarray,
) -> np.ndarray:
    """[N, BASE_DIM] from the signals, slot stages and last actions."""
    n = len(stage)
    pieces = [
        np.full((n, 1), epoch / max(max_epochs, 1)),
        symlog(signals.last_loss[:, None]),
        signals.last_acc[:, None] / ACC_PERCENT_SCALE,
        symlog(signals.padded(signals.loss_history)),
        signals.padded(signals.acc_history) / ACC_PERCENT_SCALE,
        _one_hot(stage, len(STAGES)).mean(axis=1),
        np.asarray(last_success, dtype=np.float64).reshape(n, 1),
        _one_hot(np.asarray(last_ops, dtype=np.int64), len(LifecycleOp)),
        np.minimum(signals.plateau_count[:, None], PLATEAU_FEATURE_CAP) / PLATEAU_FEATURE_CAP,
        signals.host_stabilised[:, None].astype(np.float64),
    ]
    return np.concatenate(pieces, axis=1)


def build_features(
    *,
    trackers: SignalSource,
    reports: SlotSource,
    epoch: int,
    max_epochs: int,
    last_ops: Sequence[int] | np.ndarray,
    last_success: Sequence[bool] | np.ndarray,
    device: torch.device | str,
    hosts: Sequence[HostDescriptor] | np.ndarray | None = None,
    slot_order: Sequence[str] | None = None,
) -> tuple[Tensor, Tensor]:
    """(obs [N, obs_dim(S)] float32, blueprint_ids [N, S] long), one transfer each.

    ``reports`` and ``trackers``: a round's tables, or per env its reports (every env
    listing its slots in the same order) and tracker. ``hosts`` (a host family): every
    env's host descriptor (or their :func:`host_features`, computed once per round),
    appended as :data:`HOST_LAYOUT` and :data:`SLOT_HOST_LAYOUT` columns; descriptors
    need ``slot_order`` with a table.
    """
    if not isinstance(reports, SlotTable):
        if not reports:
            raise ValueError("reports must be non-empty")
        slot_order = tuple(r.slot_id for r in reports[0])
        if any(tuple(r.slot_id for r in env) != slot_order for env in reports):
            raise ValueError("every env must report the same slots in the same order")
    c = slot_columns(reports)
    signals = signal_table(trackers)
    n = c["stage"].shape[0]
    if not (n == len(signals.count) == len(last_ops) == len(last_success)) or n == 0:
        raise ValueError("trackers, reports, last_ops and last_success must be non-empty and align")
    stage = c["stage"]
    base = _base_features(
        signals, stage, epoch, max_epochs, np.asarray(last_ops), np.asarray(last_success)
    )
    slots = _slot_features(c, max_epochs).reshape(n, -1)
    parts = [base, slots]
    if hosts is not None:
        if len(hosts) != n:
            raise ValueError(f"{len(hosts)} host descriptors for {n} envs")
        if not isinstance(hosts, np.ndarray):
            if slot_order is None:
                raise ValueError("host descriptors need the slot order")
            hosts = host_features(hosts, slot_order)
        parts.append(hosts)
    obs = np.nan_to_num(np.concatenate(parts, axis=1), nan=0.0, posinf=0.0, neginf=0.0)
    known = c["blueprint_id"] < BLUEPRINT_VOCAB  # a custom registry's blueprint: "no seed"
    bp_ids = np.where(_ACTIVE_CODES[stage] & known, c["blueprint_id"], 0)
    return (
        torch.from_numpy(obs.astype(np.float32)).to(device, non_blocking=True),
        torch.from_numpy(bp_ids.astype(np.int64)).to(device, non_blocking=True),
    )
