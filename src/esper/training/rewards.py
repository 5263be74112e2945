"""Per-step rewards, always returned as a typed breakdown whose total is the exact sum.

Four families (``RewardConfig.family``):

* **contribution** (default): credit a seed for the accuracy it measurably adds
  (counterfactual contribution, capped by the env's progress since the seed arrived),
  potential-based stage shaping, a compute rent, an alpha-shock penalty, per-op costs
  and bonuses, and a small terminal bonus on final accuracy.
* **loss**: normalised validation-loss improvement instead of attribution; the same
  rent, shaping and costs; a terminal term on the final loss.
* **sparse**: the terminal term only (plus a rollback penalty, if one is passed in).
* **accuracy**: accuracy per parameter, with nothing to farm. Each step pays the env's
  validation-accuracy change since the last step (``attribution`` component; an episode
  sums to final minus first accuracy) and the change in live seed parameters over host
  parameters times a cost (``rent`` component; an episode sums to the final seeds'
  cost: germinating pays, pruning refunds). Besides these, only potential-based stage
  shaping (sums to 0), the terminal term and the penalties; no per-op bonuses, no
  leave-one-out credit (a host that co-adapted to a seed shows a large contribution
  without being more accurate).

Ablation switches: ``shaping`` (stage shaping and per-op shaping), ``terminal``, and
``anti_gaming`` (alpha shock, progress cap and alpha discount on positive credit). The
invalid-action penalty, rent and a governor rollback penalty are never switched off.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

from esper.config import RewardConfig
from esper.core.constants import ACC_PERCENT_SCALE, FORWARD_STAGES
from esper.core.enums import LifecycleOp, RewardFamily, SeedStage
from esper.core.records import RewardBreakdown, SlotReport, make_breakdown

NAN = math.nan

# --- Stage shaping -----------------------------------------------------------------------
#: Potential of one slot per stage; an env's potential is the sum over its slots.
STAGE_POTENTIAL: dict[SeedStage, float] = {
    SeedStage.DORMANT: 0.0,
    SeedStage.GERMINATED: 1.0,
    SeedStage.TRAINING: 2.0,
    SeedStage.BLENDING: 3.0,
    SeedStage.HOLDING: 4.0,
    SeedStage.FOSSILIZED: 5.0,
    SeedStage.PRUNED: 0.0,
    SeedStage.EMBARGOED: 0.0,
    SeedStage.RESETTING: 0.0,
}


class SeedCredit(msgspec.Struct, frozen=True, kw_only=True):
    """One measured seed's contribution, for op-independent attribution."""

    contribution_pp: float
    progress_pp: float = NAN
    alpha: float = 1.0


class RewardInputs(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one env-step's reward needs (accuracies in percent, NaN = unknown).

    ``slot_before``/``slot_after`` describe the action's target slot around the action;
    ``contribution_pp``/``progress_pp`` belong to that slot's seed. Attribution credits
    ``credits`` (every measured seed of the env) when given, otherwise the target seed.
    ``potential_prev`` must be the ``potential_now`` of this env's previous reward (0 at
    episode start) so shaping telescopes exactly; see :func:`env_potential`.
    """

    op: LifecycleOp
    executed: bool = True
    slot_before: SlotReport | None = None
    slot_after: SlotReport | None = None
    contribution_pp: float = NAN
    progress_pp: float = NAN
    credits: tuple[SeedCredit, ...] = ()
    val_acc: float = NAN
    prev_val_acc: float = NAN
    val_loss: float = NAN
    prev_val_loss: float = NAN
    random_guess_loss: float = NAN
    host_params: int = 0
    effective_params: int = 0
    #: Largest absolute alpha change of any slot this step.
    alpha_change: float = 0.0
    potential_prev: float = 0.0
    potential_now: float = 0.0
    is_terminal: bool = False
    final_acc: float = NAN
    final_loss: float = NAN
    rollback_penalty: float = 0.0
    #: Seed parameters after the action, and after the previous step's action (0 at
    #: episode start), counted as ``reward.param_cost_basis`` says (live seeds, or alpha x
    #: parameters of blended ones); the accuracy family's cost telescopes.
    seed_params: int = 0
    prev_seed_params: int = 0


def env_potential(reports: Iterable[SlotReport | None]) -> float:
    """Stage potential of an env: the sum of its slots' stage potentials."""
    return sum(STAGE_POTENTIAL[r.stage] for r in reports if r is not None)


def _finite(x: float) -> bool:
    return math.isfinite(x)


