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
from dataclasses import dataclass, fields
from typing import Any

import msgspec
import numpy as np

from esper.config import RewardConfig
from esper.core.constants import ACC_PERCENT_SCALE, FORWARD_STAGES
from esper.core.enums import LifecycleOp, RewardFamily, SeedStage
from esper.core.records import SlotReport
from esper.model.slot_table import STAGES
from esper.telemetry.events import REWARD_COMPONENTS, RewardComputed, make_breakdown

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


#: :data:`STAGE_POTENTIAL` by stage code (:data:`esper.model.slot_table.STAGES`).
POTENTIAL_BY_CODE = np.array([STAGE_POTENTIAL[s] for s in STAGES])


@dataclass(frozen=True)
class RewardColumns:
    """:class:`RewardInputs` of ``N`` env-steps as arrays (leading dim N); the action's
    target slot flattened into ``target_*`` (before the action) and ``after_*`` columns,
    the credits into ``[N, C]`` columns with NaN contributions where there is none."""

    op: np.ndarray
    executed: np.ndarray
    target_contribution: np.ndarray
    target_progress: np.ndarray
    target_age: np.ndarray
    after_alive: np.ndarray  # the target slot holds a seed in the forward after the action
    after_alpha: np.ndarray
    has_credits: np.ndarray  # [N]: some seed's contribution is measured
    credit_contribution: np.ndarray  # [N, C]
    credit_progress: np.ndarray  # [N, C]
    credit_alpha: np.ndarray  # [N, C]
    val_acc: np.ndarray
    prev_val_acc: np.ndarray
    val_loss: np.ndarray
    prev_val_loss: np.ndarray
    random_guess_loss: float
    host_params: np.ndarray
    effective_params: np.ndarray
    alpha_change: np.ndarray
    potential_prev: np.ndarray
    potential_now: np.ndarray
    is_terminal: np.ndarray
    final_acc: np.ndarray
    final_loss: np.ndarray
    rollback_penalty: np.ndarray
    seed_params: np.ndarray
    prev_seed_params: np.ndarray

    @classmethod
    def of(cls, inp: RewardInputs) -> RewardColumns:
        """One env-step's inputs as one-row columns."""
        before, after = inp.slot_before, inp.slot_after
        alive = after is not None and after.active and after.stage in FORWARD_STAGES
        credits = inp.credits or (SeedCredit(contribution_pp=NAN),)
        row: dict[str, Any] = {
            f.name: np.array([getattr(inp, f.name)]) for f in fields(cls) if hasattr(inp, f.name)
        }
        row.update(
            op=np.array([int(inp.op)]),
            target_contribution=np.array([inp.contribution_pp]),
            target_progress=np.array([inp.progress_pp]),
            target_age=np.array([before.age_epochs if before is not None else 0]),
            after_alive=np.array([alive]),
            after_alpha=np.array([after.alpha if after is not None else 0.0]),
            has_credits=np.array([bool(inp.credits)]),
            credit_contribution=np.array([[c.contribution_pp for c in credits]]),
            credit_progress=np.array([[c.progress_pp for c in credits]]),
            credit_alpha=np.array([[c.alpha for c in credits]]),
            random_guess_loss=inp.random_guess_loss,
        )
        return cls(**row)


def ordered_sum(parts: Iterable[np.ndarray]) -> np.ndarray:
    """``0.0 + a + b + ...`` left to right: exactly the floats of a Python ``sum`` of the
    same terms (numpy's own reductions may associate them differently)."""
    total: np.ndarray = np.zeros(())
    for part in parts:
        total = total + part
    return total


def credit(
    contribution_pp: np.ndarray, progress_pp: np.ndarray, alpha: np.ndarray, cfg: RewardConfig
) -> np.ndarray:
    """Attribution for each seed. Harm counts in full; help is capped when anti-gaming.

    The cap: a seed cannot claim more than the env gained since it germinated (a host
    that came to depend on a seed shows a large ablation drop without any progress).
    """
    credited = contribution_pp
    if cfg.anti_gaming:
        capped = np.minimum(credited, np.maximum(progress_pp, 0.0))
        credited = np.where(np.isfinite(progress_pp), capped, credited)
        credited = credited * np.minimum(1.0, np.maximum(alpha, 0.0) / cfg.full_credit_alpha)
    out: np.ndarray = np.where(
        ~np.isfinite(contribution_pp),
        0.0,
        np.where(
            contribution_pp < 0.0,
            cfg.harm_weight * contribution_pp,
            cfg.attribution_weight * credited,
        ),
    )
    return out


def attribution(c: RewardColumns, cfg: RewardConfig) -> np.ndarray:
    """Every measured seed's credit, summed; without one, the action's target seed's."""
    with np.errstate(invalid="ignore"):
        per_seed = credit(c.credit_contribution, c.credit_progress, c.credit_alpha, cfg)
        target = credit(c.target_contribution, c.target_progress, c.after_alpha, cfg)
    total = ordered_sum(per_seed.T)  # seed by seed
    return np.where(c.has_credits, total, np.where(c.after_alive, target, 0.0))


