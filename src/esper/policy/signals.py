"""Per-env training signals the policy reads: recent history, plateaus, host stability.

Host-side only (plain floats): the trainer feeds it the validation numbers it already
transferred for the step, so tracking costs no device synchronisation.
"""

from __future__ import annotations

import math
from collections import deque

from esper.core.constants import (
    OBS_HISTORY_LEN,
    PLATEAU_MIN_ACC_GAIN_PP,
    STABILISATION_EPOCHS,
    STABILISATION_MAX_ACC_GAIN_PP,
)


class SignalTracker:
    """Loss/accuracy history, a plateau count and a "host stabilised" latch for one env.

    * ``plateau_count``: consecutive epochs whose val accuracy did not beat the best so
      far by ``plateau_gain_pp``; 0 right after a new best.
    * ``host_stabilised``: latches True once the epoch-over-epoch accuracy gain has
      stayed below ``stabilise_gain_pp`` for ``stabilise_epochs`` epochs in a row;
      growing seeds into a host that is still learning fast muddles attribution.

    Both signals use accuracy (percent, like contributions in percentage points): on
    small tasks the loss keeps shrinking long after accuracy has saturated.
    """

    def __init__(
        self,
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
        self.reset()

    def reset(self) -> None:
        self.loss_history: deque[float] = deque(maxlen=self.history_len)
        self.acc_history: deque[float] = deque(maxlen=self.history_len)
        self.epochs = 0
        self.best_loss = math.inf
        self.best_acc = -math.inf
        self.plateau_count = 0
        self.host_stabilised = False
        self._calm_epochs = 0

    @property
    def last_loss(self) -> float:
        return self.loss_history[-1] if self.loss_history else math.nan

    @property
    def last_acc(self) -> float:
        return self.acc_history[-1] if self.acc_history else math.nan

    def update(self, val_loss: float, val_acc: float) -> None:
        """Record one epoch's validation loss and accuracy (percent)."""
        prev_acc = self.last_acc
        self.loss_history.append(float(val_loss))
        self.acc_history.append(float(val_acc))
        self.epochs += 1
        if not (math.isfinite(val_loss) and math.isfinite(val_acc)):
            # A broken epoch is neither progress nor calm; the governor deals with it.
            self.plateau_count += 1
            self._calm_epochs = 0
            return
        self.best_loss = min(self.best_loss, val_loss)
        if val_acc >= self.best_acc + self.plateau_gain_pp:
            self.best_acc = val_acc
            self.plateau_count = 0
        else:
            self.best_acc = max(self.best_acc, val_acc)
            self.plateau_count += 1
        if math.isfinite(prev_acc):
            calm = val_acc - prev_acc < self.stabilise_gain_pp
            self._calm_epochs = self._calm_epochs + 1 if calm else 0
            if self._calm_epochs >= self.stabilise_epochs:
                self.host_stabilised = True