def credit(contribution_pp: float, progress_pp: float, alpha: float, cfg: RewardConfig) -> float:
    """Attribution for one seed. Harm counts in full; help is capped when anti-gaming.

    The cap: a seed cannot claim more than the env gained since it germinated (a host
    that came to depend on a seed shows a large ablation drop without any progress).
    """
    if not _finite(contribution_pp):
        return 0.0
    if contribution_pp < 0.0:
        return cfg.harm_weight * contribution_pp
    credited = contribution_pp
    if cfg.anti_gaming:
        if _finite(progress_pp):
            credited = min(credited, max(progress_pp, 0.0))
        credited *= min(1.0, max(alpha, 0.0) / cfg.full_credit_alpha)
    return cfg.attribution_weight * credited


def _target_seed_alive(inp: RewardInputs) -> SlotReport | None:
    seed = inp.slot_after
    if seed is None or not seed.active or seed.stage not in FORWARD_STAGES:
        return None
    return seed


def attribution(inp: RewardInputs, cfg: RewardConfig) -> float:
    if inp.credits:
        return sum(credit(c.contribution_pp, c.progress_pp, c.alpha, cfg) for c in inp.credits)
    seed = _target_seed_alive(inp)
    if seed is None:
        return 0.0
    return credit(inp.contribution_pp, inp.progress_pp, seed.alpha, cfg)


def stage_shaping(inp: RewardInputs, cfg: RewardConfig, *, gamma: float) -> float:
    """Potential-based shaping F = w (gamma phi(s') - phi(s)): policy-invariant.

    The state after the last step is absorbing, so its potential is 0 (Ng et al.): an
    episode's shaping telescopes to -w phi(s_0) = 0 (up to gamma), so ending with seeds
    in late stages earns nothing and the shaping cannot be farmed.
    """
    phi_next = 0.0 if inp.is_terminal else inp.potential_now
    return cfg.stage_shaping_weight * (gamma * phi_next - inp.potential_prev)


def rent(inp: RewardInputs, cfg: RewardConfig) -> float:
    """-min(w ln(1 + g), cap) with g the added effective parameters over host parameters."""
    if inp.host_params <= 0:
        return 0.0
    growth = max(inp.effective_params - inp.host_params, 0) / inp.host_params
    return -min(cfg.rent_weight * math.log1p(growth), cfg.rent_cap)


def alpha_shock(inp: RewardInputs, cfg: RewardConfig) -> float:
    """Alpha may move ``alpha_shock_free`` per step for free; beyond it, each unit costs."""
    return -cfg.alpha_shock_weight * max(0.0, abs(inp.alpha_change) - cfg.alpha_shock_free)


def fossilize_bonus(contribution_pp: float, cfg: RewardConfig) -> float:
    """Grows with the contribution (capped); a useless or harmful seed costs instead."""
    if _finite(contribution_pp) and contribution_pp > 0.0:
        return cfg.fossilize_bonus_per_pp * min(contribution_pp, cfg.fossilize_bonus_cap_pp)
    harm = contribution_pp if _finite(contribution_pp) else 0.0
    return cfg.fossilize_useless_penalty + cfg.fossilize_bonus_per_pp * harm


def prune_penalty(age_epochs: int, contribution_pp: float, cfg: RewardConfig) -> float:
    """Base cost, more for a young seed, more for a helpful one."""
    young = cfg.prune_young_age
    youth = max(young - max(age_epochs, 0), 0) / young
    helpful = max(contribution_pp, 0.0) if _finite(contribution_pp) else 0.0
    return cfg.prune_cost + cfg.prune_young_penalty * youth + cfg.prune_helpful_per_pp * helpful


def op_shaping(inp: RewardInputs, cfg: RewardConfig) -> dict[str, float]:
    """Costs and bonuses of the op just executed (nothing for a failed op)."""
    if not inp.executed:
        return {}
    if inp.op == LifecycleOp.GERMINATE:
        return {"germinate_cost": cfg.germinate_cost}
    if inp.op == LifecycleOp.FOSSILIZE:
        return {"fossilize_bonus": fossilize_bonus(inp.contribution_pp, cfg)}
    if inp.op == LifecycleOp.PRUNE:
        age = inp.slot_before.age_epochs if inp.slot_before is not None else 0
        return {"prune_penalty": prune_penalty(age, inp.contribution_pp, cfg)}
    return {}


def _invalid(inp: RewardInputs, cfg: RewardConfig) -> float:
    return 0.0 if inp.executed or inp.op == LifecycleOp.WAIT else cfg.invalid_action_penalty


def _accuracy_terminal(inp: RewardInputs, cfg: RewardConfig) -> float:
    if not (inp.is_terminal and cfg.terminal):
        return 0.0
    acc = inp.final_acc if _finite(inp.final_acc) else inp.val_acc
    return cfg.terminal_weight * acc / ACC_PERCENT_SCALE if _finite(acc) else 0.0


