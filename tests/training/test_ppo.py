"""PPO update: learns a factored contextual bandit; gates, masking, schedule, KL stop."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor

from esper.config import PPOConfig
from esper.core.constants import ALL_BLUEPRINTS, CNN_BLUEPRINTS, HEAD_NAMES
from esper.core.enums import LifecycleOp, Topology
from esper.policy.actions import ActionSpace
from esper.policy.masks import ActionMasks
from esper.policy.network import FactoredActorCritic
from esper.training.learning.buffer import RolloutBuffer
from esper.training.learning.normalizers import ValueNormalizer
from esper.training.learning.ppo import PPOUpdater

SPACE = ActionSpace(("s0", "s1"), Topology.CNN)
SIZES = SPACE.head_sizes
OBS_DIM = 4
HIDDEN = 32
BEST_BLUEPRINT = 2
OP, BLUEPRINT = HEAD_NAMES.index("op"), HEAD_NAMES.index("blueprint")


@pytest.fixture(autouse=True)
def _single_thread() -> Iterator[None]:
    """Tiny tensors: intra-op threads only add contention (10x slower on a busy box)."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _net(seed: int = 0) -> FactoredActorCritic:
    torch.manual_seed(seed)
    return FactoredActorCritic(
        OBS_DIM, SPACE, feature_dim=32, lstm_hidden=HIDDEN, blueprint_embed_dim=2
    )


def _masks(n: int) -> ActionMasks:
    fields = {
        name: torch.ones((n, SIZES["op"], size) if name == "slot" else (n, size), dtype=torch.bool)
        for name, size in SIZES.items()
    }
    fields["blueprint"][:, len(CNN_BLUEPRINTS) :] = False
    assert len(ALL_BLUEPRINTS) == SIZES["blueprint"]
    return ActionMasks(**fields)


def _obs(context: Tensor) -> Tensor:
    obs = torch.zeros(context.shape[0], OBS_DIM)
    obs[torch.arange(context.shape[0]), context] = 1.0
    return obs


def _bandit_reward(context: Tensor, actions: Tensor) -> Tensor:
    """Context 0: GERMINATE blueprint 2 (other blueprints pay a little). Context 1: WAIT."""
    op, bp = actions[:, OP], actions[:, BLUEPRINT]
    germ = op == LifecycleOp.GERMINATE
    r0 = torch.where(germ, torch.where(bp == BEST_BLUEPRINT, 1.0, 0.2), 0.0)
    r1 = (op == LifecycleOp.WAIT).float()
    return torch.where(context == 0, r0, r1)


def _rollout(
    net: FactoredActorCritic,
    vn: ValueNormalizer,
    buf: RolloutBuffer,
    gen: torch.Generator,
    *,
    store_hidden: bool = False,
) -> Tensor:
    n, t = buf.n_envs, buf.horizon
    hidden = net.initial_hidden(n, "cpu")
    buf.start(hidden)
    masks = _masks(n)
    bp_ids = torch.zeros(n, SPACE.n_slots, dtype=torch.long)
    rewards = []
    for step in range(t):
        context = torch.randint(0, 2, (n,), generator=gen)
        obs = _obs(context)
        out = net.act(obs, bp_ids, masks, hidden, generator=gen)
        hidden = out.hidden
        r = _bandit_reward(context, out.actions)
        rewards.append(r)
        buf.add(
            step,
            obs=obs,
            blueprint_ids=bp_ids,
            masks=masks,
            actions=out.actions,
            log_probs=out.log_probs,
            values=vn.denormalize(out.value),
            rewards_normalized=r,
            rewards_raw=r,
            dones=torch.zeros(n, dtype=torch.bool),
            hidden=out.hidden if store_hidden else None,
        )
    last = vn.denormalize(net.predict_value(_obs(torch.zeros(n, dtype=torch.long)), bp_ids, hidden))
    buf.compute_returns_and_advantages(last, gamma=0.0, gae_lambda=0.95)
    return torch.stack(rewards)


def _setup(
    n: int = 32, t: int = 4, **cfg: object
) -> tuple[FactoredActorCritic, ValueNormalizer, RolloutBuffer, PPOUpdater]:
    net = _net()
    vn = ValueNormalizer()
    buf = RolloutBuffer(n, t, OBS_DIM, SPACE.n_slots, SIZES, HIDDEN, "cpu")
    upd = PPOUpdater(net, PPOConfig(**cfg), value_normalizer=vn)  # type: ignore[arg-type]
    return net, vn, buf, upd


