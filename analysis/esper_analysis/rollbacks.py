"""Rollback audit: one row per governor rollback, checked against the buffer and episode.

A rollback *reached the buffer* when the ``reward_computed`` row of the penalized
transition (same rank, round and env, step ``penalized_step``: the decision that led
into the failed epoch; runs written before that field existed use the rollback's own
step) carries ``rollback_penalty`` equal to the rollback's ``penalty`` (within
:data:`PENALTY_TOLERANCE`); that check is ``null`` when the run recorded no
``reward_computed`` events at all (telemetry level below normal). It *reached the
episode* when the env's ``episode_finished`` counts every rollback of that episode and
its ``rollback_penalty`` equals the sum of their penalties; ``null`` when the episode
never finished (a crashed run).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Final

import polars as pl

from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult

PENALTY_TOLERANCE: Final = 1e-6
_EPISODE_KEY: Final = ["rank", "round", "env"]
_STEP_KEY: Final = [*_EPISODE_KEY, "step"]


@dataclasses.dataclass(frozen=True)
class RollbackAudit(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "rollbacks": "Governor rollbacks",
        "problems": "Rollbacks that did not reach the buffer or the episode outcome",
    }
    TEXT_COLUMNS: ClassVar[dict[str, tuple[str, ...]]] = dict.fromkeys(
        ("rollbacks", "problems"),
        (
            "rank",
            "round",
            "env",
            "step",
            "reason",
            "loss",
            "threshold",
            "restored_to_step",
            "penalized_step",
            "n_seeds_pruned",
            "transitions_affected",
            "penalty",
            "reached_buffer",
            "reached_episode",
        ),
    )

    rollbacks: pl.DataFrame
    problems: pl.DataFrame
    count: int
    buffer_checked: bool
    all_reached_buffer: bool | None
    all_reached_episode: bool | None


def _close(a: pl.Expr, b: pl.Expr) -> pl.Expr:
    return (a - b).abs() <= PENALTY_TOLERANCE


def rollback_audit(run: Run) -> RollbackAudit:
    """Every rollback with its buffer and episode checks."""
    rb = run.scan("governor_rollback").select(
        *_STEP_KEY,
        "seq",
        "reason",
        "loss",
        "threshold",
        "restored_to_step",
        pl.coalesce("penalized_step", "step").alias("penalized_step"),
        pl.col("seeds_pruned").list.join(",").alias("seeds_pruned"),
        pl.col("seeds_pruned").list.len().alias("n_seeds_pruned"),
        "transitions_affected",
        "penalty",
    )
    rb = rb.collect().lazy()  # small: its rounds filter the reward rows as they are read
    buffer_checked = run.rows_on_disk("reward_computed") > 0
    penalized = rb.select(*_EPISODE_KEY, step="penalized_step").unique()
    rounds = rb.select(pl.col("round").unique()).collect().to_series()
    rewards = (
        run.scan("reward_computed")
        .filter(pl.col("round").is_in(rounds.implode()))
        .join(penalized, on=_STEP_KEY, how="semi")
        .group_by(_STEP_KEY)
        .agg(buffer_penalty=pl.col("rollback_penalty").first())
        .rename({"step": "penalized_step"})
    )
    episodes = run.scan("episode_finished").select(
        *_EPISODE_KEY,
        pl.col("rollbacks").alias("episode_rollbacks"),
        pl.col("rollback_penalty").alias("episode_rollback_penalty"),
    )
    per_episode = rb.group_by(_EPISODE_KEY).agg(
        rollbacks_in_episode=pl.len(), penalty_in_episode=pl.col("penalty").sum()
    )
    reached_buffer = (
        _close(pl.col("buffer_penalty"), pl.col("penalty")).fill_null(False)
        if buffer_checked
        else pl.lit(None, pl.Boolean)
    )
    reached_episode = (
        pl.when(pl.col("episode_rollbacks").is_null())
        .then(None)
        .otherwise(
            (pl.col("episode_rollbacks") == pl.col("rollbacks_in_episode"))
            & _close(pl.col("episode_rollback_penalty"), pl.col("penalty_in_episode"))
        )
    )
    table = (
        rb.join(rewards, on=[*_EPISODE_KEY, "penalized_step"], how="left")
        .join(per_episode, on=_EPISODE_KEY, how="left")
        .join(episodes, on=_EPISODE_KEY, how="left")
        .with_columns(reached_buffer=reached_buffer, reached_episode=reached_episode)
        .sort("rank", "seq")
        .drop("seq", "rollbacks_in_episode", "penalty_in_episode")
        .collect()
    )
    problems = table.filter(
        (pl.col("reached_buffer") == False)  # noqa: E712 (null means "not checked")
        | (pl.col("reached_episode") == False)  # noqa: E712
    )
    return RollbackAudit(
        rollbacks=table,
        problems=problems,
        count=table.height,
        buffer_checked=buffer_checked,
        all_reached_buffer=_all(table["reached_buffer"]) if buffer_checked else None,
        all_reached_episode=_all(table["reached_episode"]),
    )


def _all(column: pl.Series) -> bool | None:
    """True if every checked row passed; None if no row could be checked."""
    checked = column.drop_nulls()
    if checked.len() == 0:
        return None
    return bool(checked.all())
