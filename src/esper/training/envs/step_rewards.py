"""Assemble a step's :class:`RewardColumns` for every env from the round's tables.

Host-side only: every number here was already transferred by the step (the slot table,
the validation metrics), so building rewards costs no device sync and no Python per
env. The reward's memory of this step (alphas, stage potential, live seed parameters) is
written back to the table, so shaping telescopes across steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from esper.core.constants import RELEVANT_HEADS
from esper.core.enums import LifecycleOp, ParamCostBasis
from esper.model.lifecycle import FORWARD_CODES, LIVE_CODES, OCCUPYING_CODES, effective_alphas
from esper.model.slot_table import SlotTable
from esper.training.envs.env_table import EnvTable
from esper.training.envs.rewards import POTENTIAL_BY_CODE, RewardColumns, ordered_sum


@dataclass(frozen=True)
class ParamColumns:
    """Per env: host parameters, live seeds' parameters and the alpha-weighted total
    (:class:`~esper.model.metrics.ParamCounts`, as columns)."""

    host: np.ndarray
    seeds: np.ndarray
    effective: np.ndarray


def param_columns(table: EnvTable) -> ParamColumns:
    """:meth:`MorphogeneticModel.param_counts` of every env (the same sums, in slot order)."""
    t = table.slots
    live = LIVE_CODES[t.stage]
    n_params = np.where(live, t.n_params, 0)
    weighted = effective_alphas(t) * n_params
    effective = ordered_sum(weighted.T)  # slot by slot
    return ParamColumns(
        host=table.host_params,
        seeds=n_params.sum(axis=1),
        effective=table.host_params + np.round(effective).astype(np.int64),
    )


@dataclass(frozen=True)
class Target:
    """The action's target slot before the action (NaN / 0 where the op has none)."""

    slot: np.ndarray  # [N] slot column, -1 where the op names no slot
    contribution: np.ndarray
    acc_at_germination: np.ndarray
    age: np.ndarray

    @classmethod
    def of(cls, t: SlotTable, slot: np.ndarray) -> Target:
        rows, col = np.arange(len(slot)), np.maximum(slot, 0)
        named = slot >= 0
        return cls(
            slot=slot,
            contribution=np.where(named, t.contribution[rows, col], math.nan),
            acc_at_germination=np.where(named, t.acc_at_germination[rows, col], math.nan),
            age=np.where(named, t.age_epochs[rows, col], 0),
        )


def reward_columns(
    table: EnvTable,
    before: Target,
    op: np.ndarray,
    executed: np.ndarray,
    *,
    random_guess_loss: float,
    terminal: bool,
    param_basis: ParamCostBasis = ParamCostBasis.LIVE,
) -> RewardColumns:
    """The step's reward inputs after the actions; the table's reward memory moves on."""
    t = table.slots
    n = table.n
    rows = np.arange(n)
    counts = param_columns(table)
    seed_params = (
        counts.seeds if param_basis == ParamCostBasis.LIVE else counts.effective - counts.host
    )
    alphas = effective_alphas(t)
    previous = np.where(table.memory_set[:, None], table.memory_alphas, alphas)
    potential = POTENTIAL_BY_CODE[t.stage].sum(axis=1)
    credited = OCCUPYING_CODES[t.stage] & np.isfinite(t.contribution)
    val_acc = table.val_acc
    col = np.maximum(before.slot, 0)
    after_stage = t.stage[rows, col]
    alive = (before.slot >= 0) & FORWARD_CODES[after_stage]  # forward stages occupy
    nan = np.full(n, math.nan)
    columns = RewardColumns(
        op=op,
        executed=executed,
        target_contribution=before.contribution,
        target_progress=val_acc - before.acc_at_germination,
        target_age=before.age,
        after_alive=alive,
        after_alpha=np.where(before.slot >= 0, alphas[rows, col], 0.0),
        has_credits=credited.any(axis=1),
        credit_contribution=np.where(credited, t.contribution, math.nan),
        credit_progress=val_acc[:, None] - t.acc_at_germination,
        credit_alpha=alphas,
        val_acc=val_acc,
        prev_val_acc=table.prev_val_acc,
        val_loss=table.val_loss,
        prev_val_loss=table.prev_val_loss,
        random_guess_loss=random_guess_loss,
        host_params=counts.host,
        effective_params=counts.effective,
        alpha_change=np.abs(alphas - previous).max(axis=1, initial=0.0),
        potential_prev=table.memory_potential.copy(),
        potential_now=potential,
        is_terminal=np.full(n, terminal),
        final_acc=val_acc.copy() if terminal else nan,
        final_loss=table.val_loss.copy() if terminal else nan,
        rollback_penalty=np.zeros(n),
        seed_params=seed_params,
        prev_seed_params=table.memory_seed_params.copy(),
    )
    table.memory_set[:] = True
    table.memory_alphas[:] = alphas
    table.memory_potential[:] = potential
    table.memory_seed_params[:] = seed_params
    return columns


#: Per op code: whether the op targets a slot (the others leave ``Target.slot`` at -1).
SLOT_OPS = np.array(["slot" in RELEVANT_HEADS[op] for op in LifecycleOp])
