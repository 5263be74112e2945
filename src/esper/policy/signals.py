"""Per-env training signals the policy reads: recent history, plateaus, host stability.

Host-side only: the trainer feeds the validation numbers it already transferred for the
step, so tracking costs no device synchronisation. :class:`Signals` holds every env of a
round as arrays and updates them all with one call; :class:`SignalTracker` is one env's
view (or, made on its own, a one-env table), for the code that reads one env.

* ``plateau_count``: consecutive epochs whose val accuracy did not beat the best so
  far by ``plateau_gain_pp``; 0 right after a new best.
* ``host_stabilised``: latches True once the epoch-over-epoch accuracy gain has
  stayed below ``stabilise_gain_pp`` for ``stabilise_epochs`` epochs in a row;
  growing seeds into a host that is still learning fast muddles attribution.

Both signals use accuracy (percent, like contributions in percentage points): on
small tasks the loss keeps shrinking long after accuracy has saturated.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from esper.core.columns import RowField
from esper.core.constants import (
    OBS_HISTORY_LEN,
    PLATEAU_MIN_ACC_GAIN_PP,
    STABILISATION_EPOCHS,
    STABILISATION_MAX_ACC_GAIN_PP,
)

#: The per-env arrays of :class:`Signals`.
_ROW_ARRAYS = (
    "loss_history",
    "acc_history",
    "count",
    "epochs",
    "best_loss",
    "best_acc",
    "plateau_count",
    "host_stabilised",
    "calm_epochs",
)


class Signals:
    """The signals of ``n`` envs: histories as ``[n, history_len]`` arrays (oldest first,
    the newest in the last column) with a count of the values they hold."""

    def __init__(
        self,
        n: int,
        *,
        history_len: int = OBS_HISTORY_LEN,
        plateau_gain_pp: float = PLATEAU_MIN_ACC_GAIN_PP,
        stabilise_gain_pp: float = STABILISATION_MAX_ACC_GAIN_PP,
        stabilise_epochs: int = STABILISATION_EPOCHS,
    ) -> None:
        self.history_len = history_len
        self.plateau_gain_pp = plateau_gain_pp
        self.stabilise_gain_pp = stabilise_gain_pp
        self.stabilise_epochs = stabilise_epochs
        self.loss_history = np.zeros((n, history_len))
        self.acc_history = np.zeros((n, history_len))
        self.count = np.zeros(n, dtype=np.int64)
        self.epochs = np.zeros(n, dtype=np.int64)
        self.best_loss = np.full(n, math.inf)
        self.best_acc = np.full(n, -math.inf)
        self.plateau_count = np.zeros(n, dtype=np.int64)
        self.host_stabilised = np.zeros(n, dtype=bool)
        self.calm_epochs = np.zeros(n, dtype=np.int64)

    @property
    def last_loss(self) -> np.ndarray:
        return np.where(self.count > 0, self.loss_history[:, -1], math.nan)

    @property
    def last_acc(self) -> np.ndarray:
        return np.where(self.count > 0, self.acc_history[:, -1], math.nan)

    def padded(self, history: np.ndarray) -> np.ndarray:
        """A history as ``[n, history_len]`` with the missing front filled with the oldest
        known value (zeros where nothing is known): the policy's observation."""
        h = self.history_len
        first = h - np.minimum(self.count, h)
        index = np.maximum(np.arange(h)[None, :], np.minimum(first, h - 1)[:, None])
        out = np.take_along_axis(history, index, axis=1)
        return np.where(self.count[:, None] > 0, out, 0.0)

    def update(self, val_loss: np.ndarray, val_acc: np.ndarray, rows: Any = slice(None)) -> None:
        """Record one epoch's validation loss and accuracy (percent) of ``rows``."""
        prev_acc = self.last_acc[rows]
        for hist, value in ((self.loss_history, val_loss), (self.acc_history, val_acc)):
            kept = hist[rows]
            hist[rows] = np.concatenate([kept[:, 1:], np.asarray(value, float)[:, None]], axis=1)
        self.count[rows] = np.minimum(self.count[rows] + 1, self.history_len)
        self.epochs[rows] += 1
        ok = np.isfinite(val_loss) & np.isfinite(val_acc)
        # A broken epoch is neither progress nor calm; the governor deals with it.
        self.best_loss[rows] = np.where(
            ok, np.minimum(self.best_loss[rows], val_loss), self.best_loss[rows]
        )
        best = self.best_acc[rows]
        improved = ok & (val_acc >= best + self.plateau_gain_pp)
        self.best_acc[rows] = np.where(
            improved, val_acc, np.where(ok, np.maximum(best, val_acc), best)
        )
        self.plateau_count[rows] = np.where(improved, 0, self.plateau_count[rows] + 1)
        compared = ok & np.isfinite(prev_acc)
        calm = compared & (val_acc - prev_acc < self.stabilise_gain_pp)
        calm_epochs = self.calm_epochs[rows]
        calm_epochs = np.where(calm, calm_epochs + 1, np.where(compared | ~ok, 0, calm_epochs))
        self.calm_epochs[rows] = calm_epochs
        self.host_stabilised[rows] |= compared & (calm_epochs >= self.stabilise_epochs)

    def copy_row(self, other: Signals, src: int, dst: int) -> None:
        """Row ``src`` of ``other`` into row ``dst`` (same history length)."""
        for name in _ROW_ARRAYS:
            getattr(self, name)[dst] = getattr(other, name)[src]

    def reset(self, rows: Any = slice(None)) -> None:
        self.loss_history[rows] = 0.0
        self.acc_history[rows] = 0.0
        self.count[rows] = 0
        self.epochs[rows] = 0
        self.best_loss[rows] = math.inf
        self.best_acc[rows] = -math.inf
        self.plateau_count[rows] = 0
        self.host_stabilised[rows] = False
        self.calm_epochs[rows] = 0


