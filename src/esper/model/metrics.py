"""Per-seed measurements: accuracy progress, counterfactual contribution, gradients.

Accuracies and contributions are in percent / percentage points. "Not measured" is NaN,
never 0, so a gate can tell "measured zero" from "never measured".

Gradient numbers arrive once per epoch as plain floats (the trainer transfers them with
its other per-step values), so nothing here touches a device.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np

from esper.model.slot_table import (
    METRICS_COLUMNS,
    Cell,
    SlotTable,
    float_column,
    int_column,
)

NAN = math.nan

#: Per-parameter RMS gradient below which a seed counts as starving (health ramps to 0).
GRAD_VANISHING_RMS = 1e-7
#: Per-parameter RMS gradient above which a seed counts as exploding (health decays).
GRAD_EXPLODING_RMS = 1.0


class ParamCounts(msgspec.Struct, frozen=True):
    """Host parameters, parameters of all live seeds, and alpha-weighted effective total.

    ``effective`` = host + sum(alpha_i * params_i) over seeds whose output is blended in:
    what the model's output actually depends on, which is what compute rent charges for.
    """

    host: int
    seeds: int
    effective: int


def rms(norm: float, n_params: int) -> float:
    """Root-mean-square per parameter of a gradient with L2 norm ``norm``."""
    return norm / math.sqrt(n_params) if n_params > 0 else NAN


def gradient_health(seed_norm: float, n_params: int) -> float:
    """Score in [0, 1]: 1 for a usable gradient, towards 0 as it vanishes or explodes.

    Judged on the per-parameter RMS so that a large and a small seed are comparable.
    A non-finite or missing gradient scores 0.
    """
    r = rms(seed_norm, n_params)
    if not math.isfinite(r) or r <= 0.0:
        return 0.0
    vanishing = min(1.0, r / GRAD_VANISHING_RMS)
    exploding = min(1.0, GRAD_EXPLODING_RMS / r)
    return min(vanishing, exploding)


def gradient_ratio(seed_norm: float, n_seed: int, host_norm: float, n_host: int) -> float:
    """Seed-to-host ratio of per-parameter RMS gradients (NaN if the host has none)."""
    host_rms = rms(host_norm, n_host)
    seed_rms = rms(seed_norm, n_seed)
    if not (math.isfinite(host_rms) and math.isfinite(seed_rms)) or host_rms <= 0.0:
        return NAN
    return seed_rms / host_rms


class SeedMetrics(Cell):
    """What the gates, features and rewards measure about one seed (a view of one cell
    of a :class:`~esper.model.slot_table.SlotTable`)."""

    __slots__ = ()

    acc_at_germination = float_column("acc_at_germination")
    acc_at_stage_start = float_column("acc_at_stage_start")
    last_acc = float_column("last_acc")
    contribution = float_column("contribution")
    contribution_velocity = float_column("contribution_velocity")
    epochs_since_contribution = int_column("epochs_since_contribution")
    seed_grad_norm = float_column("seed_grad_norm")
    grad_norm_ratio = float_column("grad_norm_ratio")
    grad_health = float_column("grad_health")

    @property
    def improvement(self) -> float:
        """Accuracy gained (pp) since the current stage started."""
        return self.last_acc - self.acc_at_stage_start

    @property
    def contribution_measured(self) -> bool:
        return math.isfinite(self.contribution)

    def reset(self) -> None:
        """Nothing measured (a free slot)."""
        self.table.reset(METRICS_COLUMNS, self.row, self.col)

    def start(self, acc: float) -> None:
        """A new seed: forget everything about the previous one."""
        self.reset()
        self.acc_at_germination = self.acc_at_stage_start = self.last_acc = acc

    def on_stage_start(self) -> None:
        self.acc_at_stage_start = self.last_acc

    def observe_acc(self, acc: float) -> None:
        self.last_acc = acc

    def record_contribution(self, contribution_pp: float) -> None:
        record_contributions(self.table, (self.row, self.col), np.array(contribution_pp))

    def record_gradients(
        self, seed_norm: float, n_seed: int, host_norm: float, n_host: int
    ) -> None:
        self.seed_grad_norm = seed_norm
        self.grad_health = gradient_health(seed_norm, n_seed)
        self.grad_norm_ratio = gradient_ratio(seed_norm, n_seed, host_norm, n_host)

    def tick(self) -> None:
        since = self.epochs_since_contribution
        if since >= 0:
            self.epochs_since_contribution = since + 1


def record_contributions(t: SlotTable, where: Any, values: np.ndarray) -> None:
    """:meth:`SeedMetrics.record_contribution` at every cell of ``where``."""
    prev = t.contribution[where]
    both = np.isfinite(prev) & np.isfinite(values)
    t.contribution_velocity[where] = np.where(both, values - prev, 0.0)
    t.contribution[where] = values
    t.epochs_since_contribution[where] = 0


def record_gradients(
    t: SlotTable, where: Any, seed_norm: np.ndarray, host_norm: np.ndarray, n_host: np.ndarray
) -> None:
    """:meth:`SeedMetrics.record_gradients` at every cell of ``where`` (float64 norms;
    the same arithmetic as :func:`gradient_health` and :func:`gradient_ratio`)."""
    n_seed = t.n_params[where]
    with np.errstate(divide="ignore", invalid="ignore"):
        seed_rms = np.where(n_seed > 0, seed_norm / np.sqrt(np.maximum(n_seed, 1)), NAN)
        host_rms = np.where(n_host > 0, host_norm / np.sqrt(np.maximum(n_host, 1)), NAN)
        usable = np.isfinite(seed_rms) & (seed_rms > 0.0)
        vanishing = np.minimum(1.0, seed_rms / GRAD_VANISHING_RMS)
        exploding = np.minimum(1.0, GRAD_EXPLODING_RMS / seed_rms)
        health = np.where(usable, np.minimum(vanishing, exploding), 0.0)
        ok = np.isfinite(host_rms) & np.isfinite(seed_rms) & (host_rms > 0.0)
        ratio = np.where(ok, seed_rms / host_rms, NAN)
    t.seed_grad_norm[where] = seed_norm
    t.grad_health[where] = health
    t.grad_norm_ratio[where] = ratio
