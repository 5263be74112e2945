"""Reward families: breakdown totals are exact sums; the spec's worked cases hold."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest
from _machinery import machinery_config
from _reward_support import reward_inputs as _inputs
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.config import Config, RewardConfig, with_overrides
from esper.core.enums import LifecycleOp, RewardFamily, SeedStage
from esper.core.records import SlotReport
from esper.data.tasks import load_task
from esper.telemetry import events as ev
from esper.telemetry.events import REWARD_COMPONENTS, RewardComputed
from esper.telemetry.memory_hub import MemoryHub
from esper.training.envs.rewards import RewardInputs, SeedCredit, compute_reward, env_potential
from esper.training.run import train

GAMMA = 0.995


#: The default reward weights (``[reward]``), which these tests check against.
def reward_config(**changes: object) -> RewardConfig:
    """The spec's reward (contribution family, per-op shaping) with ``changes``."""
    return msgspec.structs.replace(machinery_config().reward, **changes)


R = reward_config()


def _seed(stage: SeedStage = SeedStage.BLENDING, alpha: float = 1.0, age: int = 12) -> SlotReport:
    return SlotReport(slot_id="s0", stage=stage, seed_id="x", alpha=alpha, age_epochs=age)


def _components_sum(br: RewardComputed) -> float:
    total = 0.0
    for name in REWARD_COMPONENTS:
        total += getattr(br, name)
    return total


_finite = st.floats(-50, 50, allow_nan=False)
_maybe = st.one_of(st.just(math.nan), _finite)
_stage = st.sampled_from(list(SeedStage))


@st.composite
def reward_inputs(draw: st.DrawFn) -> RewardInputs:
    after = draw(
        st.one_of(st.none(), st.builds(_seed, _stage, st.floats(0, 1), st.integers(0, 40)))
    )
    return RewardInputs(
        op=draw(st.sampled_from(list(LifecycleOp))),
        executed=draw(st.booleans()),
        slot_before=draw(st.one_of(st.none(), st.builds(_seed, _stage, st.floats(0, 1)))),
        slot_after=after,
        contribution_pp=draw(_maybe),
        progress_pp=draw(_maybe),
        credits=tuple(
            draw(
                st.lists(
                    st.builds(
                        SeedCredit,
                        contribution_pp=_maybe,
                        progress_pp=_maybe,
                        alpha=st.floats(0, 1),
                    ),
                    max_size=3,
                )
            )
        ),
        val_acc=draw(st.floats(0, 100)),
        prev_val_acc=draw(st.one_of(st.just(math.nan), st.floats(0, 100))),
        val_loss=draw(st.one_of(st.floats(0, 20), st.just(math.inf))),
        prev_val_loss=draw(st.one_of(st.just(math.nan), st.floats(0, 20))),
        random_guess_loss=draw(st.floats(0.1, 10)),
        host_params=draw(st.integers(0, 10**6)),
        effective_params=draw(st.integers(0, 3 * 10**6)),
        alpha_change=draw(st.floats(-1, 1)),
        potential_prev=draw(st.floats(0, 15)),
        potential_now=draw(st.floats(0, 15)),
        is_terminal=draw(st.booleans()),
        final_acc=draw(st.one_of(st.just(math.nan), st.floats(0, 100))),
        rollback_penalty=draw(st.sampled_from([0.0, -10.0])),
        seed_params=draw(st.integers(0, 10**5)),
        prev_seed_params=draw(st.integers(0, 10**5)),
    )


@settings(max_examples=50, deadline=None)
@given(
    inp=reward_inputs(),
    family=st.sampled_from(list(RewardFamily)),
    shaping=st.booleans(),
    terminal=st.booleans(),
    anti_gaming=st.booleans(),
)
def test_total_is_the_sum_of_components_for_every_family(
    inp: RewardInputs, family: RewardFamily, shaping: bool, terminal: bool, anti_gaming: bool
) -> None:
    cfg = reward_config(family=family, shaping=shaping, terminal=terminal, anti_gaming=anti_gaming)
    br = compute_reward(inp, cfg, gamma=GAMMA)
    assert br.total == _components_sum(br)
    assert all(math.isfinite(getattr(br, n)) for n in REWARD_COMPONENTS)
    if family == RewardFamily.SPARSE:
        assert br.total == br.terminal + br.rollback_penalty
    if not terminal:
        assert br.terminal == 0.0
    if not shaping:
        assert br.stage_shaping == br.germinate_cost == br.fossilize_bonus == 0.0
        assert br.prune_penalty == 0.0
    if not anti_gaming:
        assert br.alpha_shock == 0.0


