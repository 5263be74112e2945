"""Runtime sync guard: the hot path reads device data only through ``host_copy``.

The grep lint (tests/test_hot_path_lint.py) cannot see a library's own host reads
(``F.one_hot`` validates its input on the host) or a read outside a loop that still runs
once per minibatch. These tests run the real code under
:class:`~esper.training.launch_count.SyncGuard`, a dispatch mode that fails on any
``aten._local_scalar_dense`` (``.item()``, ``float(t)``, ``bool(t)``, library checks)
and any ``.tolist()``/``.numpy()`` made outside the one sanctioned transfer per phase.
On CUDA, ``torch.cuda.set_sync_debug_mode("error")`` checks the same on the device.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from esper.config import Config, with_overrides
from esper.core.enums import Initiator, PolicyKind
from esper.data.tasks import load_task
from esper.training.envs.env_results import PhaseTimes
from esper.training.envs.host_envs import HostEnvs
from esper.training.launch_count import HostSyncError, LaunchCounter, SyncGuard
from esper.training.learning.learner import Learner
from esper.training.learning.policy_factory import build_policy
from esper.training.loop.run_setup import action_space_for

N_ENVS = 3
HORIZON = 3
#: The step's transfers: the host passes' statistics, the decision, the rewards.
#: The step's statistics and the policy's decision; the rewards never leave the host.
ONE_PER_PHASE = {"validation": 1, "policy": 1}


def _config(**overrides: Any) -> Config:
    base = {
        "run.n_envs": N_ENVS,
        "run.episode_length": HORIZON,
        "task.train_samples_per_env": 96,
        "task.val_samples": 96,
        "policy.feature_dim": 32,
        "policy.lstm_hidden": 32,
        "ppo.update_epochs": 3,
        "ppo.target_kl": None,
    }
    base.update(overrides)
    return with_overrides(Config(), base)


def _parts(cfg: Config) -> tuple[HostEnvs, Learner]:
    task = load_task(cfg.task, seed=cfg.run.seed)
    space = action_space_for(cfg, task)
    learner = Learner(cfg, space, build_policy(cfg, space))
    envs = HostEnvs(
        cfg,
        task,
        space=space,
        policy_device=learner.device,
        amp=learner.resolved_amp,
        initiator=Initiator.POLICY,
    )
    return envs, learner


def _env_step(envs: HostEnvs, learner: Learner, step: int, hidden: Any) -> Any:
    """One full env step: advance, observe, decide, execute, record."""
    envs.advance(0, step, PhaseTimes())
    decision = learner.decide(envs.observe(step), hidden)
    transitions = envs.step(decision.heads, step)
    learner.record_step(step, decision, transitions.totals, terminal=step == HORIZON - 1)
    return decision.hidden


@pytest.mark.parametrize("batch_envs", [False, True], ids=["per-env", "batched"])
def test_every_env_step_reads_the_device_once_per_phase(batch_envs: bool) -> None:
    envs, learner = _parts(_config(**{"run.batch_envs": batch_envs}))
    envs.reset(0)
    hidden = learner.begin_round(N_ENVS)
    for step in range(HORIZON):  # seeds germinate on the way: every step is checked
        with SyncGuard(max_transfers=ONE_PER_PHASE) as guard:
            hidden = _env_step(envs, learner, step, hidden)
        assert dict(guard.tally.transfers) == ONE_PER_PHASE, step


#: Rule-based policies read the masks on the host: one more transfer, in their phase.
RULES_READ_MASKS = {"heuristic": 2, "eager": 2, "random": 1, "static": 1}


@pytest.mark.parametrize("policy", sorted(RULES_READ_MASKS))
def test_baseline_policies_keep_the_step_sync_free(policy: str) -> None:
    envs, learner = _parts(_config(**{"policy.kind": policy, "run.batch_envs": True}))
    envs.reset(0)
    hidden = learner.begin_round(N_ENVS)
    allowed = {**ONE_PER_PHASE, "policy": RULES_READ_MASKS[policy]}
    for step in range(HORIZON):
        with SyncGuard(max_transfers=allowed):
            hidden = _env_step(envs, learner, step, hidden)


def test_the_ppo_update_reads_the_device_once_per_epoch() -> None:
    cfg = _config()
    envs, learner = _parts(cfg)
    envs.reset(0)
    hidden = learner.begin_round(N_ENVS)
    for step in range(HORIZON):
        hidden = _env_step(envs, learner, step, hidden)
    with SyncGuard(max_transfers={"ppo": cfg.ppo.update_epochs}) as guard:
        metrics = learner.end_round(rnd=0)
    assert metrics is not None and metrics.epochs_run == cfg.ppo.update_epochs
    assert guard.tally.transfers["ppo"] == cfg.ppo.update_epochs


def test_the_guard_catches_a_stray_read_and_a_library_check() -> None:
    """The guard itself: ``.item()``, ``.tolist()`` and ``F.one_hot``'s range check (a
    host read inside the library) all fail it; a read through host_copy does not."""
    from esper.core.transfer import host_copy

    t = torch.arange(4)
    for stray in (
        lambda: t.sum().item(),
        lambda: t.tolist(),
        lambda: torch.nn.functional.one_hot(t, 5),
    ):
        with pytest.raises(HostSyncError), SyncGuard():
            stray()
    with SyncGuard(max_transfers={"other": 1}) as guard:
        assert host_copy(t) == [0, 1, 2, 3]
    assert guard.tally.transfers["other"] == 1


def test_a_host_resident_tensor_is_read_without_a_transfer_and_a_device_one_is_refused() -> None:
    from esper.core.transfer import host_array

    with SyncGuard(max_transfers={}) as guard:
        assert host_array(torch.arange(3)).tolist() == [0, 1, 2]
    assert not guard.tally.transfers
    with pytest.raises(ValueError, match="meta tensor"):
        host_array(torch.empty(3, device="meta"))


def test_the_counter_tells_launches_from_views() -> None:
    x = torch.randn(4, 4)
    with LaunchCounter() as counter:
        y = x.view(16).reshape(4, 4).t()  # views: no kernel
        z = (y + 1).relu()  # two kernels
    assert counter.tally.total() == 2 and z.shape == (4, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("batch_envs", [False, True], ids=["per-env", "batched"])
def test_cuda_step_and_update_never_sync_outside_host_copy(batch_envs: bool) -> None:
    """On the device itself: CUDA's sync debug mode raises on any synchronising call
    (host_copy lifts it for its own transfer)."""
    cfg = _config(**{"run.batch_envs": batch_envs, "run.device": "cuda"})
    assert cfg.policy.kind == PolicyKind.PPO
    envs, learner = _parts(cfg)
    envs.reset(0)
    hidden = learner.begin_round(N_ENVS)
    _env_step(envs, learner, 0, hidden)  # warm-up: first-use allocations may sync
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1, HORIZON):
            hidden = _env_step(envs, learner, step, hidden)
        learner.end_round(rnd=0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
