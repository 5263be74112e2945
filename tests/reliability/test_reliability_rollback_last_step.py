"""A NaN on the last step of an episode: the governor rolls the env back, and what the
episode reports (final accuracy and loss, the terminal reward) is the restored model's,
not the failed model's."""

from __future__ import annotations

import math

import pytest
from _reliability_support import N_ENVS, write_small_config

EPISODE = 4
LAST = EPISODE - 1
NAN_ENV = 0


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    from esper.config import load_config, with_overrides
    from esper.core.enums import TelemetryLevel
    from esper.telemetry.memory_hub import MemoryHub
    from esper.training.loop.faults import Fault, FaultKind, FaultPlan
    from esper.training.run import train

    tmp = tmp_path_factory.mktemp("nanlast")
    cfg = with_overrides(
        load_config(write_small_config(tmp)),
        {
            "run.n_envs": N_ENVS,
            "run.episode_length": EPISODE,
            "run.rounds": 1,
            "run.run_id": "n",
        },
    )
    hub = MemoryHub(run_id="n", level=TelemetryLevel.NORMAL)
    faults = FaultPlan([Fault(kind=FaultKind.NAN, round=0, step=LAST, env=NAN_ENV)])
    train(cfg, telemetry=hub, faults=faults, save=tmp / "c.pt")
    out: dict[str, list] = {}
    for e in hub.events:
        out.setdefault(type(e).__name__, []).append(e)
    return out


def test_the_rollback_happens_on_the_last_step(events: dict[str, list]) -> None:
    (rb,) = events["GovernorRollback"]
    assert (rb.env, rb.step, rb.reason) == (NAN_ENV, LAST, "non_finite_loss")
    (failed,) = [e for e in events["EnvStep"] if (e.env, e.step) == (NAN_ENV, LAST)]
    assert math.isnan(failed.train_loss) and math.isnan(failed.val_loss)  # the NaN model


def test_episode_reports_the_restored_model(events: dict[str, list]) -> None:
    (failed,) = [e for e in events["EnvStep"] if (e.env, e.step) == (NAN_ENV, LAST)]
    (episode,) = [e for e in events["EpisodeFinished"] if e.env == NAN_ENV]
    assert math.isfinite(episode.final_val_loss), "final loss of the NaN model"
    assert 0.0 < episode.final_val_acc <= 100.0
    assert (episode.final_val_acc, episode.final_val_loss) != (failed.val_acc, failed.val_loss)
    # The round summary (mean final accuracy) is built from the same restored numbers.
    (round_end,) = events["RoundFinished"]
    finals = [e.final_val_acc for e in events["EpisodeFinished"]]
    assert round_end.mean_final_accuracy == pytest.approx(sum(finals) / len(finals))


def test_terminal_reward_is_finite_and_sums_to_the_episode(events: dict[str, list]) -> None:
    rewards = [e for e in events["RewardComputed"] if e.env == NAN_ENV]
    (terminal,) = [r for r in rewards if r.step == LAST]
    assert all(math.isfinite(r.total) for r in rewards)
    assert math.isfinite(terminal.terminal)
    (episode,) = [e for e in events["EpisodeFinished"] if e.env == NAN_ENV]
    assert episode.episode_reward == pytest.approx(sum(r.total for r in rewards), abs=1e-9)