def _params(net: torch.nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def test_ppo_learns_a_factored_contextual_bandit() -> None:
    net, vn, buf, upd = _setup(lr=3e-3, entropy_coef=0.01, entropy_coef_floor=0.0, target_kl=0.1)
    gen = torch.Generator().manual_seed(1)
    first = _rollout(net, vn, buf, gen).mean().item()
    for rnd in range(40):
        metrics = upd.update(buf, round_index=rnd, total_rounds=40)
        assert not metrics.skipped and metrics.epochs_run >= 1
        mean_reward = _rollout(net, vn, buf, gen).mean().item()
    assert mean_reward > 0.85 > first
    masks = _masks(2)
    bp_ids = torch.zeros(2, SPACE.n_slots, dtype=torch.long)
    hidden = net.initial_hidden(2, "cpu")
    greedy = net.act(_obs(torch.tensor([0, 1])), bp_ids, masks, hidden, deterministic=True)
    assert greedy.actions[0, OP].item() == LifecycleOp.GERMINATE
    assert greedy.actions[0, BLUEPRINT].item() == BEST_BLUEPRINT
    assert greedy.actions[1, OP].item() == LifecycleOp.WAIT
    assert metrics.value_mean == pytest.approx(metrics.return_mean, abs=0.1)  # critic learnt


def test_non_finite_loss_skips_the_update_and_leaves_parameters_unchanged() -> None:
    net, vn, buf, upd = _setup(n=8)
    _rollout(net, vn, buf, torch.Generator().manual_seed(0))
    before, vn_before = _params(net), vn.state_dict()
    m = upd.update(buf, round_index=0, total_rounds=1, loss_hook=lambda loss: loss * math.nan)
    assert m.skipped and "non-finite loss at epoch 0" in m.skip_reason and m.epochs_run == 0
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    assert upd.optimizer.state == {} or all(not s for s in upd.optimizer.state.values())
    assert torch.equal(vn.state_dict()["second_moment"], vn_before["second_moment"])


def test_non_finite_loss_in_a_later_epoch_rolls_the_whole_update_back() -> None:
    net, vn, buf, upd = _setup(n=8, target_kl=None, minibatches=1)
    _rollout(net, vn, buf, torch.Generator().manual_seed(0))
    before = _params(net)
    calls = []

    def hook(loss: Tensor) -> Tensor:
        calls.append(1)
        return loss if len(calls) < 3 else loss + math.inf

    m = upd.update(buf, round_index=0, total_rounds=1, loss_hook=hook)
    assert m.skipped and "epoch 2" in m.skip_reason and m.epochs_run == 0
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_nan_reward_in_the_rollout_is_caught_before_anything_changes() -> None:
    net, vn, buf, upd = _setup(n=8)
    _rollout(net, vn, buf, torch.Generator().manual_seed(0))
    buf.rewards_normalized[3, 1] = math.nan
    buf.compute_returns_and_advantages(torch.zeros(8), gamma=0.9, gae_lambda=0.9)
    before = _params(net)
    m = upd.update(buf, round_index=0, total_rounds=1)
    assert m.skipped and m.skip_reason == "non-finite rollout data"
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    assert int(vn.count) == 0


def test_irrelevant_heads_get_no_gradient() -> None:
    """All-WAIT rollouts: only the op head (and shared trunk/value) may change."""
    net, _vn, buf, upd = _setup(n=8, target_kl=None)
    wait_only = _masks(8)
    wait_only.op[:, 1:] = False

    def rollout_wait() -> None:
        hidden = net.initial_hidden(8, "cpu")
        buf.start(hidden)
        bp = torch.zeros(8, 2, dtype=torch.long)
        for step in range(buf.horizon):
            obs = torch.randn(8, OBS_DIM)
            out = net.act(obs, bp, wait_only, hidden)
            hidden = out.hidden
            buf.add(
                step,
                obs=obs,
                blueprint_ids=bp,
                masks=wait_only,
                actions=out.actions,
                log_probs=out.log_probs,
                values=out.value,
                rewards_normalized=torch.randn(8),
                rewards_raw=torch.zeros(8),
                dones=torch.zeros(8, dtype=torch.bool),
            )
        buf.compute_returns_and_advantages(torch.zeros(8), gamma=0.9, gae_lambda=0.9)

    rollout_wait()
    before = _params(net)
    m = upd.update(buf, round_index=0, total_rounds=1)
    assert m.epochs_run == PPOConfig().update_epochs and not m.skipped
    after = net.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items() if k.startswith("sub_heads"))
    assert not torch.equal(after["value_head.2.weight"], before["value_head.2.weight"])
    assert math.isnan(m.entropy_slot) and math.isnan(m.clip_frac_blueprint)
    assert m.entropy_op == 0.0  # a single valid op has zero normalised entropy


