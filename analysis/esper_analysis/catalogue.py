"""The run catalogue behind ``esper runs``: one row per run directory under a telemetry dir.

Each row comes from a run's manifest and its three smallest event types (``run_started``,
``round_finished``, ``run_finished``), so listing a directory of long runs reads a few
kilobytes per run. A run that cannot be read is listed with status ``unreadable`` and
the reason, instead of hiding the others.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import polars as pl

from esper.telemetry.manifest import NS_PER_S
from esper_analysis.errors import AnalysisError, RunNotFoundError
from esper_analysis.integrity import SCAN_ERRORS, corrupt_data_errors
from esper_analysis.loader import Run, is_run_dir, load_run

#: Status shown for a directory that looks like a run but cannot be read.
UNREADABLE: Final = "unreadable"
#: Column order of the catalogue (JSON keys and table columns).
COLUMNS: Final = (
    "run_id",
    "status",
    "task",
    "policy",
    "rounds",
    "rounds_planned",
    "env_steps",
    "eps",
    "final_mean_reward",
    "parent_run_id",
    "started",
    "path",
)


@dataclasses.dataclass(frozen=True)
class RunEntry:
    """One catalogue row; ``None`` where the run has not recorded the value (yet)."""

    run_id: str
    status: str
    task: str | None
    policy: str | None
    rounds: int | None
    rounds_planned: int | None
    env_steps: int | None
    eps: float | None
    final_mean_reward: float | None
    parent_run_id: str | None
    started: str | None
    path: str
    error: str = ""


def _last_row(run: Run, event_type: str, columns: Sequence[str]) -> dict[str, Any] | None:
    if not run.rows_on_disk(event_type):
        return None
    frame = run.scan(event_type).select(*columns).tail(1).collect()
    return frame.row(0, named=True) if frame.height else None


def _started(run: Run) -> str | None:
    if run.manifest is None:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(run.manifest.started_ns // NS_PER_S))


def _rounds(run: Run) -> tuple[int | None, float | None, float | None]:
    """Rounds finished, mean EPS over them and the last round's mean episode reward."""
    if not run.rows_on_disk("round_finished"):
        return None, None, None
    frame = (
        run.scan("round_finished")
        .select("round", "eps", "mean_episode_reward")
        .sort("round")
        .collect()
    )
    eps = frame["eps"].mean()
    return (
        frame.height,
        None if eps is None else float(eps),  # type: ignore[arg-type]
        float(frame["mean_episode_reward"][-1]),
    )


def entry(run: Run) -> RunEntry:
    """The catalogue row of one loaded run."""
    started = _last_row(
        run,
        "run_started",
        ("task", "policy_kind", "parent_run_id", "rounds", "n_envs", "episode_length",
         "eval_checkpoint"),
    )  # fmt: skip
    finished = _last_row(run, "run_finished", ("rounds_completed", "env_steps", "eps"))
    n_rounds, eps, final_reward = _rounds(run)
    env_steps: int | None = None
    if finished is not None:
        n_rounds = int(finished["rounds_completed"])
        env_steps = int(finished["env_steps"])
        eps = float(finished["eps"])
    elif run.rows_on_disk("env_step"):
        env_steps = run.rows_on_disk("env_step")  # a live or crashed run: steps so far
    elif started is not None and n_rounds is not None:  # lifecycle level: no env_step rows
        env_steps = n_rounds * int(started["n_envs"]) * int(started["episode_length"])
    manifest_parent = run.manifest.parent_run_id if run.manifest else ""
    parent = (started or {}).get("parent_run_id") or manifest_parent or None
    return RunEntry(
        run_id=run.run_id,
        status=run.status.value,
        task=None if started is None else str(started["task"]),
        policy=None if started is None else _policy(started),
        rounds=n_rounds,
        rounds_planned=None if started is None else int(started["rounds"]),
        env_steps=env_steps,
        eps=eps,
        final_mean_reward=final_reward,
        parent_run_id=None if parent is None else str(parent),
        started=_started(run),
        path=str(run.path),
    )


def _policy(started: dict[str, Any]) -> str:
    """The policy kind; an ``esper evaluate`` run is marked (a frozen policy, no updates)."""
    kind = str(started["policy_kind"])
    return f"{kind} (eval)" if started.get("eval_checkpoint") else kind


def _unreadable(path: Path, error: Exception) -> RunEntry:
    return RunEntry(
        run_id=path.name,
        status=UNREADABLE,
        task=None,
        policy=None,
        rounds=None,
        rounds_planned=None,
        env_steps=None,
        eps=None,
        final_mean_reward=None,
        parent_run_id=None,
        started=None,
        path=str(path),
        error=str(error),
    )


def run_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """``root`` itself if it is a run directory, else the run directories directly under it."""
    path = Path(root)
    if not path.is_dir():
        raise RunNotFoundError(f"directory {path} does not exist")
    if is_run_dir(path):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and is_run_dir(p))


def catalogue(roots: Iterable[str | os.PathLike[str]]) -> list[RunEntry]:
    """Every run under ``roots``, oldest first (runs without a start time last)."""
    entries = []
    for root in roots:
        for path in run_dirs(root):
            with warnings.catch_warnings():  # skipped parts of a live run are expected here
                warnings.simplefilter("ignore")
                try:
                    run = load_run(path)
                    with corrupt_data_errors(run):
                        entries.append(entry(run))
                except (AnalysisError, *SCAN_ERRORS) as exc:
                    entries.append(_unreadable(path, exc))
    return sorted(entries, key=lambda e: (e.started is None, e.started or "", e.run_id))


def catalogue_frame(entries: Sequence[RunEntry]) -> pl.DataFrame:
    """The catalogue as a table (one row per run, :data:`COLUMNS` order)."""
    rows = [{c: getattr(e, c) for c in COLUMNS} for e in entries]
    schema: dict[str, Any] = {
        "run_id": pl.String,
        "status": pl.String,
        "task": pl.String,
        "policy": pl.String,
        "rounds": pl.Int64,
        "rounds_planned": pl.Int64,
        "env_steps": pl.Int64,
        "eps": pl.Float64,
        "final_mean_reward": pl.Float64,
        "parent_run_id": pl.String,
        "started": pl.String,
        "path": pl.String,
    }
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
