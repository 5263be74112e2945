"""The vectorized host-env boundary (training/envs/host_envs.py) and the Recorder (issue 15).

HostEnvs returns data only: it has no hub, and a rollback comes back as a value the
trainer hands to the learner. The Recorder is the one place results become events.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from esper.config import Config, with_overrides
from esper.core.enums import AmpMode, Initiator, LifecycleOp, RollbackReason, TelemetryLevel
from esper.data.tasks import load_task
from esper.policy.actions import DecodedAction, encode_action
from esper.telemetry.events import REWARD_COMPONENTS, GovernorRollback, event_tag
from esper.telemetry.memory_hub import MemoryHub
from esper.training.envs.counterfactual import Attribution
from esper.training.envs.env_results import Epoch, PhaseTimes, Rollback, Transitions
from esper.training.envs.host_envs import HostEnvs
from esper.training.loop.faults import Fault, FaultKind, FaultPlan
from esper.training.loop.recorder import Recorder
from esper.training.loop.run_setup import action_space_for
from esper.training.passes.batch_ops import StepStats
from esper.training.passes.host_batching import snapshot_rows

N_ENVS = 2
HORIZON = 4


def _config(**overrides: Any) -> Config:
    base = {
        "run.n_envs": N_ENVS,
        "run.episode_length": HORIZON,
        "task.train_samples_per_env": 128,
        "task.val_samples": 128,
    }
    base.update(overrides)
    return with_overrides(Config(), base)


def _envs(cfg: Config, faults: FaultPlan | None = None) -> HostEnvs:
    task = load_task(cfg.task, seed=cfg.run.seed)
    return HostEnvs(
        cfg,
        task,
        space=action_space_for(cfg, task),
        policy_device=torch.device("cpu"),
        amp=AmpMode.OFF,
        initiator=Initiator.POLICY,
        faults=faults,
    )


def _germinate(envs: HostEnvs) -> DecodedAction:
    slot = envs.space.slot_ids[0]
    return DecodedAction(op=LifecycleOp.GERMINATE, slot_id=slot, blueprint="conv_light")


def _heads(envs: HostEnvs, actions: list[DecodedAction]) -> np.ndarray:
    """The actions as the policy's head indices [N, H]."""
    return np.array([encode_action(a, envs.space) for a in actions], dtype=np.int64)


WAIT = DecodedAction(op=LifecycleOp.WAIT)


def test_host_envs_step_through_an_episode_with_data_only() -> None:
    envs = _envs(_config())
    assert not hasattr(envs, "hub")
    envs.reset(0)
    totals = np.zeros(N_ENVS)
    for step in range(HORIZON):
        epoch = envs.advance(0, step, PhaseTimes())
        assert ((epoch.stats.val_acc >= 0.0) & (epoch.stats.val_acc <= 100.0)).all()
        assert epoch.rollbacks == [] and epoch.stats.val_acc.shape == (N_ENVS,)
        obs = envs.observe(step)
        assert obs.obs.shape[0] == N_ENVS and obs.masks.op.shape[0] == N_ENVS
        actions = [_germinate(envs) if step == 0 else WAIT] * N_ENVS
        transitions = envs.step(_heads(envs, actions), step)
        assert np.isfinite(transitions.totals).all()
        totals += transitions.totals
        if step == 0:  # the germination's lifecycle records come back with the step
            assert transitions.executed.all()
            germinated = [r for r in transitions.records if type(r).__name__ == "SeedGerminated"]
            # placed where they happened: round, global env, step
            assert [(r.round, r.env, r.step) for r in germinated] == [
                (0, i, 0) for i in range(N_ENVS)
            ]
    s = envs.summaries()
    assert s.episode["seeds_germinated"].tolist() == [1] * N_ENVS
    assert (s.seed_params > 0).all() and s.active_seeds.tolist() == [1] * N_ENVS
    # the episode reward is the sum of the step rewards the envs returned
    assert np.array_equal(s.episode["reward_sum"], totals)


