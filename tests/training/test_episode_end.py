"""Episode end: a true terminal (docs/training.md, "Episode end").

The host is discarded after the last step, whose reward carries the final-accuracy
terminal term, and the observation carries the remaining budget, so GAE bootstraps
nothing past the last step and the trainer makes no round-end value pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from esper.config import Config, with_overrides
from esper.core.enums import SeedStage
from esper.core.records import SlotReport
from esper.data.tasks import load_task
from esper.policy.features import build_features
from esper.policy.signals import SignalTracker
from esper.telemetry.memory_hub import MemoryHub
from esper.training.learning.buffer import RolloutBuffer
from esper.training.run import train


def test_last_step_is_terminal_and_no_round_end_value_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row ends in a done, so GAE needs (and gets) no round-end value pass."""
    seen: list[RolloutBuffer] = []
    real = RolloutBuffer.compute_returns_and_advantages

    def spy(self: RolloutBuffer, *args: object, **kwargs: object) -> None:
        real(self, *args, **kwargs)  # type: ignore[arg-type]
        seen.append(self)

    monkeypatch.setattr(RolloutBuffer, "compute_returns_and_advantages", spy)
    cfg = with_overrides(
        Config(),
        {
            "run.n_envs": 2,
            "run.rounds": 1,
            "run.episode_length": 4,
            "task.train_samples_per_env": 64,
            "task.val_samples": 64,
            "policy.feature_dim": 16,
            "policy.lstm_hidden": 16,
        },
    )
    data = load_task(cfg.task, seed=0)
    train(cfg, telemetry=MemoryHub(run_id="t"), data=data, save=tmp_path / "c.pt")
    (buf,) = seen
    assert bool(buf.dones[:, -1].all()) and not bool(buf.dones[:, :-1].any())
    last = buf.learning_rewards()[:, -1] - buf.values[:, -1]
    torch.testing.assert_close(buf.advantages[:, -1], last)


def test_gae_refuses_an_open_ended_row_without_last_values() -> None:
    """Terminal rows need no bootstrap; a row cut by a time limit must get V(s_T)."""
    buf = RolloutBuffer(2, 3, 4, 1, _sizes(), 8, "cpu")
    _fill(buf, done_last=[True, False])
    with pytest.raises(ValueError, match="last_values"):
        buf.compute_returns_and_advantages(gamma=0.9, gae_lambda=0.9)
    buf.compute_returns_and_advantages(torch.tensor([0.0, 0.0]), gamma=0.9, gae_lambda=0.9)
    a0 = buf.advantages.clone()
    buf.compute_returns_and_advantages(torch.tensor([100.0, 100.0]), gamma=0.9, gae_lambda=0.9)
    assert torch.equal(buf.advantages[0], a0[0])  # terminal row: last_values ignored
    assert not torch.equal(buf.advantages[1], a0[1])  # truncated row: bootstraps V(s_T)


def test_observation_carries_the_remaining_budget() -> None:
    """What makes the terminal Markov: the policy sees how far into the episode it is."""
    dormant = (SlotReport(slot_id="s0", stage=SeedStage.DORMANT),)
    kw = {"reports": [dormant], "last_ops": [0], "last_success": [True], "device": "cpu"}
    early, _ = build_features(trackers=[SignalTracker()], epoch=0, max_epochs=20, **kw)
    late, _ = build_features(trackers=[SignalTracker()], epoch=19, max_epochs=20, **kw)
    assert not torch.equal(early, late)


def _sizes() -> dict[str, int]:
    from esper.core.enums import Topology
    from esper.policy.actions import ActionSpace

    return ActionSpace(("s0",), Topology.CNN).head_sizes


def _fill(buf: RolloutBuffer, done_last: list[bool]) -> None:
    from esper.policy.masks import ActionMasks

    n, t = buf.n_envs, buf.horizon
    buf.start((torch.zeros(1, n, 8), torch.zeros(1, n, 8)))
    masks = ActionMasks(**{k: v[:, 0] for k, v in buf.masks.items()})
    for step in range(t):
        buf.add(
            step,
            obs=torch.zeros(n, 4),
            blueprint_ids=torch.zeros(n, 1, dtype=torch.long),
            masks=masks,
            actions=torch.zeros(n, buf.actions.shape[-1], dtype=torch.long),
            log_probs=torch.zeros(n, buf.log_probs.shape[-1]),
            values=torch.full((n,), 0.5),
            rewards_normalized=torch.ones(n),
            rewards_raw=torch.ones(n),
            dones=torch.tensor(done_last) if step == t - 1 else torch.zeros(n, dtype=torch.bool),
        )