def stage_shaping(c: RewardColumns, cfg: RewardConfig, *, gamma: float) -> np.ndarray:
    """Potential-based shaping F = w (gamma phi(s') - phi(s)): policy-invariant.

    The state after the last step is absorbing, so its potential is 0 (Ng et al.): an
    episode's shaping telescopes to -w phi(s_0) = 0 (up to gamma), so ending with seeds
    in late stages earns nothing and the shaping cannot be farmed.
    """
    phi_next = np.where(c.is_terminal, 0.0, c.potential_now)
    out: np.ndarray = cfg.stage_shaping_weight * (gamma * phi_next - c.potential_prev)
    return out


def rent(c: RewardColumns, cfg: RewardConfig) -> np.ndarray:
    """-min(w ln(1 + g), cap) with g the added effective parameters over host parameters
    (``math.log1p`` per value: numpy's differs in the last bit)."""
    host = c.host_params
    growth = np.maximum(c.effective_params - host, 0) / np.maximum(host, 1)
    log = np.fromiter(map(math.log1p, growth.tolist()), dtype=np.float64, count=growth.size)
    return np.where(host > 0, -np.minimum(cfg.rent_weight * log, cfg.rent_cap), 0.0)


def alpha_shock(c: RewardColumns, cfg: RewardConfig) -> np.ndarray:
    """Alpha may move ``alpha_shock_free`` per step for free; beyond it, each unit costs."""
    out: np.ndarray = -cfg.alpha_shock_weight * np.maximum(
        0.0, np.abs(c.alpha_change) - cfg.alpha_shock_free
    )
    return out


def fossilize_bonus(contribution_pp: np.ndarray, cfg: RewardConfig) -> np.ndarray:
    """Grows with the contribution (capped); a useless or harmful seed costs instead."""
    finite = np.isfinite(contribution_pp)
    helps = finite & (contribution_pp > 0.0)
    bonus = cfg.fossilize_bonus_per_pp * np.minimum(contribution_pp, cfg.fossilize_bonus_cap_pp)
    harm = np.where(finite, contribution_pp, 0.0)
    out: np.ndarray = np.where(
        helps, bonus, cfg.fossilize_useless_penalty + cfg.fossilize_bonus_per_pp * harm
    )
    return out


def prune_penalty(age: np.ndarray, contribution_pp: np.ndarray, cfg: RewardConfig) -> np.ndarray:
    """Base cost, more for a young seed, more for a helpful one."""
    young = cfg.prune_young_age
    youth = np.maximum(young - np.maximum(age, 0), 0) / young
    finite = np.isfinite(contribution_pp)
    helpful = np.where(finite, np.maximum(np.where(finite, contribution_pp, 0.0), 0.0), 0.0)
    out: np.ndarray = (
        cfg.prune_cost + cfg.prune_young_penalty * youth + cfg.prune_helpful_per_pp * helpful
    )
    return out


def op_shaping(c: RewardColumns, cfg: RewardConfig) -> dict[str, np.ndarray]:
    """Costs and bonuses of the op just executed (nothing for a failed op)."""
    op, ok = c.op, c.executed
    zero = np.zeros(op.shape)
    return {
        "germinate_cost": np.where(ok & (op == LifecycleOp.GERMINATE), cfg.germinate_cost, zero),
        "fossilize_bonus": np.where(
            ok & (op == LifecycleOp.FOSSILIZE), fossilize_bonus(c.target_contribution, cfg), zero
        ),
        "prune_penalty": np.where(
            ok & (op == LifecycleOp.PRUNE),
            prune_penalty(c.target_age, c.target_contribution, cfg),
            zero,
        ),
    }


def _invalid(c: RewardColumns, cfg: RewardConfig) -> np.ndarray:
    invalid = ~c.executed & (c.op != LifecycleOp.WAIT)
    return np.where(invalid, cfg.invalid_action_penalty, 0.0)


def _accuracy_terminal(c: RewardColumns, cfg: RewardConfig) -> np.ndarray:
    if not cfg.terminal:
        return np.zeros(c.op.shape)
    acc = np.where(np.isfinite(c.final_acc), c.final_acc, c.val_acc)
    value = cfg.terminal_weight * acc / ACC_PERCENT_SCALE
    return np.where(c.is_terminal & np.isfinite(acc), value, 0.0)


def _loss_terminal(c: RewardColumns, cfg: RewardConfig) -> np.ndarray:
    rgl = c.random_guess_loss
    if not (cfg.terminal and rgl > 0):
        return np.zeros(c.op.shape)
    loss = np.where(np.isfinite(c.final_loss), c.final_loss, c.val_loss)
    with np.errstate(invalid="ignore"):
        score = 1.0 - loss / rgl  # -inf for an infinite loss: clipped below
    clip = cfg.loss_terminal_clip
    value = cfg.terminal_weight * np.minimum(np.maximum(score, -clip), clip)
    return np.where(c.is_terminal & ~np.isnan(loss), value, 0.0)


