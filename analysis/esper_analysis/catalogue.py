"""The run catalogue behind ``esper runs``: one row per run directory under a telemetry dir.

Each row comes from a run's manifest and its three smallest event types (``run_started``,
``round_finished``, ``run_finished``), so listing a directory of long runs reads a few
kilobytes per run. A run that cannot be read is listed with status ``unreadable`` and
the reason, instead of hiding the others; a run directory without events (a run with
``--telemetry-level off`` leaves only its checkpoint) is listed as ``no telemetry``.
A resumed run names its parent and the round it resumed at, and counts its rounds
through that lineage (``rounds_total``); a continued run (``--continue-run``) says so.
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
from esper_analysis.run_info import RunInfo, run_info

#: Status shown for a directory that looks like a run but cannot be read.
UNREADABLE: Final = "unreadable"
#: Status of a run directory with a checkpoint and no events (telemetry level off).
NO_TELEMETRY: Final = "no telemetry"
#: Checkpoint files that make a directory without events a run directory.
CHECKPOINT_GLOB: Final = "checkpoint*.pt"
#: Column order of the catalogue (JSON keys and table columns).
COLUMNS: Final = (
    "run_id",
    "status",
    "task",
    "policy",
    "seed",
    "envs",
    "family",
    "rounds",
    "rounds_total",
    "rounds_planned",
    "env_steps",
    "eps",
    "final_mean_reward",
    "final_accuracy",
    "parent_run_id",
    "resumed_from_round",
    "lineage",
    "started",
    "path",
)


@dataclasses.dataclass(frozen=True)
class RunEntry:
    """One catalogue row; ``None`` where the run has not recorded the value (yet)."""

    run_id: str
    status: str
    path: str
    task: str | None = None
    policy: str | None = None
    seed: int | None = None
    #: Envs of the whole run (every rank's).
    envs: int | None = None
    #: Host family members, comma-separated (None: one host).
    family: str | None = None
    #: Rounds this run completed, and through its lineage (a resumed run's parent's too).
    rounds: int | None = None
    rounds_total: int | None = None
    rounds_planned: int | None = None
    env_steps: int | None = None
    eps: float | None = None
    final_mean_reward: float | None = None
    final_accuracy: float | None = None
    parent_run_id: str | None = None
    #: The round a resumed (or continued) run started at.
    resumed_from_round: int | None = None
    #: How the run came to be: "" (fresh), "resumed from P at round R", "continued
    #: at round R" (``--continue-run``, once per session).
    lineage: str = ""
    started: str | None = None
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


def _rounds(run: Run) -> tuple[int | None, float | None, float | None, float | None]:
    """Rounds finished, mean EPS over them and the last round's mean episode reward
    and mean final accuracy."""
    if not run.rows_on_disk("round_finished"):
        return None, None, None, None
    frame = (
        run.scan("round_finished")
        .select("round", "eps", "mean_episode_reward", "mean_final_accuracy")
        .sort("round")
        .collect()
    )
    eps = frame["eps"].mean()
    return (
        frame.height,
        None if eps is None else float(eps),  # type: ignore[arg-type]
        float(frame["mean_episode_reward"][-1]),
        float(frame["mean_final_accuracy"][-1]),
    )


def _lineage(info: RunInfo, resumed: list[int]) -> str:
    """How the run came to be, from its run_started events' resume rounds."""
    parts = []
    if info.parent_run_id:
        parts.append(f"resumed from {info.parent_run_id} at round {info.resumed_from_round}")
    parts += [f"continued at round {r}" for r in resumed[1:] if r >= 0]
    return "; ".join(parts)