def test_only_a_change_in_seeds_sends_an_env_to_its_optimizers_and_store() -> None:
    """A germination or prune changes an env's modules (its seed optimizers are brought in
    line, a batched pass adopts its seeds); an ADVANCE only checks a gate and moves a
    stage, so the env is left alone however many records it reports."""
    envs = _envs(_config())
    envs.reset(0)
    t = envs.t
    slot = envs.space.slot_ids[0]
    advance = DecodedAction(op=LifecycleOp.ADVANCE, slot_id=slot)
    prune = DecodedAction(op=LifecycleOp.PRUNE, slot_id=slot, alpha_speed=0)
    for step, actions in enumerate([[_germinate(envs)] * 2, [advance, WAIT], [prune, WAIT]]):
        envs.advance(0, step, PhaseTimes())
        t.unadopted.clear()
        transitions = envs.step(_heads(envs, actions), step)
        kinds = {type(r).__name__ for r in transitions.records if r.env == 0}
        if actions[0] is advance:  # a gate checked (G2, passed or not: records either way)
            assert "GateEvaluated" in kinds and kinds <= {"GateEvaluated", "SeedStageChanged"}
            assert t.unadopted == set()
        else:
            assert transitions.executed.all()
            assert t.unadopted == ({0, 1} if step == 0 else {0})
        assert bool(envs.states[0].seed_optimizers) == (actions[0] is not prune)


def test_table_and_per_env_ops_of_one_step_report_in_env_order() -> None:
    """ADVANCE runs over all the envs choosing it at once and GERMINATE / PRUNE per env,
    yet the step's records come back placed and in env order, as if each env had acted
    alone in turn."""
    envs = _envs(_config(**{"run.n_envs": 4}))
    envs.reset(0)
    slot = envs.space.slot_ids[0]
    advance = DecodedAction(op=LifecycleOp.ADVANCE, slot_id=slot)
    prune = DecodedAction(op=LifecycleOp.PRUNE, slot_id=slot, alpha_speed=0)
    plan = [[_germinate(envs)] * 3 + [WAIT], [advance, prune, advance, _germinate(envs)]]
    for step, actions in enumerate(plan):
        envs.advance(0, step, PhaseTimes())
        transitions = envs.step(_heads(envs, actions), step)
    assert transitions.executed[[1, 3]].all()
    placed = [(r.round, r.env, r.step) for r in transitions.records]
    assert placed == sorted(placed) and {p[2] for p in placed} == {1}
    kinds = {i: [type(r).__name__ for r in transitions.records if r.env == i] for i in range(4)}
    assert kinds[0] == kinds[2] and kinds[0][0] == "GateEvaluated"  # G1, passed or not
    assert "SeedPruned" in kinds[1] and "SeedGerminated" in kinds[3]
    # A record that counts into the episode totals cannot skip its env's reporter.
    germinated = next(r for r in transitions.records if type(r).__name__ == "SeedGerminated")
    with pytest.raises(ValueError, match="reported one by one: \\['SeedGerminated'\\]"):
        envs.t.merge(len(envs.t.records), [germinated], np.array([3]))


@pytest.mark.parametrize("strict", [False, True])
def test_advance_over_the_table_uses_each_envs_own_gates(strict: bool) -> None:
    """ADVANCE runs every advancing env's gates at once, strict where that env's model
    is (the env table's column, set with the model each round)."""
    envs = _envs(_config(**{"run.n_envs": 2, "host.strict_gates": strict}))
    envs.reset(0)
    models = [e.model.strict_gates for e in envs.states]
    assert envs.t.strict_gates.tolist() == models == [strict] * 2
    advance = DecodedAction(op=LifecycleOp.ADVANCE, slot_id=envs.space.slot_ids[0])
    for step, actions in enumerate([[_germinate(envs)] * 2, [advance] * 2]):
        envs.advance(0, step, PhaseTimes())
        transitions = envs.step(_heads(envs, actions), step)
    gates = [r for r in transitions.records if type(r).__name__ == "GateEvaluated"]
    assert [(g.env, g.strict) for g in gates] == [(0, strict), (1, strict)]
    assert {g.gate for g in gates} <= {"G1", "G2", "G3"}


