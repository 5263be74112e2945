"""Reward breakdowns, rollback audits, seed lifecycles, actions, PPO and throughput,
each checked against the scripted stream's known answers (see _analysis_support)."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest
from _analysis_support import (
    BAD_ROLLBACK,
    BROKEN_BY,
    BROKEN_ROW,
    CONTRIBUTION,
    EXPECTED_DURATIONS,
    EXPECTED_OPS,
    GOOD_ROLLBACK,
    LENGTH,
    N_ENVS,
    NOT_EXECUTED,
    PENALTY,
    ROUNDS,
    WALL_S,
    Script,
)
from conftest import Crashed
from esper_analysis.actions import action_distribution
from esper_analysis.lifecycles import LIVE_STAGES, seed_lifecycles
from esper_analysis.loader import load_run
from esper_analysis.ppo import ppo_health
from esper_analysis.rewards import reward_breakdown
from esper_analysis.rollbacks import rollback_audit
from esper_analysis.throughput import throughput

from esper.core.constants import HEAD_NAMES
from esper.telemetry.events import REWARD_COMPONENTS

STEPS = ROUNDS * N_ENVS * LENGTH


def test_reward_breakdown_totals_and_the_one_broken_row(scripted: tuple[Path, Script]) -> None:
    path, script = scripted
    rewards = reward_breakdown(load_run(path))
    assert rewards.rows == STEPS
    assert rewards.flagged_rows == 1
    flagged = rewards.flagged.row(0, named=True)
    assert (flagged["round"], flagged["env"], flagged["step"]) == BROKEN_ROW
    assert flagged["diff"] == pytest.approx(-BROKEN_BY)
    episodes = rewards.by_episode
    for (r, e), total in script.episode_reward.items():
        row = episodes.filter(round=r, env=e).row(0, named=True)
        assert row["total"] == pytest.approx(total)
        assert row["episode_reward_reported"] == pytest.approx(total)
        assert row["rows"] == LENGTH
    by_op = dict(zip(rewards.by_op["op"], rewards.by_op["rows"], strict=True))
    assert by_op == EXPECTED_OPS
    germ = rewards.by_op.filter(op="GERMINATE").row(0, named=True)
    assert germ["germinate_cost"] == pytest.approx(-0.05 * 4)
    comp = {r["component"]: r for r in rewards.by_component.to_dicts()}
    assert list(comp) == [*REWARD_COMPONENTS, "total"]
    assert comp["rent"]["sum"] == pytest.approx(-0.01 * STEPS)
    assert comp["rollback_penalty"]["sum"] == pytest.approx(PENALTY)
    assert comp["terminal"]["nonzero"] == ROUNDS * N_ENVS
    assert rewards.by_env["attribution"].to_list() == pytest.approx([0.0, 0.1 * STEPS / 2])
    assert rewards.missing_components == []


def test_rollback_audit_finds_the_rollback_that_reached_nothing(scripted_run: Path) -> None:
    audit = rollback_audit(load_run(scripted_run))
    assert audit.count == 2
    assert audit.buffer_checked
    assert audit.all_reached_buffer is False
    assert audit.all_reached_episode is False
    rows = {(r["round"], r["env"], r["step"]): r for r in audit.rollbacks.to_dicts()}
    good, bad = rows[GOOD_ROLLBACK], rows[BAD_ROLLBACK]
    assert good["reached_buffer"] and good["reached_episode"]
    assert good["buffer_penalty"] == PENALTY and good["episode_rollbacks"] == 1
    assert not bad["reached_buffer"] and not bad["reached_episode"]
    assert bad["buffer_penalty"] == 0.0
    assert (good["reason"], good["loss"], good["threshold"]) == ("divergence", 9.0, 5.0)
    assert good["restored_to_step"] == GOOD_ROLLBACK[2] - 1
    assert good["penalized_step"] == GOOD_ROLLBACK[2] - 1
    assert good["transitions_affected"] == 2 and good["penalty"] == PENALTY
    problems = audit.problems
    assert problems.height == 1
    assert (problems["round"][0], problems["env"][0]) == BAD_ROLLBACK[:2]


def test_seed_lifecycles_and_blueprint_rates(scripted_run: Path) -> None:
    lc = seed_lifecycles(load_run(scripted_run))
    assert (lc.germinated, lc.fossilized, lc.pruned, lc.alive) == (4, 1, 1, 2)
    seeds = {r["seed_id"]: r for r in lc.seeds.to_dicts()}
    for seed_id, (durations, outcome) in EXPECTED_DURATIONS.items():
        row = seeds[seed_id]
        assert row["outcome"] == outcome, seed_id
        got = tuple(row[f"epochs_{s.lower()}"] for s in LIVE_STAGES)
        assert got == durations, seed_id
        assert row["ended_step"] - row["germinated_step"] == row["lifetime_epochs"]
    assert seeds["seed-a"]["ended_step"] == 5 and seeds["seed-a"]["final_stage"] == "FOSSILIZED"
    assert seeds["seed-b"]["ended_step"] == 4 and seeds["seed-b"]["final_stage"] == "TRAINING"
    assert seeds["seed-c"]["ended_step"] == LENGTH - 1  # alive: runs to the episode's end
    bp = {r["blueprint"]: r for r in lc.by_blueprint.to_dicts()}
    assert (bp["conv_small"]["germinated"], bp["conv_small"]["fossilized"]) == (2, 1)
    assert bp["conv_small"]["fossilize_rate"] == 1.0
    assert bp["conv_small"]["mean_contribution_pp"] == CONTRIBUTION["seed-a"]
    assert (bp["norm"]["pruned"], bp["norm"]["alive"], bp["norm"]["fossilize_rate"]) == (1, 1, 0.0)
    assert bp["norm"]["mean_contribution_pp"] == CONTRIBUTION["seed-b"]
    status = {s: seeds[s]["contribution_status"] for s in seeds}  # JSON's null is ambiguous
    assert status == {
        "seed-a": "measured",
        "seed-b": "measured",
        "seed-c": "alive",
        "seed-d": "alive",
    }
    seg = lc.segments.filter(seed_id="seed-a")
    assert seg["stage"].to_list() == ["GERMINATED", "TRAINING", "BLENDING", "HOLDING", "FOSSILIZED"]
    assert seg["start_step"].to_list() == [0, 1, 2, 4, 5]
    assert seg["end_step"].to_list() == [1, 2, 4, 5, LENGTH - 1]


def test_action_distribution(scripted_run: Path) -> None:
    actions = action_distribution(load_run(scripted_run))
    assert actions.actions == STEPS
    assert dict(zip(actions.by_op["op"], actions.by_op["actions"], strict=True)) == EXPECTED_OPS
    wait = actions.by_op.filter(op="WAIT").row(0, named=True)
    assert wait["executed"] == EXPECTED_OPS["WAIT"] - 1
    assert actions.executed_rate == pytest.approx((STEPS - 1) / STEPS)
    per_round = actions.by_round.group_by("round").agg(pl.col("actions").sum()).sort("round")
    assert per_round["actions"].to_list() == [N_ENVS * LENGTH] * ROUNDS
    shares = actions.by_env.group_by("env").agg(pl.col("share").sum())["share"]
    assert shares.to_list() == pytest.approx([1.0] * N_ENVS)
    missed = actions.by_round.filter(round=NOT_EXECUTED[0], op="WAIT").row(0, named=True)
    assert missed["actions"] - missed["executed"] == 1


def test_ppo_health_over_rounds(scripted_run: Path) -> None:
    ppo = ppo_health(load_run(scripted_run))
    assert ppo.n_updates == ROUNDS and ppo.early_stopped == 1 and ppo.skipped == 0
    assert ppo.updates["entropy"].to_list() == pytest.approx([1.0, 0.9])
    assert ppo.updates["approx_kl"].to_list() == pytest.approx([0.01, 0.02])
    assert ppo.max_kl == pytest.approx(0.02)
    assert ppo.last_explained_variance == pytest.approx(0.7)
    assert ppo.per_head.height == ROUNDS * len(HEAD_NAMES)
    op_head = ppo.per_head.filter(round=1, head="op").row(0, named=True)
    assert op_head["entropy"] == pytest.approx(0.9 / 10)
    assert op_head["clip_frac"] == pytest.approx(0.01)


def test_throughput_per_round(scripted_run: Path) -> None:
    tp = throughput(load_run(scripted_run))
    assert tp.rounds["round"].to_list() == list(range(ROUNDS))
    assert tp.rounds["eps"].to_list() == [N_ENVS * LENGTH / WALL_S] * ROUNDS
    assert tp.rounds["env_steps"].to_list() == [N_ENVS * LENGTH] * ROUNDS
    assert tp.rounds["step_train_ms_mean"].to_list() == [10.0] * ROUNDS
    assert not any(tp.rounds["estimated"])
    assert (tp.env_steps, tp.wall_s) == (STEPS, ROUNDS * WALL_S)


def test_analyses_of_a_crashed_run_cover_what_was_recovered(crashed: Crashed) -> None:
    run = load_run(crashed.path)
    rewards = reward_breakdown(run)
    assert rewards.rows == N_ENVS * LENGTH  # round 0 only
    assert rewards.flagged_rows == 0  # the broken row was in round 1
    audit = rollback_audit(run)
    assert audit.count == 1 and audit.all_reached_buffer is False
    lc = seed_lifecycles(run)
    assert sorted(lc.seeds["seed_id"]) == ["seed-a", "seed-b"]
    tp = throughput(run)
    assert tp.rounds.height == 1 and tp.wall_s == WALL_S


def test_older_schema_run_still_analyses(older_run: Path) -> None:
    run = load_run(older_run)
    rewards = reward_breakdown(run)
    assert rewards.missing_components == ["alpha_shock"]
    assert rewards.flagged_rows == 1
    audit = rollback_audit(run)
    rows = {(r["round"], r["env"], r["step"]): r for r in audit.rollbacks.to_dicts()}
    assert rows[GOOD_ROLLBACK]["episode_rollback_penalty"] is None
    assert rows[GOOD_ROLLBACK]["reached_episode"] is None  # cannot be checked: column absent
    assert rows[BAD_ROLLBACK]["reached_episode"] is False  # rollback count still disagrees
    ppo = ppo_health(run)
    assert ppo.updates["ratio_max"].null_count() == ROUNDS
    assert math.isclose(ppo.updates["entropy"][0], 1.0)
