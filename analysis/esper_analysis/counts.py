"""Event counts: by type, by round, by env, by step within the episode, by rank.

One query: a hive scan of every file of the run (``type`` from the directory) reads the
four envelope columns counted, and each breakdown is a ``group_by`` of ``type`` and one
of them, collected together. Grouping by ``(round, env, step)`` together would have as
many groups as env-steps, i.e. be as large as the data itself.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar, Final

import polars as pl

from esper.telemetry.events import EVENT_LEVELS, EVENT_TYPES
from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult

#: The envelope columns counted per value (each gives one breakdown table).
DIMENSIONS: Final = ("round", "env", "step", "rank")


@dataclasses.dataclass(frozen=True)
class Counts(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "by_type": "Events by type",
        "by_round": "Events by type and round",
        "by_env": "Events by type and env",
        "by_step": "Events by type and step within the episode",
        "by_rank": "Events by type and rank (process)",
    }
    #: By-round/env/step are long: people get the per-type table (JSON has them all).
    TEXT_SKIP: ClassVar[frozenset[str]] = frozenset({"by_round", "by_step"})

    by_type: pl.DataFrame
    by_round: pl.DataFrame
    by_env: pl.DataFrame
    by_step: pl.DataFrame
    #: Per process of a multi-rank run (torchrun); one rank, 0, otherwise.
    by_rank: pl.DataFrame
    total: int
    env_steps: int | None

    @functools.cached_property
    def nested(self) -> dict[str, dict[str, dict[str, int]]]:
        """``by_round``, ``by_env`` and ``by_rank`` as ``{type: {str(key): count}}`` (the
        baseline's JSON shape), built once for a capture and a check of the same counts."""
        return {
            "by_round": _nested(self.by_round, "round"),
            "by_env": _nested(self.by_env, "env"),
            "by_rank": _nested(self.by_rank, "rank"),
        }

    def of(self, event_type: str) -> int:
        """Count of one type (0 when absent)."""
        row = self.by_type.filter(pl.col("type") == event_type)
        return int(row["events"][0]) if row.height else 0


def _nested(frame: pl.DataFrame, dim: str) -> dict[str, dict[str, int]]:
    grouped = frame.group_by("type", maintain_order=True).agg(pl.col(dim).cast(pl.String), "events")
    return {t: dict(zip(keys, events, strict=True)) for t, keys, events in grouped.iter_rows()}


def _breakdown(events: pl.LazyFrame, dim: str) -> pl.LazyFrame:
    """``(type, value, events)`` of one column, nulls left out, sorted by type and value."""
    return (
        events.drop_nulls(dim)
        .group_by("type", dim)
        .agg(events=pl.len().cast(pl.Int64))
        .sort("type", dim)
    )


def _env_steps(run: Run, by_type: dict[str, int]) -> int | None:
    """Env-steps of the run: env_step events when written, else run_finished's total."""
    if by_type.get("env_step"):
        return by_type["env_step"]
    if run.rows_on_disk("run_finished"):
        value = run.scan("run_finished").select(pl.col("env_steps").last()).collect().item()
        return int(value) if value else None
    return None


def _manifest_counts(run: Run) -> dict[str, int]:
    """Per-type counts the writer recorded, summed over every rank's manifest."""
    totals: dict[str, int] = {}
    for manifest in run.manifests.values():
        for key, value in manifest.counts.items():
            totals[key] = totals.get(key, 0) + value
    return totals


def event_counts(run: Run) -> Counts:
    """Every count view of a run."""
    events = run.scan_envelopes(DIMENSIONS)
    by_dim = pl.collect_all([_breakdown(events, dim) for dim in DIMENSIONS])
    total_of = {t: run.rows_on_disk(t) for t in run.event_types}
    env_steps = _env_steps(run, total_of)
    manifest = _manifest_counts(run)
    rows = [
        {
            "type": t,
            "events": total_of[t],
            "level": EVENT_LEVELS[cls].name.lower(),
            "manifest": manifest.get(t),
            "per_env_step": total_of[t] / env_steps if env_steps else None,
        }
        for t, cls in EVENT_TYPES.items()
        if t in total_of
    ]
    by_type = pl.DataFrame(rows, schema=_BY_TYPE_SCHEMA)
    breakdowns = {
        dim: frame.cast(_breakdown_schema(dim))
        for dim, frame in zip(DIMENSIONS, by_dim, strict=True)
    }
    return Counts(
        by_type=by_type,
        by_round=breakdowns["round"],
        by_env=breakdowns["env"],
        by_step=breakdowns["step"],
        by_rank=breakdowns["rank"],
        total=int(by_type["events"].sum()),
        env_steps=env_steps,
    )


def _breakdown_schema(dim: str) -> pl.Schema:
    return pl.Schema({"type": pl.String, dim: pl.Int64, "events": pl.Int64})


_BY_TYPE_SCHEMA: Final = pl.Schema(
    {
        "type": pl.String,
        "events": pl.Int64,
        "level": pl.String,
        "manifest": pl.Int64,
        "per_env_step": pl.Float64,
    }
)