def _loss_terminal(inp: RewardInputs, cfg: RewardConfig) -> float:
    if not (inp.is_terminal and cfg.terminal) or not inp.random_guess_loss > 0:
        return 0.0
    loss = inp.final_loss if _finite(inp.final_loss) else inp.val_loss
    if math.isnan(loss):
        return 0.0
    score = 1.0 - loss / inp.random_guess_loss  # -inf for an infinite loss: clipped below
    clip = cfg.loss_terminal_clip
    return cfg.terminal_weight * min(max(score, -clip), clip)


def loss_delta(inp: RewardInputs, cfg: RewardConfig) -> float:
    """Loss improvement since the last step in units of the random-guess loss, clipped."""
    if not (inp.random_guess_loss > 0) or math.isnan(inp.prev_val_loss - inp.val_loss):
        return 0.0
    gain = (inp.prev_val_loss - inp.val_loss) / inp.random_guess_loss
    clip = cfg.loss_delta_clip
    return cfg.loss_delta_weight * min(max(gain, -clip), clip)


def _common(inp: RewardInputs, cfg: RewardConfig, *, gamma: float) -> dict[str, float]:
    """Rent, shaping, anti-gaming and costs shared by the dense families."""
    parts: dict[str, float] = {
        "rent": rent(inp, cfg),
        "invalid_penalty": _invalid(inp, cfg),
        "rollback_penalty": inp.rollback_penalty,
    }
    if cfg.shaping:
        parts["stage_shaping"] = stage_shaping(inp, cfg, gamma=gamma)
        parts.update(op_shaping(inp, cfg))
    if cfg.anti_gaming:
        parts["alpha_shock"] = alpha_shock(inp, cfg)
    return parts


def contribution_reward(inp: RewardInputs, cfg: RewardConfig, *, gamma: float) -> RewardBreakdown:
    return make_breakdown(
        attribution=attribution(inp, cfg),
        terminal=_accuracy_terminal(inp, cfg),
        **_common(inp, cfg, gamma=gamma),
    )


def loss_reward(inp: RewardInputs, cfg: RewardConfig, *, gamma: float) -> RewardBreakdown:
    return make_breakdown(
        loss_delta=loss_delta(inp, cfg),
        terminal=_loss_terminal(inp, cfg),
        **_common(inp, cfg, gamma=gamma),
    )


def accuracy_gain(inp: RewardInputs, cfg: RewardConfig) -> float:
    """``accuracy_weight`` x the accuracy change in pp since the last step.

    Unknown (NaN) on either side, e.g. the first step, pays 0. Summed over an episode
    with finite accuracies it telescopes to final minus first accuracy, so growth pays
    exactly what it adds to the final model, whenever it happens.
    """
    delta = inp.val_acc - inp.prev_val_acc
    return cfg.accuracy_weight * delta if _finite(delta) else 0.0


def param_cost(inp: RewardInputs, cfg: RewardConfig) -> float:
    """-``param_cost_weight`` x the change in seed parameters / host parameters.

    Not shaping: the end of the episode does not refund it, so an episode pays
    ``param_cost_weight * final seed params / host params`` in all (a seed pruned
    before the end costs nothing, apart from discounting of the refund).
    """
    if inp.host_params <= 0:
        return 0.0
    grown = (inp.seed_params - inp.prev_seed_params) / inp.host_params
    return -cfg.param_cost_weight * grown


def accuracy_reward(inp: RewardInputs, cfg: RewardConfig, *, gamma: float) -> RewardBreakdown:
    parts: dict[str, float] = {
        "attribution": accuracy_gain(inp, cfg),
        "rent": param_cost(inp, cfg),
        "terminal": _accuracy_terminal(inp, cfg),
        "invalid_penalty": _invalid(inp, cfg),
        "rollback_penalty": inp.rollback_penalty,
    }
    if cfg.shaping:
        parts["stage_shaping"] = stage_shaping(inp, cfg, gamma=gamma)
    return make_breakdown(**parts)


def sparse_reward(inp: RewardInputs, cfg: RewardConfig) -> RewardBreakdown:
    return make_breakdown(
        terminal=_accuracy_terminal(inp, cfg),
        rollback_penalty=inp.rollback_penalty,
    )


def compute_reward(inputs: RewardInputs, cfg: RewardConfig, *, gamma: float) -> RewardBreakdown:
    """Dispatch on ``cfg.family``; the breakdown's total is the sum of its components."""
    if cfg.family == RewardFamily.CONTRIBUTION:
        return contribution_reward(inputs, cfg, gamma=gamma)
    if cfg.family == RewardFamily.LOSS:
        return loss_reward(inputs, cfg, gamma=gamma)
    if cfg.family == RewardFamily.SPARSE:
        return sparse_reward(inputs, cfg)
    if cfg.family == RewardFamily.ACCURACY:
        return accuracy_reward(inputs, cfg, gamma=gamma)
    raise ValueError(f"unknown reward family {cfg.family!r}")