def test_a_batched_snapshot_serves_each_env_its_own_host() -> None:
    """The envs due at one step share one snapshot object (their hosts cloned at once);
    each rolls back to its own entry of it."""
    envs = _envs(_config(**{"run.n_envs": 3, "run.batch_envs": True}))
    envs.reset(0)
    assert envs.t.stores is not None and envs.t.stores[1] is not None
    (store,) = envs.t.stores[1]
    guard = envs.t.guard
    snapshot_rows(store, np.array([0, 2]), step=5)
    taken = store.params.clone()
    assert guard.snapshots[0] is guard.snapshots[2] is not guard.snapshots[1]
    assert guard.entry[[0, 2]].tolist() == [0, 1] and guard.snapshot_step.tolist() == [5, 0, 5]
    with torch.no_grad():
        store.params.add_(1.0)
    env = envs.states[2]
    env.governor.rollback(
        6, env.model, reason=RollbackReason.NON_FINITE_LOSS, loss=math.nan, threshold=0.0,
        clear_optimizers=lambda: None, transitions_affected=1,
    )  # fmt: skip
    assert torch.equal(store.params[2], taken[2])  # its own entry, not env 0's
    assert torch.equal(store.params[:2], taken[:2] + 1.0)  # the others untouched


def test_a_rollback_comes_back_as_data() -> None:
    faults = FaultPlan([Fault(FaultKind.NAN, round=0, step=2, env=1)])
    envs = _envs(_config(), faults)
    envs.reset(0)
    wait = _heads(envs, [WAIT] * N_ENVS)
    for step in range(2):
        envs.advance(0, step, PhaseTimes())
        envs.step(wait, step)
    epoch = envs.advance(0, 2, PhaseTimes())
    (rb,) = epoch.rollbacks
    assert (rb.local, rb.from_step, rb.to_step) == (1, 0, 2)
    assert rb.penalty == envs.cfg.governor.penalty
    # the env is the restored host: finite metrics, counted in its episode
    assert math.isfinite(envs.summaries().val_loss[1])
    assert envs.summaries().episode["rollbacks"].tolist() == [0, 1]


def _rollback_epoch(row: int, penalty: float) -> Epoch:
    record = GovernorRollback(
        step=1, reason=RollbackReason.NON_FINITE_LOSS.value, loss=math.nan,
        threshold=math.nan, restored_to_step=0, penalized_step=0, seeds_pruned=[],
        transitions_affected=1,
        penalty=penalty,
    )  # fmt: skip
    one = np.array([50.0])
    stats = StepStats(one, one, one, one, one, np.zeros((1, 0, 2)))
    empty, nan = np.zeros((1, 0)), np.array([math.nan])
    found = Attribution(empty, empty.astype(int), empty, np.array([False]), nan, one, nan,
                        np.array([1]))  # fmt: skip
    return Epoch(stats, found, (), [], [Rollback(row, 0, 1, record, [])])


class _FakeDecision:
    op_mask = np.ones((1, 6), dtype=bool)
    value = np.zeros(1)
    log_prob = np.zeros(1)
    op_probs = np.ones((1, 6))


@pytest.mark.parametrize("pending", [True, False])
def test_recorder_puts_a_rollback_penalty_on_the_reward_it_belongs_to(pending: bool) -> None:
    """The penalty lands on the pending reward_computed, or (panic before any decision)
    on the first reward to come; the event's total stays the sum of its components."""
    hub = MemoryHub(level=TelemetryLevel.NORMAL)
    rec = Recorder(hub, reward_family="contribution")
    rec.round_started(0, n_envs=1, horizon=3, entropy_coef=0.0, lr=0.0)
    breakdown = np.zeros((1, len(REWARD_COMPONENTS) + 1))
    breakdown[0, REWARD_COMPONENTS.index("terminal")] = breakdown[0, -1] = 0.25
    step_tr = Transitions(np.zeros((1, 8), dtype=np.int64), np.array([True]), breakdown, [])
    space = action_space_for(_config(), load_task(_config().task, seed=0))
    if pending:
        rec.actions(step_tr, _FakeDecision(), np.array([0.5]), rnd=0, step=0, space=space)
    rec.epoch(_rollback_epoch(0, -10.0), rnd=0, step=1)
    if not pending:
        rec.actions(step_tr, _FakeDecision(), np.array([0.5]), rnd=0, step=1, space=space)
    rec.flush_rewards(0)
    rewards = [e for e in hub.events if event_tag(type(e)) == "reward_computed"]
    assert len(rewards) == 1
    reward: Any = rewards[0]
    assert reward.rollback_penalty == -10.0
    assert reward.total == pytest.approx(0.25 - 10.0)
    tags = [event_tag(type(e)) for e in hub.events]
    assert "governor_rollback" in tags