CFG = reward_config()


def test_positive_contribution_gives_positive_attribution() -> None:
    br = compute_reward(
        _inputs(slot_after=_seed(), contribution_pp=2.0, progress_pp=3.0), CFG, gamma=GAMMA
    )
    assert br.attribution == pytest.approx(R.attribution_weight * 2.0)
    assert br.attribution > 0


def test_harmful_seed_gives_negative_attribution_in_full() -> None:
    br = compute_reward(
        _inputs(slot_after=_seed(alpha=0.1), contribution_pp=-2.0, progress_pp=5.0),
        CFG,
        gamma=GAMMA,
    )
    assert br.attribution == pytest.approx(-R.harm_weight * 2.0)  # no alpha discount on harm


def test_anti_gaming_caps_credit_by_progress_and_alpha() -> None:
    no_progress = _inputs(slot_after=_seed(), contribution_pp=4.0, progress_pp=-1.0)
    assert compute_reward(no_progress, CFG, gamma=GAMMA).attribution == 0.0
    tiny_alpha = _inputs(slot_after=_seed(alpha=0.05), contribution_pp=4.0, progress_pp=4.0)
    small = compute_reward(tiny_alpha, CFG, gamma=GAMMA).attribution
    assert small == pytest.approx(R.attribution_weight * 4.0 * 0.05 / R.full_credit_alpha)
    off = reward_config(anti_gaming=False)
    assert compute_reward(no_progress, off, gamma=GAMMA).attribution == pytest.approx(0.4)


def test_credits_make_attribution_independent_of_the_op() -> None:
    credits = (SeedCredit(contribution_pp=2.0, progress_pp=2.0), SeedCredit(contribution_pp=-1.0))
    wait = compute_reward(_inputs(credits=credits), CFG, gamma=GAMMA)
    adv = compute_reward(_inputs(op=LifecycleOp.ADVANCE, credits=credits), CFG, gamma=GAMMA)
    assert wait.attribution == adv.attribution == pytest.approx(0.2 - R.harm_weight)


def test_prune_of_a_young_seed_costs_more_than_an_old_one() -> None:
    def prune(age: int, c: float) -> float:
        before = _seed(age=age)
        after = SlotReport(slot_id="s0", stage=SeedStage.PRUNED)
        inp = _inputs(op=LifecycleOp.PRUNE, slot_before=before, slot_after=after, contribution_pp=c)
        br = compute_reward(inp, CFG, gamma=GAMMA)
        assert br.attribution == 0.0  # the pruned seed earns nothing any more
        return br.prune_penalty

    young, old = prune(5, 0.0), prune(30, 0.0)
    assert young < old < 0
    assert young == pytest.approx(R.prune_cost + R.prune_young_penalty * 0.5)
    assert prune(30, 3.0) < old  # pruning a helpful seed costs more
    assert prune(30, -3.0) == old  # a harmful seed costs only the base


def test_fossilize_bonus_grows_with_contribution() -> None:
    def fossilize(c: float) -> float:
        inp = _inputs(
            op=LifecycleOp.FOSSILIZE,
            slot_before=_seed(SeedStage.HOLDING),
            slot_after=_seed(SeedStage.FOSSILIZED),
            contribution_pp=c,
        )
        return compute_reward(inp, CFG, gamma=GAMMA).fossilize_bonus

    assert 0 < fossilize(1.0) < fossilize(3.0) < fossilize(6.0)
    assert fossilize(3.0) == pytest.approx(3 * R.fossilize_bonus_per_pp)
    assert fossilize(0.0) == R.fossilize_useless_penalty
    assert fossilize(-2.0) < fossilize(0.0) < 0
    assert fossilize(math.nan) == R.fossilize_useless_penalty


def test_rent_stage_shaping_terminal_and_invalid() -> None:
    grown = _inputs(effective_params=15_000)  # g = 0.5
    assert compute_reward(grown, CFG, gamma=GAMMA).rent == pytest.approx(-0.5 * math.log(1.5))
    huge = _inputs(effective_params=10**9)
    assert compute_reward(huge, CFG, gamma=GAMMA).rent == -1.5  # capped
    phi0 = env_potential([None, SlotReport(slot_id="a", stage=SeedStage.DORMANT)])
    phi1 = env_potential([_seed(SeedStage.TRAINING), _seed(SeedStage.GERMINATED)])
    assert phi0 == 0.0 and phi1 == 3.0
    shaped = compute_reward(_inputs(potential_prev=phi0, potential_now=phi1), CFG, gamma=GAMMA)
    assert shaped.stage_shaping == pytest.approx(0.3 * (GAMMA * 3.0 - 0.0))
    end = compute_reward(_inputs(is_terminal=True, final_acc=90.0), CFG, gamma=GAMMA)
    assert end.terminal == pytest.approx(0.05 * 0.9)
    bad = compute_reward(_inputs(op=LifecycleOp.ADVANCE, executed=False), CFG, gamma=GAMMA)
    assert bad.invalid_penalty == R.invalid_action_penalty
    assert compute_reward(_inputs(executed=False), CFG, gamma=GAMMA).invalid_penalty == 0.0


