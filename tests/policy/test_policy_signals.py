"""Signal tracker: history, plateau count and the host-stabilised latch."""

from __future__ import annotations

import math

from esper.core.constants import OBS_HISTORY_LEN
from esper.policy.signals import SignalTracker


def feed(t: SignalTracker, accs: list[float]) -> None:
    for i, acc in enumerate(accs):
        t.update(1.0 / (i + 1), acc)


def test_history_is_bounded_and_ordered() -> None:
    t = SignalTracker()
    assert math.isnan(t.last_loss) and math.isnan(t.last_acc)
    for i in range(OBS_HISTORY_LEN + 3):
        t.update(10.0 - i, float(i))
    assert list(t.acc_history) == [float(i) for i in range(3, OBS_HISTORY_LEN + 3)]
    assert t.last_loss == 10.0 - (OBS_HISTORY_LEN + 2)
    assert t.best_loss == t.last_loss
    assert t.epochs == OBS_HISTORY_LEN + 3


def test_plateau_counts_epochs_without_a_meaningful_new_best() -> None:
    t = SignalTracker(plateau_gain_pp=0.5)
    feed(t, [50.0])
    assert t.plateau_count == 0
    feed(t, [50.3, 49.0])  # +0.3 pp is not enough; a drop is not progress
    assert t.plateau_count == 2
    t.update(0.1, 60.0)  # a clear new best resets
    assert t.plateau_count == 0 and t.best_acc == 60.0


def test_stabilised_latches_after_calm_epochs() -> None:
    t = SignalTracker(stabilise_gain_pp=1.0, stabilise_epochs=3)
    feed(t, [20.0, 50.0, 80.0, 95.0])  # fast learning: not stable
    assert not t.host_stabilised
    t.update(0.1, 95.5)
    t.update(0.1, 95.2)
    assert not t.host_stabilised
    t.update(0.1, 96.0)
    assert t.host_stabilised
    t.update(0.1, 99.9)  # a later jump does not unlatch it
    assert t.host_stabilised
    t.reset()
    assert not t.host_stabilised and t.epochs == 0 and t.plateau_count == 0


def test_calm_streak_must_be_consecutive() -> None:
    t = SignalTracker(stabilise_gain_pp=1.0, stabilise_epochs=3)
    feed(t, [90.0, 90.5, 90.9, 95.0, 95.2, 95.4])
    assert not t.host_stabilised  # the +4.1 pp epoch broke the streak at 2
    t.update(0.1, 95.5)
    assert t.host_stabilised


def test_non_finite_epoch_is_neither_progress_nor_calm() -> None:
    t = SignalTracker(stabilise_epochs=2)
    feed(t, [10.0, 10.0])
    t.update(math.nan, 10.0)
    assert t.plateau_count == 2 and t.best_loss == 0.5
    assert not t.host_stabilised  # the calm streak was reset by the broken epoch
