"""Per-env safety net: snapshot a known-good host, detect collapse, roll back.

The governor only decides and restores; the trainer owns the buffer and the events.
It talks to the model through :class:`GovernedModel`, so it works with any model that
can snapshot, restore and prune (tests use a tiny fake).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import Protocol

from torch import Tensor

from esper.config import GovernorConfig
from esper.core.enums import Initiator, PruneReason, RollbackReason
from esper.core.records import RollbackRecord


class GovernedModel(Protocol):
    """What the governor needs from a model."""

    def snapshot_state(self) -> dict[str, Tensor]: ...

    def restore_state(self, state: dict[str, Tensor]) -> None: ...

    def prune_live_seeds(self, *, reason: PruneReason, initiator: Initiator) -> tuple[str, ...]: ...


class Governor:
    """Watches one env's loss; keeps a snapshot (on the model's device) to fall back to."""

    def __init__(self, cfg: GovernorConfig, *, random_guess_loss: float) -> None:
        if not random_guess_loss > 0:
            raise ValueError(f"random_guess_loss must be positive, got {random_guess_loss}")
        self.cfg = cfg
        self.random_guess_loss = float(random_guess_loss)
        self.history: deque[float] = deque(maxlen=cfg.history_window)
        self._divergent_run = 0
        self._panicked = False
        self._snapshot: dict[str, Tensor] | None = None
        self.snapshot_step = -1
        self.rollbacks = 0

    def maybe_snapshot(self, step: int, model: GovernedModel, *, force: bool = False) -> bool:
        """Snapshot on the first call, every ``snapshot_every`` epochs, or when forced.

        Never replaces the snapshot with a suspect state (the last check panicked, or a
        divergence streak is running), even when forced: that state could be restored later.
        """
        if self._snapshot is not None and (self._panicked or self._divergent_run):
            return False
        due = (
            self._snapshot is None or force or step - self.snapshot_step >= self.cfg.snapshot_every
        )
        if not due:
            return False
        # Clones on the model's device (no host transfer): see model/snapshot.py.
        self._snapshot = model.snapshot_state()
        self.snapshot_step = step
        return True

    def check(self, step: int, loss: float) -> tuple[RollbackReason, float] | None:
        """Return ``(reason, threshold)`` when this loss calls for a rollback."""
        if not self.cfg.enabled:
            return None
        verdict = self._verdict(loss)
        self._panicked = verdict is not None
        if verdict is None and math.isfinite(loss) and self._divergent_run == 0:
            self.history.append(float(loss))
        return verdict

    def _verdict(self, loss: float) -> tuple[RollbackReason, float] | None:
        if not math.isfinite(loss):
            return RollbackReason.NON_FINITE_LOSS, math.nan
        lobotomy = self._lobotomy_threshold(loss)
        if lobotomy is not None:
            self._divergent_run = 0
            return RollbackReason.LOBOTOMY, lobotomy
        threshold = self._divergence_threshold()
        if threshold is not None and loss > threshold:
            self._divergent_run += 1
            if self._divergent_run >= self.cfg.divergence_consecutive:
                self._divergent_run = 0
                return RollbackReason.DIVERGENCE, threshold
        else:
            self._divergent_run = 0
        return None

    def _lobotomy_threshold(self, loss: float) -> float | None:
        """Loss back at random guessing after having been well below it."""
        rgl = self.random_guess_loss
        if len(self.history) < self.cfg.min_history:
            return None
        recent = list(self.history)[-self.cfg.lobotomy_recent :]
        if statistics.fmean(recent) >= self.cfg.lobotomy_below_fraction * rgl:
            return None
        band = self.cfg.lobotomy_tolerance * rgl
        if abs(loss - rgl) <= band:
            return rgl - band
        return None

    def _divergence_threshold(self) -> float | None:
        """All three conditions at once: above the floor, mean + k sigma, and factor x mean."""
        if len(self.history) < self.cfg.min_history:
            return None
        mean = statistics.fmean(self.history)
        sigma = statistics.pstdev(self.history)
        return max(
            self.cfg.divergence_min_loss,
            mean + self.cfg.divergence_sigma * sigma,
            self.cfg.divergence_mean_factor * mean,
        )

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
    ) -> RollbackRecord:
        """Prune live seeds, restore the snapshot, clear optimizer state; report it all."""
        if self._snapshot is None:
            raise RuntimeError("governor rollback without a snapshot (snapshot at env start)")
        pruned = model.prune_live_seeds(
            reason=PruneReason.GOVERNOR_ROLLBACK,
            initiator=Initiator.GOVERNOR,
        )
        # Clones: a model that adopts the tensors must not alias the kept snapshot.
        model.restore_state({k: v.clone() for k, v in self._snapshot.items()})
        clear_optimizers()
        self._panicked = False
        self._divergent_run = 0
        self.rollbacks += 1
        return RollbackRecord(
            reason=reason,
            loss=float(loss),
            threshold=float(threshold),
            panic_step=step,
            restored_to_step=self.snapshot_step,
            seeds_pruned=tuple(pruned),
            transitions_affected=int(transitions_affected),
            penalty=self.penalty,
        )

    @property
    def penalty(self) -> float:
        return min(0.0, max(-self.cfg.penalty_cap, float(self.cfg.penalty)))
