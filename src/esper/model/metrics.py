"""Per-seed measurements: accuracy progress, counterfactual contribution, gradients.

Accuracies and contributions are in percent / percentage points. "Not measured" is NaN,
never 0, so a gate can tell "measured zero" from "never measured".

Gradient numbers arrive once per epoch as plain floats (the trainer transfers them with
its other per-step values), so nothing here touches a device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

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


@dataclass
class SeedMetrics:
    """What the gates, features and rewards measure about one seed."""

    acc_at_germination: float = NAN
    acc_at_stage_start: float = NAN
    last_acc: float = NAN
    contribution: float = NAN
    contribution_velocity: float = 0.0
    epochs_since_contribution: int = -1
    seed_grad_norm: float = NAN
    grad_norm_ratio: float = NAN
    grad_health: float = NAN

    @property
    def improvement(self) -> float:
        """Accuracy gained (pp) since the current stage started."""
        return self.last_acc - self.acc_at_stage_start

    @property
    def contribution_measured(self) -> bool:
        return math.isfinite(self.contribution)

    def start(self, acc: float) -> None:
        """A new seed: forget everything about the previous one."""
        fresh = SeedMetrics(acc_at_germination=acc, acc_at_stage_start=acc, last_acc=acc)
        self.__dict__.update(fresh.__dict__)

    def on_stage_start(self) -> None:
        self.acc_at_stage_start = self.last_acc

    def observe_acc(self, acc: float) -> None:
        self.last_acc = acc

    def record_contribution(self, contribution_pp: float) -> None:
        prev = self.contribution
        self.contribution_velocity = (
            contribution_pp - prev
            if math.isfinite(prev) and math.isfinite(contribution_pp)
            else 0.0
        )
        self.contribution = contribution_pp
        self.epochs_since_contribution = 0

    def record_gradients(
        self, seed_norm: float, n_seed: int, host_norm: float, n_host: int
    ) -> None:
        self.seed_grad_norm = seed_norm
        self.grad_health = gradient_health(seed_norm, n_seed)
        self.grad_norm_ratio = gradient_ratio(seed_norm, n_seed, host_norm, n_host)

    def tick(self) -> None:
        if self.epochs_since_contribution >= 0:
            self.epochs_since_contribution += 1