def test_target_kl_stops_early() -> None:
    net, vn, buf, upd = _setup(n=16, lr=0.05, target_kl=1e-9, update_epochs=6)
    _rollout(net, vn, buf, torch.Generator().manual_seed(0))
    m = upd.update(buf, round_index=0, total_rounds=1)
    assert m.early_stopped and m.epochs_run == 1 and m.approx_kl > 1e-9


def test_entropy_schedule_anneals_linearly_to_the_floor() -> None:
    *_, upd = _setup(entropy_coef=0.05, entropy_coef_floor=0.01, entropy_anneal_rounds=4)
    coefs = [upd.entropy_coef(r, 10) for r in range(6)]
    assert coefs == pytest.approx([0.05, 0.04, 0.03, 0.02, 0.01, 0.01])
    *_, flat = _setup(entropy_coef=0.05, entropy_coef_floor=0.01, entropy_anneal_rounds=0)
    assert flat.entropy_coef(100, 200) == 0.05


def test_metrics_and_optimizer_state_round_trip() -> None:
    net, vn, buf, upd = _setup(n=8)
    _rollout(net, vn, buf, torch.Generator().manual_seed(0))
    m = upd.update(buf, round_index=0, total_rounds=1)
    assert m.n_transitions == 8 * 4 and m.lr == pytest.approx(3e-4)
    # minibatches counts gradient steps: 4 per completed epoch, plus a partial epoch's.
    assert 4 * m.epochs_run <= m.minibatches < 4 * (m.epochs_run + 1) and m.grad_norm > 0
    assert 0.0 <= m.clip_frac <= 1.0 and m.ratio_max > 0 and m.entropy_op > 0
    other = PPOUpdater(_net(), PPOConfig(), value_normalizer=ValueNormalizer())
    other.load_state_dict(upd.state_dict())
    state = other.optimizer.state_dict()["state"]
    assert state and all(
        torch.equal(s["exp_avg"], upd.optimizer.state_dict()["state"][k]["exp_avg"])
        for k, s in state.items()
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_update_runs_on_cuda_and_the_gate_holds() -> None:
    net, vn, buf, _ = _setup(n=8)
    _rollout(net, vn, buf, torch.Generator().manual_seed(0))
    dev = torch.device("cuda")
    gpu_net = _net().to(dev)
    gpu_net.load_state_dict(net.state_dict())
    gvn = ValueNormalizer(device=dev)
    gbuf = RolloutBuffer(8, 4, OBS_DIM, SPACE.n_slots, SIZES, HIDDEN, dev)
    gbuf.start((buf.hidden0[0].to(dev), buf.hidden0[1].to(dev)))
    masks = buf.stacked_masks()
    for step in range(4):
        gbuf.add(
            step,
            obs=buf.obs[:, step].to(dev),
            blueprint_ids=buf.blueprint_ids[:, step].to(dev),
            masks=masks[:, step].to(dev),
            actions=buf.actions[:, step].to(dev),
            log_probs=buf.log_probs[:, step].to(dev),
            values=buf.values[:, step].to(dev),
            rewards_normalized=buf.rewards_normalized[:, step].to(dev),
            rewards_raw=buf.rewards_raw[:, step].to(dev),
            dones=buf.dones[:, step].to(dev),
        )
    gbuf.compute_returns_and_advantages(torch.zeros(8, device=dev), gamma=0.0, gae_lambda=0.95)
    gupd = PPOUpdater(gpu_net, PPOConfig(), value_normalizer=gvn)
    before = _params(gpu_net)
    m = gupd.update(gbuf, round_index=0, total_rounds=1, loss_hook=lambda x: x * math.nan)
    assert m.skipped
    assert all(torch.equal(v, before[k]) for k, v in gpu_net.state_dict().items())
    m = gupd.update(gbuf, round_index=0, total_rounds=1)
    assert not m.skipped and m.epochs_run >= 1 and math.isfinite(m.policy_loss)


def _random_context_rollout(t: int, chunk_length: int, **cfg: object):
    net, vn, buf, upd = _setup(n=6, t=t, chunk_length=chunk_length, **cfg)
    _rollout(net, vn, buf, torch.Generator().manual_seed(1), store_hidden=True)
    return net, vn, buf, upd


@pytest.mark.parametrize("chunk_length", [1, 3, 7])
def test_chunks_replay_the_rollout_from_stored_recurrent_states(chunk_length: int) -> None:
    """Each chunk resumes the LSTM from the state stored at collection: the replayed
    log-probs and values equal the collected ones (ratio 1 before any gradient step)."""
    from esper.training.learning.ppo import _Chunks

    net, vn, buf, _upd = _random_context_rollout(7, chunk_length)
    ch = _Chunks(buf, chunk_length, buf.advantages, buf.returns)
    idx = torch.arange(ch.n_chunks)
    with torch.no_grad():
        out = net.evaluate_actions(
            ch.obs, ch.blueprint_ids, ch.masks_at(idx), ch.actions, ch.hidden0
        )
    valid = ch.valid
    torch.testing.assert_close(out.log_probs[valid], ch.old_log_probs[valid], atol=1e-5, rtol=0)
    stored = vn.normalize(buf.values)
    pad = (-7) % chunk_length
    stored = torch.cat([stored, stored.new_zeros(6, pad)], dim=1).reshape(ch.n_chunks, -1)
    torch.testing.assert_close(out.values[valid], stored[valid], atol=1e-5, rtol=0)


def test_update_takes_one_step_per_minibatch_per_epoch() -> None:
    *_, buf, upd = _random_context_rollout(8, 4, minibatches=3, update_epochs=5, target_kl=None)
    m = upd.update(buf, round_index=0, total_rounds=1)
    assert m.epochs_run == 5 and m.minibatches == 15 and not m.skipped


def test_value_scale_change_keeps_raw_predictions() -> None:
    """PopArt-style: after the return scale moves, V in raw units is unchanged."""
    net, vn, buf, upd = _random_context_rollout(8, 4)
    buf.returns.mul_(50.0)  # a return scale far from the normaliser's start
    obs, bp = buf.obs[:, 0], buf.blueprint_ids[:, 0]
    hidden = net.initial_hidden(6, "cpu")
    before = vn.denormalize(net.predict_value(obs, bp, hidden))
    upd._value_targets(buf)
    assert float(vn.scale) > 10.0
    after = vn.denormalize(net.predict_value(obs, bp, hidden))
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)


