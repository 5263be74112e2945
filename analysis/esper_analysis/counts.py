"""Event counts: by type, by round, by env, by step within the episode, per env-step.

Grouped scans per event type are collected in parallel and every view is derived from
those small frames, so the event tables themselves are never materialised.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import polars as pl

from esper.telemetry.events import EVENT_LEVELS, EVENT_TYPES
from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult


@dataclasses.dataclass(frozen=True)
class Counts(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "by_type": "Events by type",
        "by_round": "Events by type and round",
        "by_env": "Events by type and env",
        "by_step": "Events by type and step within the episode",
    }
    #: By-round/env/step are long: people get the per-type table (JSON has them all).
    TEXT_SKIP: ClassVar[frozenset[str]] = frozenset({"by_round", "by_step"})

    by_type: pl.DataFrame
    by_round: pl.DataFrame
    by_env: pl.DataFrame
    by_step: pl.DataFrame
    total: int
    env_steps: int | None

    def of(self, event_type: str) -> int:
        """Count of one type (0 when absent)."""
        row = self.by_type.filter(pl.col("type") == event_type)
        return int(row["events"][0]) if row.height else 0


def _grouped(run: Run, keys: tuple[str, ...]) -> pl.DataFrame:
    """Rows per ``(type, *keys)`` over every event type, collected in parallel."""
    schema = pl.Schema({"type": pl.String, **dict.fromkeys(keys, pl.Int64), "events": pl.Int64})
    plans = [
        run.scan(t).group_by(keys).agg(events=pl.len()).with_columns(type=pl.lit(t))
        for t in run.event_types
    ]
    if not plans:
        return pl.DataFrame(schema=schema)
    return pl.concat([f.select(schema.names()).cast(schema) for f in pl.collect_all(plans)])


def _manifest_counts(run: Run) -> dict[str, int]:
    """Per-type counts the writer recorded, summed over every rank's manifest."""
    totals: dict[str, int] = {}
    for manifest in run.manifests.values():
        counts = manifest.get("counts")
        if isinstance(counts, dict):
            for key, value in counts.items():
                if isinstance(value, int):
                    totals[key] = totals.get(key, 0) + value
    return totals


def _env_steps(run: Run, by_type: dict[str, int]) -> int | None:
    """Env-steps of the run: env_step events when written, else run_finished's total."""
    if by_type.get("env_step"):
        return by_type["env_step"]
    if run.rows_on_disk("run_finished"):
        value = run.scan("run_finished").select(pl.col("env_steps").last()).collect().item()
        return int(value) if value else None
    return None


def event_counts(run: Run) -> Counts:
    """Every count view of a run, deduplicated on ``(rank, seq)``.

    Two grouped scans per type: ``(round, env)`` and ``step``. Grouping by all three at
    once would have as many groups as env-steps, i.e. as large as the data itself.
    """
    round_env = _grouped(run, ("round", "env"))
    by_step = _grouped(run, ("step",)).sort("type", "step")
    totals = round_env.group_by("type").agg(pl.col("events").sum())
    total_of = dict(zip(totals["type"], totals["events"], strict=True))
    env_steps = _env_steps(run, total_of)
    manifest = _manifest_counts(run)
    levels = {t: EVENT_LEVELS[cls].name.lower() for t, cls in EVENT_TYPES.items()}
    rows = [
        {
            "type": t,
            "events": total_of[t],
            "level": levels[t],
            "manifest": manifest.get(t),
            "per_env_step": total_of[t] / env_steps if env_steps else None,
        }
        for t in EVENT_TYPES
        if t in total_of
    ]
    by_type = pl.DataFrame(rows, schema=_BY_TYPE_SCHEMA)

    def by(dim: str) -> pl.DataFrame:
        return round_env.group_by("type", dim).agg(pl.col("events").sum()).sort("type", dim)

    return Counts(
        by_type=by_type,
        by_round=by("round"),
        by_env=by("env"),
        by_step=by_step,
        total=int(by_type["events"].sum()),
        env_steps=env_steps,
    )


_BY_TYPE_SCHEMA = pl.Schema(
    {
        "type": pl.String,
        "events": pl.Int64,
        "level": pl.String,
        "manifest": pl.Int64,
        "per_env_step": pl.Float64,
    }
)