def loss_delta(c: RewardColumns, cfg: RewardConfig) -> np.ndarray:
    """Loss improvement since the last step in units of the random-guess loss, clipped."""
    rgl = c.random_guess_loss
    if not rgl > 0:
        return np.zeros(c.op.shape)
    with np.errstate(invalid="ignore"):
        gain = (c.prev_val_loss - c.val_loss) / rgl
    clip = cfg.loss_delta_clip
    value = cfg.loss_delta_weight * np.minimum(np.maximum(gain, -clip), clip)
    return np.where(np.isnan(c.prev_val_loss - c.val_loss), 0.0, value)


def _common(c: RewardColumns, cfg: RewardConfig, *, gamma: float) -> dict[str, np.ndarray]:
    """Rent, shaping, anti-gaming and costs shared by the dense families."""
    parts: dict[str, np.ndarray] = {
        "rent": rent(c, cfg),
        "invalid_penalty": _invalid(c, cfg),
        "rollback_penalty": c.rollback_penalty,
    }
    if cfg.shaping:
        parts["stage_shaping"] = stage_shaping(c, cfg, gamma=gamma)
        parts.update(op_shaping(c, cfg))
    if cfg.anti_gaming:
        parts["alpha_shock"] = alpha_shock(c, cfg)
    return parts


def accuracy_gain(c: RewardColumns, cfg: RewardConfig) -> np.ndarray:
    """``accuracy_weight`` x the accuracy change in pp since the last step.

    Unknown (NaN) on either side, e.g. the first step, pays 0. Summed over an episode
    with finite accuracies it telescopes to final minus first accuracy, so growth pays
    exactly what it adds to the final model, whenever it happens.
    """
    delta = c.val_acc - c.prev_val_acc
    return np.where(np.isfinite(delta), cfg.accuracy_weight * delta, 0.0)


def param_cost(c: RewardColumns, cfg: RewardConfig) -> np.ndarray:
    """-``param_cost_weight`` x the change in seed parameters / host parameters.

    Not shaping: the end of the episode does not refund it, so an episode pays
    ``param_cost_weight * final seed params / host params`` in all (a seed pruned
    before the end costs nothing, apart from discounting of the refund).
    """
    host = c.host_params
    grown = (c.seed_params - c.prev_seed_params) / np.maximum(host, 1)
    return np.where(host > 0, -cfg.param_cost_weight * grown, 0.0)


def _components(c: RewardColumns, cfg: RewardConfig, gamma: float) -> dict[str, np.ndarray]:
    if cfg.family == RewardFamily.CONTRIBUTION:
        return {
            "attribution": attribution(c, cfg),
            "terminal": _accuracy_terminal(c, cfg),
            **_common(c, cfg, gamma=gamma),
        }
    if cfg.family == RewardFamily.LOSS:
        return {
            "loss_delta": loss_delta(c, cfg),
            "terminal": _loss_terminal(c, cfg),
            **_common(c, cfg, gamma=gamma),
        }
    if cfg.family == RewardFamily.SPARSE:
        return {"terminal": _accuracy_terminal(c, cfg), "rollback_penalty": c.rollback_penalty}
    if cfg.family == RewardFamily.ACCURACY:
        parts = {
            "attribution": accuracy_gain(c, cfg),
            "rent": param_cost(c, cfg),
            "terminal": _accuracy_terminal(c, cfg),
            "invalid_penalty": _invalid(c, cfg),
            "rollback_penalty": c.rollback_penalty,
        }
        if cfg.shaping:
            parts["stage_shaping"] = stage_shaping(c, cfg, gamma=gamma)
        return parts
    raise ValueError(f"unknown reward family {cfg.family!r}")


def compute_rewards(c: RewardColumns, cfg: RewardConfig, *, gamma: float) -> np.ndarray:
    """Every env-step's breakdown as ``[N, len(REWARD_COMPONENTS) + 1]``: the components
    in :data:`REWARD_COMPONENTS` order, then ``total``, always their exact sum."""
    n = c.op.shape[0]
    parts = _components(c, cfg, gamma)
    columns = [np.broadcast_to(parts.get(name, np.zeros(n)), (n,)) for name in REWARD_COMPONENTS]
    total = ordered_sum(columns)
    return np.stack([*columns, np.broadcast_to(total, (n,))], axis=1)


def compute_reward(inputs: RewardInputs, cfg: RewardConfig, *, gamma: float) -> RewardComputed:
    """One env-step's breakdown (:func:`compute_rewards` of one row)."""
    row = compute_rewards(RewardColumns.of(inputs), cfg, gamma=gamma)[0].tolist()
    return make_breakdown(**dict(zip(REWARD_COMPONENTS, row[:-1], strict=True)))