class SignalTracker:
    """One env's :class:`Signals` (a row of a round's, or a one-env table of its own)."""

    def __init__(
        self,
        *,
        history_len: int = OBS_HISTORY_LEN,
        plateau_gain_pp: float = PLATEAU_MIN_ACC_GAIN_PP,
        stabilise_gain_pp: float = STABILISATION_MAX_ACC_GAIN_PP,
        stabilise_epochs: int = STABILISATION_EPOCHS,
        table: Signals | None = None,
        row: int = 0,
    ) -> None:
        if table is None:
            table = Signals(
                1,
                history_len=history_len,
                plateau_gain_pp=plateau_gain_pp,
                stabilise_gain_pp=stabilise_gain_pp,
                stabilise_epochs=stabilise_epochs,
            )
        self.table = table
        self.row = row

    @property
    def history_len(self) -> int:
        return self.table.history_len

    @property
    def plateau_gain_pp(self) -> float:
        return self.table.plateau_gain_pp

    @property
    def stabilise_gain_pp(self) -> float:
        return self.table.stabilise_gain_pp

    @property
    def stabilise_epochs(self) -> int:
        return self.table.stabilise_epochs

    def _history(self, hist: np.ndarray) -> list[float]:
        count = int(self.table.count[self.row])
        values: list[float] = hist[self.row, self.history_len - count :].tolist()
        return values

    @property
    def loss_history(self) -> list[float]:
        return self._history(self.table.loss_history)

    @property
    def acc_history(self) -> list[float]:
        return self._history(self.table.acc_history)

    epochs = RowField("epochs", int)
    best_loss = RowField("best_loss", float)
    best_acc = RowField("best_acc", float)
    plateau_count = RowField("plateau_count", int)
    host_stabilised = RowField("host_stabilised", bool)

    @property
    def last_loss(self) -> float:
        return float(self.table.last_loss[self.row])

    @property
    def last_acc(self) -> float:
        return float(self.table.last_acc[self.row])

    def reset(self) -> None:
        self.table.reset(self.row)

    def update(self, val_loss: float, val_acc: float) -> None:
        """Record one epoch's validation loss and accuracy (percent)."""
        rows = np.array([self.row])
        self.table.update(np.array([float(val_loss)]), np.array([float(val_acc)]), rows)
