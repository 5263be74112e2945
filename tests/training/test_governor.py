"""Governor: each panic signature fires exactly as specified; rollback is exact."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from esper.config import GovernorConfig
from esper.core.enums import Initiator, PruneReason, RollbackReason
from esper.training.envs.governor import Governor

MIN_HISTORY = GovernorConfig().min_history

RGL = math.log(10)  # random-guess cross-entropy for 10 classes


class FakeModel:
    """A real module plus a list of live seeds: all the governor may touch."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
        self.live = ["seedA", "seedB"]
        self.prune_calls: list[tuple[PruneReason, Initiator]] = []

    def snapshot_state(self) -> dict[str, Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.net.state_dict().items()}

    def restore_state(self, state: dict[str, Tensor]) -> None:
        self.net.load_state_dict(state)

    def prune_live_seeds(self, *, reason: PruneReason, initiator: Initiator) -> tuple[str, ...]:
        self.prune_calls.append((reason, initiator))
        pruned, self.live = tuple(self.live), []
        return pruned


def _gov(**kw: object) -> Governor:
    return Governor(GovernorConfig(**kw), random_guess_loss=RGL)  # type: ignore[arg-type]


def _warm(gov: Governor, losses: list[float], start: int = 0) -> int:
    for i, loss in enumerate(losses):
        assert gov.check(start + i, loss) is None
    return start + len(losses)


def test_non_finite_loss_panics_immediately() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        gov = _gov()
        verdict = gov.check(0, bad)
        assert verdict is not None and verdict[0] == RollbackReason.NON_FINITE_LOSS


def test_lobotomy_needs_a_history_well_below_random_guessing() -> None:
    gov = _gov()
    # Near random guessing from the start: a slow learner, never a lobotomy.
    _warm(gov, [RGL * 1.01] * 6)
    gov = _gov()
    step = _warm(gov, [1.2, 0.9, 0.7, 0.6])
    assert gov.check(step, RGL * 1.10) is None  # outside the 6.5% band
    verdict = gov.check(step + 1, RGL * 1.05)  # inside the band
    assert verdict is not None
    reason, threshold = verdict
    assert reason == RollbackReason.LOBOTOMY
    assert threshold == pytest.approx(RGL * (1 - 0.065))


def test_divergence_needs_three_consecutive_checks_over_every_bound() -> None:
    gov = _gov()
    step = _warm(gov, [1.0, 1.1, 0.9, 1.0, 1.05])
    assert gov.check(step, 20.0) is None
    assert gov.check(step + 1, 20.0) is None
    verdict = gov.check(step + 2, 20.0)
    assert verdict is not None and verdict[0] == RollbackReason.DIVERGENCE
    assert verdict[1] == 12.0  # the floor dominates mean + 6 sigma and 3 x mean here


def test_divergence_streak_resets_and_the_floor_matters() -> None:
    gov = _gov()
    step = _warm(gov, [1.0, 1.1, 0.9, 1.0, 1.05])
    assert gov.check(step, 20.0) is None
    assert gov.check(step + 1, 20.0) is None
    assert gov.check(step + 2, 1.0) is None  # streak broken
    assert gov.check(step + 3, 20.0) is None
    assert gov.check(step + 4, 20.0) is None
    # Below the absolute floor (12) a jump is never divergence, however large relatively.
    gov = _gov()
    step = _warm(gov, [0.1, 0.1, 0.1, 0.1])
    for i in range(5):
        assert gov.check(step + i, 11.0) is None


def test_divergence_sigma_and_mean_factor_bounds() -> None:
    # Spread-out history: mean 2.5, sigma 2 -> mean + 6 sigma = 14.5 is the binding bound.
    history = [0.5, 4.5] * 3
    gov = _gov()
    step = _warm(gov, history)
    assert gov.check(step, 13.0) is None  # > 12 and > 3 x mean, but < mean + 6 sigma
    gov = _gov()
    step = _warm(gov, history)
    verdicts = [gov.check(step + i, 15.0) for i in range(3)]
    assert verdicts == [None, None, (RollbackReason.DIVERGENCE, pytest.approx(14.5))]
    # Flat history at 5: 3 x mean = 15 is the binding bound.
    gov = _gov()
    step = _warm(gov, [5.0] * MIN_HISTORY)
    assert gov.check(step, 14.0) is None
    gov = _gov()
    step = _warm(gov, [5.0] * MIN_HISTORY)
    verdicts = [gov.check(step + i, 16.0) for i in range(3)]
    assert verdicts == [None, None, (RollbackReason.DIVERGENCE, 15.0)]


def test_snapshot_schedule_and_no_snapshot_of_a_suspect_state() -> None:
    gov, model = _gov(snapshot_every=5), FakeModel()
    assert gov.maybe_snapshot(0, model)  # first call always
    assert not gov.maybe_snapshot(3, model)
    assert gov.maybe_snapshot(5, model)
    assert gov.maybe_snapshot(6, model, force=True)  # after a fossilize
    assert gov.snapshot_step == 6
    assert gov.check(7, math.nan) is not None
    assert not gov.maybe_snapshot(20, model, force=True)  # panicked: keep the good one
    assert gov.snapshot_step == 6


def test_rollback_restores_bitwise_prunes_and_clears() -> None:
    gov, model = _gov(penalty=-25.0), FakeModel()
    model.net.train()
    gov.maybe_snapshot(4, model, force=True)
    expected = {k: v.clone() for k, v in model.net.state_dict().items()}
    with torch.no_grad():
        for p in model.net.parameters():
            p.add_(torch.randn_like(p))
    model.net(torch.randn(16, 4))  # moves the BatchNorm running stats too
    cleared: list[bool] = []
    verdict = gov.check(9, math.inf)
    assert verdict is not None
    rec = gov.rollback(
        9,
        model,
        reason=verdict[0],
        loss=math.inf,
        threshold=verdict[1],
        clear_optimizers=lambda: cleared.append(True),
        transitions_affected=6,
    )
    for k, v in model.net.state_dict().items():
        assert torch.equal(v, expected[k]), k
    assert cleared == [True]
    assert model.prune_calls == [(PruneReason.GOVERNOR_ROLLBACK, Initiator.GOVERNOR)]
    assert rec.seeds_pruned == ["seedA", "seedB"]
    assert rec.reason == RollbackReason.NON_FINITE_LOSS.value
    assert (rec.step, rec.restored_to_step, rec.transitions_affected) == (9, 4, 6)
    assert rec.penalized_step == 8
    assert rec.penalty == -10.0  # clipped
    # The snapshot survives the restore: a second rollback restores the same state.
    with torch.no_grad():
        for p in model.net.parameters():
            p.mul_(3.0)
    gov.rollback(
        10,
        model,
        reason=RollbackReason.DIVERGENCE,
        loss=50.0,
        threshold=12.0,
        clear_optimizers=lambda: None,
        transitions_affected=1,
    )
    for k, v in model.net.state_dict().items():
        assert torch.equal(v, expected[k]), k


def test_disabled_governor_never_panics_and_rollback_needs_a_snapshot() -> None:
    assert _gov(enabled=False).check(0, math.nan) is None
    with pytest.raises(RuntimeError, match="snapshot"):
        _gov().rollback(
            0,
            FakeModel(),
            reason=RollbackReason.LOBOTOMY,
            loss=1.0,
            threshold=1.0,
            clear_optimizers=lambda: None,
            transitions_affected=0,
        )