def test_auto_advance_grows_a_seed_from_one_germinate_and_masks_early_advance() -> None:
    """host.auto_advance through HostEnvs: one GERMINATE, then the gates pass by
    themselves (initiator system); the premature ADVANCE is never offered."""
    from esper.core.constants import G2_MIN_TRAINING_EPOCHS
    from esper.core.enums import SeedStage
    from esper.telemetry.events import SeedStageChanged

    horizon = G2_MIN_TRAINING_EPOCHS + 3
    cfg = _config(**{"host.auto_advance": True, "run.episode_length": horizon, "run.n_envs": 1})
    envs = _envs(cfg)
    envs.reset(0)
    moves: list[SeedStageChanged] = []
    slot = envs.space.slot_ids[0]
    for step in range(horizon):
        epoch = envs.advance(0, step, PhaseTimes())
        moves += [r for r in epoch.records if isinstance(r, SeedStageChanged)]
        obs = envs.observe(step)
        stage = envs.states[0].model.slot(slot).stage
        if stage == SeedStage.TRAINING:  # only reachable by G2's timing, never offered
            assert not bool(obs.masks.slot[0, LifecycleOp.ADVANCE, 0])
        action = _germinate(envs) if step == 0 else WAIT
        envs.step(_heads(envs, [action]), step)
    auto = [(m.to_stage, m.initiator) for m in moves if m.initiator == Initiator.SYSTEM]
    assert auto[:2] == [
        (SeedStage.TRAINING, Initiator.SYSTEM),
        (SeedStage.BLENDING, Initiator.SYSTEM),
    ]


def _alpha_at_last_validation(
    germinate_at: int, horizon: int, *, auto: bool, deadline: bool = True
) -> float:
    """One env germinates at ``germinate_at`` and passes each gate as early as allowed
    (by auto-advance, or by the policy's ADVANCE as soon as it is offered)."""
    cfg = _config(
        **{
            "host.auto_advance": auto,
            "run.episode_length": horizon,
            "run.n_envs": 1,
            "policy.mask_late_germination": deadline,
        }
    )
    envs = _envs(cfg)
    envs.reset(0)
    slot = envs.space.slot_ids[0]
    alpha = 0.0
    for step in range(horizon):
        envs.advance(0, step, PhaseTimes())
        alpha = envs.states[0].model.slot(slot).alpha.alpha
        masks = envs.observe(step).masks
        germinate_ok = bool(masks.slot[0, LifecycleOp.GERMINATE, 0])
        if step == germinate_at:
            assert germinate_ok or not deadline
            action = _germinate(envs)
        elif bool(masks.slot[0, LifecycleOp.ADVANCE, 0]) and not auto:
            action = DecodedAction(op=LifecycleOp.ADVANCE, slot_id=slot)
        else:
            action = WAIT
        envs.step(_heads(envs, [action]), step)
    return alpha


@pytest.mark.parametrize("auto", [True, False])
def test_the_germination_deadline_is_the_last_step_whose_seed_can_blend(auto: bool) -> None:
    """policy.mask_late_germination: GERMINATE is offered up to GERMINATE_MIN_STEPS_LEFT
    steps before the end, and a seed germinated then blends (alpha > 0 at the last
    validation) even when every gate passes as early as it can; one step later it could
    not, and GERMINATE is masked."""
    from esper.core.constants import GERMINATE_MIN_STEPS_LEFT

    horizon = GERMINATE_MIN_STEPS_LEFT + 2
    last = horizon - GERMINATE_MIN_STEPS_LEFT
    assert _alpha_at_last_validation(last, horizon, auto=auto) > 0.0
    assert _alpha_at_last_validation(last + 1, horizon, auto=auto, deadline=False) == 0.0
    cfg = _config(**{"run.episode_length": horizon, "policy.mask_late_germination": True})
    envs = _envs(cfg)
    envs.reset(0)
    for step in range(horizon):
        envs.advance(0, step, PhaseTimes())
        offered = bool(envs.observe(step).masks.op[0, LifecycleOp.GERMINATE])
        assert offered == (step <= last)
        envs.step(_heads(envs, [WAIT] * N_ENVS), step)
