"""Host training with a GradScaler while a seed is GERMINATED (outside the forward pass).

Issue: ``scaler.step`` asserted "No inf checks were recorded for this optimizer" for the
seed's optimizer, which has no gradients yet. The CPU GradScaler follows the same code
path as CUDA's, so the fp16 crash reproduces here.
"""

from __future__ import annotations

import pytest
import torch

from esper.config import Config, with_overrides
from esper.core.constants import CNN_BLUEPRINTS
from esper.core.enums import AmpMode, GerminationStyle, Initiator, SeedStage
from esper.data.tasks import load_task
from esper.training.envs.action_execution import sync_seed_optimizers
from esper.training.envs.env_factory import EnvFactory
from esper.training.passes.batch_ops import PassOptions, train_batch


def _germinated_env() -> tuple[object, torch.Tensor, torch.Tensor]:
    cfg = with_overrides(Config(), {"run.n_envs": 1, "task.name": "digits"})
    data = load_task(cfg.task, seed=0)
    env = EnvFactory(cfg, data.spec).create_round(0)[0]
    slot = env.model.slot_ids[0]
    assert env.model.germinate(
        slot,
        CNN_BLUEPRINTS[0],
        GerminationStyle.LINEAR_ADD,
        8,
        1.0,
        seed_id="s0",
        current_acc=0.0,
        initiator=Initiator.POLICY,
    )
    sync_seed_optimizers(env)
    assert env.seed_optimizers, "the germinated seed must have an optimizer"
    stages = {r.slot_id: r.stage for r in env.model.slot_reports()}
    assert stages[slot] == SeedStage.GERMINATED
    return env, data.train_x[:32], data.train_y[:32]


def test_grad_scaler_with_a_germinated_seed_does_not_assert() -> None:
    env, x, y = _germinated_env()
    env.scaler = torch.amp.GradScaler("cpu")  # type: ignore[attr-defined]
    host_before = [p.detach().clone() for p in env.model.host_parameters()]
    seed_opt = next(iter(env.seed_optimizers.values()))
    seed_before = [p.detach().clone() for g in seed_opt.param_groups for p in g["params"]]
    opts = PassOptions(amp=AmpMode.FP16, channels_last=False)
    for _ in range(3):
        train_batch(env, x, y, opts, inject_nan=False)
    host_after = list(env.model.host_parameters())
    assert any(not torch.equal(a, b) for a, b in zip(host_before, host_after, strict=True))
    seed_after = [p for g in seed_opt.param_groups for p in g["params"]]
    assert all(torch.equal(a, b) for a, b in zip(seed_before, seed_after, strict=True))
    assert env.train_accum is not None and torch.isfinite(env.train_accum).all()


@pytest.mark.parametrize("scaled", [False, True])
def test_train_batch_steps_only_optimizers_with_gradients(scaled: bool) -> None:
    env, x, y = _germinated_env()
    if scaled:
        env.scaler = torch.amp.GradScaler("cpu")  # type: ignore[attr-defined]
    seed_opt = next(iter(env.seed_optimizers.values()))
    train_batch(env, x, y, PassOptions(amp=AmpMode.OFF, channels_last=False), inject_nan=False)
    assert not seed_opt.state, "an optimizer without gradients must not be stepped"


def test_amp_asked_for_on_cpu_warns_and_resolves_off() -> None:
    from esper.training.learning.learner import resolve_amp

    cfg = with_overrides(Config(), {"run.amp": "fp16"})
    with pytest.warns(UserWarning, match="needs a CUDA device"):
        assert resolve_amp(cfg, torch.device("cpu")) == AmpMode.OFF
    assert resolve_amp(Config(), torch.device("cpu")) == AmpMode.OFF  # no warning asked for
