"""What a policy chose on which host: growth per host family member.

With a host family (``[[family.members]]``) every ``episode_finished`` names the env's
member (``host``). Joined with the episode's ``seed_germinated`` events by (round, env)
this shows which blueprint a policy grew in which slot, and when, on each member: what
was learned, not only that the reward rose. Choices are given for the first and the
last third of the rounds, so the change from the start of training shows too. Runs
without a family (or written before schema 4) have one host, named :data:`NO_FAMILY`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar, Final

import polars as pl

from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult

#: The host name of a run without a host family (its one host is ``[host]``).
NO_FAMILY: Final = "(no family)"
#: Phase labels of the first and the last third of the rounds.
EARLY, LATE = "first third", "last third"


@dataclasses.dataclass(frozen=True)
class HostChoices(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "by_host": "Episodes per host (last third of rounds)",
        "choices": "Growth per host: germinations by slot and blueprint",
    }

    by_host: pl.DataFrame
    choices: pl.DataFrame
    hosts: int
    episodes: int
    late_from_round: int


def _block_channels(run: Run) -> dict[str, str]:
    """Each family member's block widths ("2-4-8"), from the run's stored config."""
    if not run.rows_on_disk("run_started"):
        return {}
    raw = run.scan("run_started").select("config_json").collect().item(0, 0)
    try:
        config: dict[str, Any] = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {}
    members = config.get("family", {}).get("members", [])
    return {m["name"]: "-".join(str(c) for c in m["block_channels"]) for m in members}


def _phase(first: int, rounds: int) -> tuple[pl.Expr, int]:
    """(phase label of a row by its round, first round of the last third), for a run of
    ``rounds`` rounds from round ``first``."""
    third = max(rounds // 3, 1)
    late = first + max(rounds - third, 0)
    label = (
        pl.when(pl.col("round") >= late)
        .then(pl.lit(LATE))
        .when(pl.col("round") < first + third)
        .then(pl.lit(EARLY))
        .otherwise(pl.lit(None, dtype=pl.String))
    )
    return label, late


def host_choices(run: Run) -> HostChoices:
    """Per member: episodes and outcomes (last third), and the germinations by slot,
    blueprint and phase, with their share of the member's episodes and mean step."""
    episodes = (
        run.scan("episode_finished")
        .with_columns(pl.col("host").fill_null("").replace("", NO_FAMILY))
        .collect()
    )
    played = episodes["round"].unique().sort().to_list()
    first = played[0] if played else 0
    rounds = played[-1] + 1 - first if played else 0
    label, late = _phase(first, rounds)
    episodes = episodes.with_columns(phase=label)
    widths = _block_channels(run)
    width_col = pl.col("host").replace_strict(widths, default="", return_dtype=pl.String)
    by_host = (
        episodes.filter(pl.col("phase") == LATE)
        .group_by("host")
        .agg(
            episodes=pl.len(),
            final_acc=pl.col("final_val_acc").mean(),
            reward=pl.col("episode_reward").mean(),
            params_added=pl.col("params_added").mean(),
            germinated=pl.col("seeds_germinated").mean(),
            fossilized=pl.col("seeds_fossilized").mean(),
            pruned=pl.col("seeds_pruned").mean(),
        )
        .with_columns(block_channels=width_col)
        .select("host", "block_channels", pl.exclude("host", "block_channels"))
        .sort("host")
    )
    per_phase = episodes.group_by("host", "phase").agg(host_episodes=pl.len())
    germinated = (
        run.scan("seed_germinated")
        .select("round", "env", "step", "slot", "blueprint", "params")
        .collect()
        .join(episodes.select("round", "env", "host", "phase"), on=["round", "env"], how="inner")
    )
    choices = (
        germinated.filter(pl.col("phase").is_not_null())
        .group_by("phase", "host", "slot", "blueprint")
        .agg(
            germinations=pl.len(),
            mean_step=pl.col("step").mean(),
            mean_params=pl.col("params").mean(),
        )
        .join(per_phase, on=["host", "phase"], how="left")
        .with_columns(per_episode=pl.col("germinations") / pl.col("host_episodes"))
        .select(
            "phase",
            "host",
            "slot",
            "blueprint",
            "germinations",
            "per_episode",
            "mean_step",
            "mean_params",
        )
        .sort(
            pl.col("phase") == LATE,
            "host",
            "germinations",
            descending=[False, False, True],
        )
    )
    return HostChoices(
        by_host=by_host,
        choices=choices,
        hosts=episodes["host"].n_unique() if episodes.height else 0,
        episodes=episodes.height,
        late_from_round=late,
    )
