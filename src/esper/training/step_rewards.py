"""Assemble one env-step's :class:`RewardInputs` from the env after its action.

Host-side only: every number here was already transferred by the step (slot reports,
validation metrics) so building rewards costs no device sync. Pure: the reward's memory
of this step (alphas, stage potential, live seed parameters) is returned, and the
caller stores it on the env, so shaping telescopes across steps.
"""

from __future__ import annotations

import math

from esper.core.enums import ParamCostBasis
from esper.core.records import SlotReport
from esper.data.tasks import TaskSpec
from esper.policy.actions import DecodedAction
from esper.training.action_execution import ActionOutcome
from esper.training.env_state import EnvState, RewardMemory
from esper.training.rewards import RewardInputs, SeedCredit, env_potential


def _credits(reports: tuple[SlotReport, ...], val_acc: float) -> tuple[SeedCredit, ...]:
    """Every seed with a measured contribution, with its progress since germination."""
    return tuple(
        SeedCredit(
            contribution_pp=r.contribution,
            progress_pp=val_acc - r.acc_at_germination,
            alpha=r.alpha,
        )
        for r in reports
        if r.active and math.isfinite(r.contribution)
    )


def build_reward_inputs(
    env: EnvState,
    action: DecodedAction,
    outcome: ActionOutcome,
    *,
    task: TaskSpec,
    terminal: bool,
    param_basis: ParamCostBasis = ParamCostBasis.LIVE,
) -> tuple[RewardInputs, RewardMemory]:
    """The step's reward inputs, and the memory the next step's inputs start from
    (``param_basis``: which seed parameters the parameter cost counts)."""
    reports = env.model.slot_reports()
    counts = env.model.param_counts()
    if param_basis == ParamCostBasis.LIVE:
        seed_params = counts.seeds
    else:  # alpha x parameters of the blended seeds
        seed_params = counts.effective - counts.host
    alphas = tuple(r.alpha for r in reports)
    memory = env.reward_memory
    previous = memory.alphas or alphas
    alpha_change = max((abs(a - b) for a, b in zip(alphas, previous, strict=True)), default=0.0)
    potential_now = env_potential(reports)
    before = outcome.slot_before
    inputs = RewardInputs(
        op=action.op,
        executed=outcome.executed,
        slot_before=before,
        slot_after=outcome.slot_after,
        contribution_pp=before.contribution if before is not None else math.nan,
        progress_pp=(env.val_acc - before.acc_at_germination if before is not None else math.nan),
        credits=_credits(reports, env.val_acc),
        val_acc=env.val_acc,
        prev_val_acc=env.prev_val_acc,
        val_loss=env.val_loss,
        prev_val_loss=env.prev_val_loss,
        random_guess_loss=task.random_guess_loss,
        host_params=counts.host,
        effective_params=counts.effective,
        alpha_change=alpha_change,
        potential_prev=memory.potential,
        potential_now=potential_now,
        is_terminal=terminal,
        final_acc=env.val_acc if terminal else math.nan,
        final_loss=env.val_loss if terminal else math.nan,
        seed_params=seed_params,
        prev_seed_params=memory.seed_params,
    )
    return inputs, RewardMemory(alphas=alphas, potential=potential_now, seed_params=seed_params)