def test_alpha_shock_penalises_only_large_jumps() -> None:
    assert compute_reward(_inputs(alpha_change=0.2), CFG, gamma=GAMMA).alpha_shock == 0.0
    jump = compute_reward(_inputs(alpha_change=-1.0), CFG, gamma=GAMMA).alpha_shock
    assert jump == pytest.approx(-R.alpha_shock_weight * (1.0 - R.alpha_shock_free))


def test_loss_family_rewards_loss_improvement() -> None:
    cfg = reward_config(family=RewardFamily.LOSS)
    better = compute_reward(_inputs(prev_val_loss=1.0, val_loss=0.8), cfg, gamma=GAMMA)
    worse = compute_reward(_inputs(prev_val_loss=0.8, val_loss=1.0), cfg, gamma=GAMMA)
    assert better.loss_delta == pytest.approx(R.loss_delta_weight * 0.2 / math.log(10))
    assert worse.loss_delta == pytest.approx(-better.loss_delta)
    assert better.attribution == 0.0
    blowup = compute_reward(_inputs(val_loss=math.inf, is_terminal=True), cfg, gamma=GAMMA)
    assert blowup.loss_delta == -R.loss_delta_weight * R.loss_delta_clip
    assert blowup.terminal == -0.05 * R.loss_terminal_clip


def test_sparse_family_pays_only_at_the_end() -> None:
    cfg = reward_config(family=RewardFamily.SPARSE)
    mid = _inputs(op=LifecycleOp.GERMINATE, slot_after=_seed(), contribution_pp=5.0)
    assert compute_reward(mid, cfg, gamma=GAMMA).total == 0.0
    end = compute_reward(_inputs(is_terminal=True, val_acc=70.0), cfg, gamma=GAMMA)
    assert end.total == end.terminal == pytest.approx(0.05 * 0.7)


@pytest.mark.parametrize("potentials", [[0, 1, 2, 3, 4, 5], [0, 1, 0, 2, 3, 3], [0, 5, 5, 5, 5, 5]])
def test_episode_shaping_telescopes_to_zero_whatever_the_end_state(potentials: list[int]) -> None:
    """phi(absorbing end) = 0: with gamma 1 an episode's stage shaping sums to exactly 0,
    so ending with seeds parked in late stages cannot be farmed."""
    cfg = reward_config()
    total = 0.0
    for t in range(1, len(potentials)):
        inp = _inputs(
            potential_prev=float(potentials[t - 1]),
            potential_now=float(potentials[t]),
            is_terminal=t == len(potentials) - 1,
            final_acc=70.0,
        )
        total += compute_reward(inp, cfg, gamma=1.0).stage_shaping
    assert total == pytest.approx(0.0, abs=1e-12)


# --- accuracy family ----------------------------------------------------------------

ACC = reward_config(family=RewardFamily.ACCURACY)
HOST = 1_702


def _episode(accs: list[float], seeds: list[int], cfg: RewardConfig = ACC) -> list[RewardComputed]:
    """One episode's rewards for the given per-step accuracies and live seed params."""
    out = []
    prev_acc, prev_seeds = math.nan, 0
    for t, (acc, n) in enumerate(zip(accs, seeds, strict=True)):
        inp = _inputs(
            val_acc=acc,
            prev_val_acc=prev_acc,
            host_params=HOST,
            seed_params=n,
            prev_seed_params=prev_seeds,
            is_terminal=t == len(accs) - 1,
            final_acc=acc if t == len(accs) - 1 else math.nan,
        )
        out.append(compute_reward(inp, cfg, gamma=1.0))
        prev_acc, prev_seeds = acc, n
    return out


