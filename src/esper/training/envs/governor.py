"""Per-env safety net: snapshot a known-good host, detect collapse, roll back.

The governor only decides and restores; the trainer owns the buffer and the events.
It talks to the model through :class:`GovernedModel`, so it works with any model that
can snapshot, restore and prune (tests use a tiny fake).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from torch import Tensor

from esper.config import GovernorConfig
from esper.core.enums import Initiator, PruneReason, RollbackReason
from esper.telemetry.events import GovernorRollback


def penalized_step(panic_step: int) -> int:
    """The one rule of where a rollback's penalty lands, for the buffer, the events and
    the episode alike: the decision that led into the failed epoch (a panic found after
    epoch ``p`` blames transition ``p - 1``), or the first decision when the panic came
    before any (``p == 0``)."""
    return max(panic_step - 1, 0)


class Restorable(Protocol):
    """A snapshot kept outside the model's own ``snapshot_state`` (a batched store's rows
    taken for many envs at once, one entry each): it puts entry ``entry`` back."""

    def restore(self, model: Any, entry: int) -> None: ...


Snapshot = dict[str, Tensor] | Restorable


class GovernedModel(Protocol):
    """What the governor needs from a model."""

    def snapshot_state(self) -> dict[str, Tensor]: ...

    def restore_state(self, state: dict[str, Tensor]) -> None: ...

    def prune_live_seeds(self, *, reason: PruneReason, initiator: Initiator) -> tuple[str, ...]: ...


class Guard:
    """The governor's watch over ``n`` envs: each env's recent healthy losses as one
    ``[n, history_window]`` array (oldest first, newest last) and its streak counters.

    :meth:`check` judges every env's loss at once. The statistics that decide a panic
    (a mean, a population standard deviation) are estimated with numpy, and only an env
    whose loss could panic (non-finite, inside the lobotomy band, or near the divergence
    bound) is judged again exactly, alone (``statistics.fmean`` and ``pstdev``, as a
    single env's governor): the verdicts and reported thresholds are exact, and the
    common case costs no Python per env.
    """

    def __init__(self, n: int, cfg: GovernorConfig, *, random_guess_loss: float) -> None:
        if not random_guess_loss > 0:
            raise ValueError(f"random_guess_loss must be positive, got {random_guess_loss}")
        self.cfg = cfg
        self.random_guess_loss = float(random_guess_loss)
        self.history = np.zeros((n, cfg.history_window))
        self.count = np.zeros(n, dtype=np.int64)
        self.divergent_run = np.zeros(n, dtype=np.int64)
        self.panicked = np.zeros(n, dtype=bool)
        self.has_snapshot = np.zeros(n, dtype=bool)
        self.snapshot_step = np.full(n, -1, dtype=np.int64)
        self.rollbacks = np.zeros(n, dtype=np.int64)
        #: Each env's snapshot (one object may serve many envs, each its ``entry``).
        self.snapshots = np.full(n, None, dtype=object)
        self.entry = np.zeros(n, dtype=np.int64)

    def keep(self, rows: np.ndarray, step: int, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` (taken at ``step``) for envs ``rows``: env ``rows[k]``
        falls back to its entry ``k`` (one object for all: no Python per env)."""
        one = np.empty(1, dtype=object)
        one[0] = snapshot  # broadcast as an object, never unpacked as a sequence
        self.snapshots[rows] = one
        self.entry[rows] = np.arange(len(rows))
        self.snapshot_step[rows] = step
        self.has_snapshot[rows] = True

    def losses(self, row: int) -> list[float]:
        """Env ``row``'s kept losses, oldest first."""
        values: list[float] = self.history[row, self.history.shape[1] - self.count[row] :].tolist()
        return values

    def _append(self, rows: np.ndarray, loss: np.ndarray) -> None:
        kept = self.history[rows]
        self.history[rows] = np.concatenate([kept[:, 1:], loss[:, None]], axis=1)
        self.count[rows] = np.minimum(self.count[rows] + 1, self.history.shape[1])

    def check(self, loss: np.ndarray) -> list[tuple[int, RollbackReason, float]]:
        """Judge every env's train loss; returns ``(env, reason, threshold)`` of the envs
        that call for a rollback (a :meth:`Governor.check` per env, all at once)."""
        if not self.cfg.enabled:
            return []
        cfg, rgl = self.cfg, self.random_guess_loss
        loss = np.asarray(loss, dtype=np.float64)
        finite = np.isfinite(loss)
        warm = self.count >= cfg.min_history
        in_band = np.abs(loss - rgl) <= cfg.lobotomy_tolerance * rgl
        window = self.history.shape[1]
        filled = np.arange(window)[None, :] >= window - self.count[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(filled, self.history, 0.0).sum(axis=1) / np.maximum(self.count, 1)
            var = np.where(filled, (self.history - mean[:, None]) ** 2, 0.0).sum(axis=1)
            sigma = np.sqrt(var / np.maximum(self.count, 1))
        bound = np.maximum(
            cfg.divergence_min_loss,
            np.maximum(mean + cfg.divergence_sigma * sigma, cfg.divergence_mean_factor * mean),
        )
        near = warm & (loss > bound * (1.0 - _BOUND_MARGIN))
        recent = filled & (np.arange(window)[None, :] >= window - cfg.lobotomy_recent)
        with np.errstate(invalid="ignore", divide="ignore"):
            recent_mean = np.where(recent, self.history, 0.0).sum(axis=1) / recent.sum(axis=1)
        was_low = recent_mean < cfg.lobotomy_below_fraction * rgl * (1.0 + _BOUND_MARGIN)
        exact = ~finite | (warm & in_band & was_low) | near
        calm = ~exact  # no panic, not above the bound: the streak ends, the loss is kept
        rows = np.nonzero(calm)[0]
        self.divergent_run[rows] = 0
        self.panicked[rows] = False
        self._append(rows, loss[rows])
        found = []
        for row in np.nonzero(exact)[0].tolist():
            verdict = self._check_one(row, float(loss[row]))
            if verdict is not None:
                found.append((row, *verdict))
        return found

    def _check_one(self, row: int, loss: float) -> tuple[RollbackReason, float] | None:
        verdict = self._verdict(row, loss)
        self.panicked[row] = verdict is not None
        if verdict is None and math.isfinite(loss) and self.divergent_run[row] == 0:
            self._append(np.array([row]), np.array([loss]))
        return verdict

    def _verdict(self, row: int, loss: float) -> tuple[RollbackReason, float] | None:
        if not math.isfinite(loss):
            return RollbackReason.NON_FINITE_LOSS, math.nan
        history = self.losses(row)
        lobotomy = self._lobotomy_threshold(history, loss)
        if lobotomy is not None:
            self.divergent_run[row] = 0
            return RollbackReason.LOBOTOMY, lobotomy
        threshold = self._divergence_threshold(history)
        if threshold is not None and loss > threshold:
            self.divergent_run[row] += 1
            if self.divergent_run[row] >= self.cfg.divergence_consecutive:
                self.divergent_run[row] = 0
                return RollbackReason.DIVERGENCE, threshold
        else:
            self.divergent_run[row] = 0
        return None

    def _lobotomy_threshold(self, history: list[float], loss: float) -> float | None:
        """Loss back at random guessing after having been well below it."""
        rgl = self.random_guess_loss
        if len(history) < self.cfg.min_history:
            return None
        recent = history[-self.cfg.lobotomy_recent :]
        if statistics.fmean(recent) >= self.cfg.lobotomy_below_fraction * rgl:
            return None
        band = self.cfg.lobotomy_tolerance * rgl
        if abs(loss - rgl) <= band:
            return rgl - band
        return None

    def _divergence_threshold(self, history: list[float]) -> float | None:
        """All three conditions at once: above the floor, mean + k sigma, and factor x mean."""
        if len(history) < self.cfg.min_history:
            return None
        mean = statistics.fmean(history)
        sigma = statistics.pstdev(history)
        return max(
            self.cfg.divergence_min_loss,
            mean + self.cfg.divergence_sigma * sigma,
            self.cfg.divergence_mean_factor * mean,
        )

    def snapshot_due(self, step: int, *, force: bool = False) -> np.ndarray:
        """Envs to snapshot now: the first time, every ``snapshot_every`` epochs, or when
        forced; never a suspect state (the last check panicked, or a divergence streak is
        running), even when forced: that state could be restored later."""
        suspect = self.has_snapshot & (self.panicked | (self.divergent_run > 0))
        due = ~self.has_snapshot | force | (step - self.snapshot_step >= self.cfg.snapshot_every)
        out: np.ndarray = due & ~suspect
        return out


#: Losses within this relative distance under the divergence bound (and recent means
#: within it over the lobotomy bound) are judged exactly.
_BOUND_MARGIN = 1e-6


class Governor:
    """One env's governor: its row of a :class:`Guard` (a one-env guard of its own when
    made alone); the snapshot (on the model's device) it falls back to is kept there."""

    def __init__(
        self,
        cfg: GovernorConfig,
        *,
        random_guess_loss: float,
        guard: Guard | None = None,
        row: int = 0,
    ) -> None:
        if guard is None:
            guard = Guard(1, cfg, random_guess_loss=random_guess_loss)
        self.guard = guard
        self.row = row
        self.cfg = cfg
        self.random_guess_loss = guard.random_guess_loss

    @property
    def history(self) -> list[float]:
        return self.guard.losses(self.row)

    @property
    def snapshot_step(self) -> int:
        return int(self.guard.snapshot_step[self.row])

    @property
    def rollbacks(self) -> int:
        return int(self.guard.rollbacks[self.row])

    def maybe_snapshot(self, step: int, model: GovernedModel, *, force: bool = False) -> bool:
        """Snapshot on the first call, every ``snapshot_every`` epochs, or when forced
        (:meth:`Guard.snapshot_due`)."""
        if not self.guard.snapshot_due(step, force=force)[self.row]:
            return False
        self.take_snapshot(step, model)
        return True

    def take_snapshot(self, step: int, model: GovernedModel) -> None:
        """Clones on the model's device (no host transfer): see model/snapshot.py."""
        self.keep(step, model.snapshot_state())

    def keep(self, step: int, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` (taken at ``step``) to fall back to."""
        self.guard.keep(np.array([self.row]), step, snapshot)

    def check(self, step: int, loss: float) -> tuple[RollbackReason, float] | None:
        """Return ``(reason, threshold)`` when this loss calls for a rollback."""
        if not self.cfg.enabled:
            return None
        del step  # the verdict depends on the losses seen, not on when
        return self.guard._check_one(self.row, float(loss))

    def rollback(
        self,
        step: int,
        model: GovernedModel,
        *,
        reason: RollbackReason,
        loss: float,
        threshold: float,
        clear_optimizers: Callable[[], None],
        transitions_affected: int,
    ) -> GovernorRollback:
        """Prune live seeds, restore the snapshot, clear optimizer state; report it all."""
        guard, row = self.guard, self.row
        snapshot: Snapshot | None = guard.snapshots[row]
        if snapshot is None:
            raise RuntimeError("governor rollback without a snapshot (snapshot at env start)")
        pruned = model.prune_live_seeds(
            reason=PruneReason.GOVERNOR_ROLLBACK,
            initiator=Initiator.GOVERNOR,
        )
        if isinstance(snapshot, dict):
            # Clones: a model that adopts the tensors must not alias the kept snapshot.
            model.restore_state({k: v.clone() for k, v in snapshot.items()})
        else:
            snapshot.restore(model, int(guard.entry[row]))
        clear_optimizers()
        guard.panicked[row] = False
        guard.divergent_run[row] = 0
        guard.rollbacks[row] += 1
        return GovernorRollback(
            step=step,
            reason=reason.value,
            loss=float(loss),
            threshold=float(threshold),
            restored_to_step=self.snapshot_step,
            penalized_step=penalized_step(step),
            seeds_pruned=list(pruned),
            transitions_affected=int(transitions_affected),
            penalty=self.penalty,
        )

    @property
    def penalty(self) -> float:
        return min(0.0, max(-self.cfg.penalty_cap, float(self.cfg.penalty)))