def entry(run: Run) -> RunEntry:
    """The catalogue row of one loaded run."""
    info = run_info(run)
    resumed = (
        run.scan("run_started").select("resumed_from_round").collect().to_series().to_list()
        if run.rows_on_disk("run_started")
        else []
    )
    finished = _last_row(run, "run_finished", ("rounds_completed", "env_steps", "eps"))
    n_rounds, eps, final_reward, final_acc = _rounds(run)
    env_steps: int | None = None
    if finished is not None:
        n_rounds = int(finished["rounds_completed"])
        env_steps = int(finished["env_steps"])
        eps = float(finished["eps"])
    elif run.rows_on_disk("env_step"):
        env_steps = run.rows_on_disk("env_step")  # a live or crashed run: steps so far
    elif info.envs is not None and info.episode_length is not None and n_rounds is not None:
        env_steps = n_rounds * info.envs * info.episode_length  # lifecycle level: no env_step
    start = info.resumed_from_round if info.parent_run_id else None
    total = None if n_rounds is None else n_rounds + (start or 0)
    return RunEntry(
        run_id=run.run_id,
        status=run.status.value,
        path=str(run.path),
        task=info.task,
        policy=info.policy_label,
        seed=info.seed,
        envs=info.envs,
        family=", ".join(info.family) or None,
        rounds=n_rounds,
        rounds_total=total,
        rounds_planned=info.rounds,
        env_steps=env_steps,
        eps=eps,
        final_mean_reward=final_reward,
        final_accuracy=final_acc,
        parent_run_id=info.parent_run_id,
        resumed_from_round=start,
        lineage=_lineage(info, resumed),
        started=_started(run),
    )


def _unreadable(path: Path, error: Exception) -> RunEntry:
    return RunEntry(run_id=path.name, status=UNREADABLE, path=str(path), error=str(error))


def _without_telemetry(path: Path) -> RunEntry:
    names = ", ".join(sorted(p.name for p in path.glob(CHECKPOINT_GLOB)))
    return RunEntry(
        run_id=path.name,
        status=NO_TELEMETRY,
        path=str(path),
        error=f"no events, only {names} (telemetry level off)",
    )


def _is_checkpoint_dir(path: Path) -> bool:
    return path.is_dir() and not is_run_dir(path) and any(path.glob(CHECKPOINT_GLOB))


def run_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """``root`` itself if it is a run directory, else the run directories directly under
    it (with events, or with only a checkpoint)."""
    path = Path(root)
    if not path.is_dir():
        raise RunNotFoundError(f"directory {path} does not exist")
    if is_run_dir(path) or _is_checkpoint_dir(path):
        return [path]
    return sorted(
        p for p in path.iterdir() if p.is_dir() and (is_run_dir(p) or _is_checkpoint_dir(p))
    )


def catalogue(roots: Iterable[str | os.PathLike[str]]) -> list[RunEntry]:
    """Every run under ``roots``, oldest first (runs without a start time last)."""
    entries = []
    for root in roots:
        for path in run_dirs(root):
            if _is_checkpoint_dir(path):
                entries.append(_without_telemetry(path))
                continue
            with warnings.catch_warnings():  # skipped parts of a live run are expected here
                warnings.simplefilter("ignore")
                try:
                    run = load_run(path)
                    with corrupt_data_errors(run):
                        entries.append(entry(run))
                except (AnalysisError, *SCAN_ERRORS) as exc:
                    entries.append(_unreadable(path, exc))
    return sorted(entries, key=lambda e: (e.started is None, e.started or "", e.run_id))


_SCHEMA: Final[dict[str, Any]] = {
    "run_id": pl.String,
    "status": pl.String,
    "task": pl.String,
    "policy": pl.String,
    "seed": pl.Int64,
    "envs": pl.Int64,
    "family": pl.String,
    "rounds": pl.Int64,
    "rounds_total": pl.Int64,
    "rounds_planned": pl.Int64,
    "env_steps": pl.Int64,
    "eps": pl.Float64,
    "final_mean_reward": pl.Float64,
    "final_accuracy": pl.Float64,
    "parent_run_id": pl.String,
    "resumed_from_round": pl.Int64,
    "lineage": pl.String,
    "started": pl.String,
    "path": pl.String,
}


def catalogue_frame(entries: Sequence[RunEntry]) -> pl.DataFrame:
    """The catalogue as a table (one row per run, :data:`COLUMNS` order)."""
    rows = [{c: getattr(e, c) for c in COLUMNS} for e in entries]
    if not rows:
        return pl.DataFrame(schema=_SCHEMA)
    return pl.DataFrame(rows, schema=_SCHEMA, orient="row")