def test_accuracy_family_telescopes_to_final_gain_minus_final_parameter_cost() -> None:
    """Whatever the path (grow, prune, regrow), an episode pays accuracy_weight x (final -
    first accuracy) and param_cost_weight x final seed params / host params."""
    accs = [20.0, 45.0, 61.5, 58.0, 70.25, 73.5]
    seeds = [0, 296, 296, 0, 592, 460]
    rewards = _episode(accs, seeds)
    assert sum(b.attribution for b in rewards) == pytest.approx(0.1 * (73.5 - 20.0))
    assert sum(b.rent for b in rewards) == pytest.approx(-ACC.param_cost_weight * 460 / HOST)
    assert rewards[0].attribution == 0.0  # no previous accuracy: nothing to credit
    assert sum(b.terminal for b in rewards) == pytest.approx(0.05 * 0.735)


def test_accuracy_family_parameter_cost_germinate_pays_prune_refunds() -> None:
    cfg = reward_config(family=RewardFamily.ACCURACY, param_cost_weight=0.5)
    grow = compute_reward(_inputs(host_params=1000, seed_params=300), cfg, gamma=GAMMA)
    assert grow.rent == pytest.approx(-0.5 * 0.3)
    prune = compute_reward(
        _inputs(host_params=1000, seed_params=0, prev_seed_params=300), cfg, gamma=GAMMA
    )
    assert prune.rent == pytest.approx(0.5 * 0.3)
    keep = compute_reward(
        _inputs(host_params=1000, seed_params=300, prev_seed_params=300), cfg, gamma=GAMMA
    )
    assert keep.rent == 0.0  # no per-step rent: a kept seed is paid for once


def test_accuracy_family_cannot_be_farmed_by_leave_one_out_contribution() -> None:
    """A co-adapted seed with a large leave-one-out contribution earns nothing more: only
    the env's accuracy and its size count. The contribution family pays it."""
    plain = _inputs(slot_after=_seed(), seed_params=8, prev_seed_params=8)
    farmed = _inputs(
        op=LifecycleOp.FOSSILIZE,
        slot_before=_seed(SeedStage.HOLDING),
        slot_after=_seed(SeedStage.FOSSILIZED),
        contribution_pp=5.3,
        progress_pp=20.0,
        credits=(SeedCredit(contribution_pp=5.3, progress_pp=20.0),),
        seed_params=8,
        prev_seed_params=8,
    )
    acc = {
        name: compute_reward(inp, ACC, gamma=GAMMA) for name, inp in (("p", plain), ("f", farmed))
    }
    assert acc["f"].attribution == acc["p"].attribution == pytest.approx(0.1 * (80.0 - 79.0))
    assert acc["f"].fossilize_bonus == 0.0 and acc["f"].alpha_shock == 0.0
    assert acc["f"].total - acc["f"].stage_shaping == acc["p"].total - acc["p"].stage_shaping
    contribution = compute_reward(farmed, CFG, gamma=GAMMA)
    assert contribution.attribution > acc["f"].attribution and contribution.fossilize_bonus > 0


def test_eager_growth_out_earns_the_static_host_iff_it_pays_in_accuracy() -> None:
    """Same host (same first-epoch accuracy): growing earns more than staying static
    exactly when the accuracy gained beats the parameters' cost (break-even
    param_cost_weight / accuracy_weight pp per doubling of the host)."""
    cfg = reward_config(family=RewardFamily.ACCURACY, shaping=False)
    static = sum(b.total for b in _episode([30.0, 60.0, 72.0], [0, 0, 0], cfg))
    breakeven = cfg.param_cost_weight / cfg.accuracy_weight * 296 / HOST
    for gain in (-0.5, 0.0, 0.5 * breakeven, 1.5 * breakeven, 1.4):
        grown = sum(b.total for b in _episode([30.0, 60.0, 72.0 + gain], [296, 296, 296], cfg))
        assert (grown > static) == (gain > breakeven), gain


@pytest.mark.parametrize(
    ("val_acc", "prev_val_acc", "host_params"),
    [(math.nan, 70.0, HOST), (70.0, math.nan, HOST), (math.nan, math.nan, HOST), (70.0, 60.0, 0)],
)
def test_accuracy_family_is_nan_safe(val_acc: float, prev_val_acc: float, host_params: int) -> None:
    inp = _inputs(
        val_acc=val_acc,
        prev_val_acc=prev_val_acc,
        host_params=host_params,
        seed_params=296,
        is_terminal=True,
    )
    br = compute_reward(inp, ACC, gamma=GAMMA)
    assert all(math.isfinite(getattr(br, n)) for n in REWARD_COMPONENTS)
    assert br.total == _components_sum(br)
    if not math.isfinite(val_acc - prev_val_acc):
        assert br.attribution == 0.0
    if host_params == 0:
        assert br.rent == 0.0