def test_learning_rate_schedule_anneals_to_the_final_fraction() -> None:
    *_, upd = _setup(lr=1e-3, lr_anneal_rounds=4, lr_final_fraction=0.25)
    assert [upd.learning_rate(r) for r in (0, 2, 4, 9)] == pytest.approx(
        [1e-3, 0.625e-3, 0.25e-3, 0.25e-3]
    )
    *_, buf, upd2 = _random_context_rollout(8, 4, lr=1e-3, lr_anneal_rounds=4)
    assert upd2.update(buf, round_index=2, total_rounds=4).lr == pytest.approx(0.55e-3)


def test_head_entropy_weights_scale_one_heads_bonus() -> None:
    """Weights of 1 are the unweighted update exactly; a slot weight changes the step."""
    from esper.core.constants import HEAD_NAMES

    ones = dict.fromkeys(HEAD_NAMES, 1.0)
    params = {}
    for label, weights in (("none", {}), ("ones", ones), ("slot", {"slot": 20.0})):
        net, _vn, buf, upd = _random_context_rollout(8, 4, head_entropy_weights=weights)
        m = upd.update(buf, round_index=0, total_rounds=1)
        assert not m.skipped
        params[label] = _params(net)
    assert all(torch.equal(params["none"][k], v) for k, v in params["ones"].items())
    assert any(not torch.equal(params["none"][k], v) for k, v in params["slot"].items())