def test_trainer_pays_the_accuracy_family_as_telescoping_sums(tmp_path: Path) -> None:
    """End to end through the trainer's reward inputs: per env-episode the accuracy
    credit sums to accuracy_weight x (last - first validation accuracy) and the parameter
    cost follows the live seed parameters step by step (env_step is emitted after the
    action)."""
    cfg = with_overrides(
        Config(),
        {
            "reward.family": "accuracy",
            "run.n_envs": 2,
            "run.rounds": 1,
            "run.episode_length": 6,
            "task.train_samples_per_env": 64,
            "task.val_samples": 64,
            "policy.feature_dim": 16,
            "policy.lstm_hidden": 16,
        },
    )
    hub = MemoryHub(run_id="acc")
    train(cfg, telemetry=hub, data=load_task(cfg.task, seed=0), save=tmp_path / "c.pt")
    steps = {(e.env, e.step): e for e in hub.events if isinstance(e, ev.EnvStep)}
    rewards = {(e.env, e.step): e for e in hub.events if isinstance(e, ev.RewardComputed)}
    grew = False
    for env in range(2):
        accs = [steps[env, t].val_acc for t in range(6)]
        seeds = [steps[env, t].seed_params for t in range(6)]
        host = steps[env, 0].host_params
        credit = sum(rewards[env, t].attribution for t in range(6))
        assert credit == pytest.approx(0.1 * (accs[-1] - accs[0]), abs=1e-9)  # the defaults
        for t in range(6):
            before = seeds[t - 1] if t else 0
            assert rewards[env, t].rent == pytest.approx(-0.05 * (seeds[t] - before) / host)
            assert rewards[env, t].fossilize_bonus == rewards[env, t].germinate_cost == 0.0
        grew = grew or max(seeds) > 0
    assert grew  # the untrained policy germinates: the cost was exercised


def test_param_cost_basis_blended_charges_only_what_reaches_the_output() -> None:
    """``reward.param_cost_basis``: ``live`` charges a seed at germination and refunds a
    prune before it blends; ``blended`` charges alpha x parameters as the seed blends in,
    so such a prune earns nothing."""
    import numpy as np

    from esper.core.enums import GerminationStyle, Initiator, ParamCostBasis, PruneReason
    from esper.telemetry.events import REWARD_COMPONENTS
    from esper.training.envs.env_factory import EnvFactory
    from esper.training.envs.rewards import compute_rewards
    from esper.training.envs.step_rewards import Target, reward_columns

    cfg = with_overrides(Config(), {"run.n_envs": 1, "task.name": "digits"})
    data = load_task(cfg.task, seed=0)
    rcfg = with_overrides(cfg, {"reward.family": "accuracy"}).reward
    w = rcfg.param_cost_weight

    def rent(env, basis: ParamCostBasis) -> float:
        """This step's parameter cost (a WAIT); the env's reward memory moves on."""
        t = env.table
        cols = reward_columns(
            t, Target.of(t.slots, np.array([-1])), np.array([int(LifecycleOp.WAIT)]),
            np.array([True]), random_guess_loss=data.spec.random_guess_loss, terminal=False,
            param_basis=basis,
        )  # fmt: skip
        return float(compute_rewards(cols, rcfg, gamma=GAMMA)[0, REWARD_COMPONENTS.index("rent")])

    for basis in ParamCostBasis:
        env = EnvFactory(cfg, data.spec).create_round(0)[0]
        slot = env.model.slot_ids[0]
        assert env.model.germinate(
            slot, "conv_heavy", GerminationStyle.LINEAR_ADD, 4, 1.0,
            seed_id="s", current_acc=50.0, initiator=Initiator.POLICY,
        )  # fmt: skip
        counts = env.model.param_counts()
        share = counts.seeds / counts.host
        live = basis == ParamCostBasis.LIVE
        assert rent(env, basis) == pytest.approx(-w * share if live else 0.0)
        if live:  # pruned before it blends: the cost comes back
            assert env.model.prune(slot, reason=PruneReason.POLICY, initiator=Initiator.POLICY)
            assert rent(env, basis) == pytest.approx(w * share)
            continue
        assert env.model.advance(slot, initiator=Initiator.POLICY)  # TRAINING
        seed = env.model.slot(slot)
        seed.life.epochs_in_stage = 10  # G2's minimum training epochs
        seed.metrics.record_gradients(0.5, counts.seeds, 0.5, counts.host)
        assert env.model.advance(slot, initiator=Initiator.POLICY)  # BLENDING over 4 epochs
        assert rent(env, basis) == 0.0  # alpha 0 still
        env.model.tick(60.0)  # alpha 1/4
        quarter = round(0.25 * counts.seeds) / counts.host
        assert rent(env, basis) == pytest.approx(-w * quarter)
