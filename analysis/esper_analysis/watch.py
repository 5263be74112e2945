"""``esper watch RUN``: a live terminal view of a run, read from its directory alone.

The view is rebuilt from the manifest and the *closed* Parquet parts on every refresh
(the writer renames a part into place only when it is complete, and records a
compaction before replacing its inputs), so the watcher never talks to the trainer or
its writer; it costs the trainer only the CPU of its reads, and a
:class:`~esper_analysis.live_reader.RunReader` reads each part once. A part merged
away between listing and reading is skipped (the merged file carries its rows); any
other failed read is retried, and the previous view stays on screen meanwhile.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import polars as pl
import pyarrow as pa
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from esper.core.enums import RunStatus, SeedStage
from esper_analysis.errors import CorruptFileError, RunNotFoundError
from esper_analysis.live_reader import RunReader
from esper_analysis.loader import is_run_dir
from esper_analysis.tables import plural

#: Longest allowed refresh interval (the issue's bound) and the default.
MAX_REFRESH_S: Final = 1.0
#: Poll interval while waiting for a run directory to appear.
WAIT_POLL_S: Final = 0.2
#: Reads retried per refresh when a part vanishes mid-read (compaction), and the pause.
READ_ATTEMPTS: Final = 3
RETRY_PAUSE_S: Final = 0.05
#: Rounds shown in the reward sparkline, and rollbacks/anomalies listed.
SPARK_ROUNDS: Final = 60
RECENT_ROWS: Final = 5
SPARK_CHARS: Final = "▁▂▃▄▅▆▇█"
STAGES: Final = tuple(
    s.value for s in SeedStage if s not in (SeedStage.DORMANT, SeedStage.RESETTING)
)
#: Short column names so the seed table fits an 80-column terminal.
_STAGE_ABBREV: Final = {
    "GERMINATED": "germ",
    "TRAINING": "train",
    "BLENDING": "blend",
    "HOLDING": "hold",
    "FOSSILIZED": "fossil",
    "PRUNED": "pruned",
    "EMBARGOED": "embargo",
}
_NS_PER_S: Final = 1e9
#: Errors that mean "the directory changed under the read", not "the run is broken".
_TRANSIENT: Final = (OSError, pl.exceptions.PolarsError, pa.ArrowException, CorruptFileError)


@dataclasses.dataclass(frozen=True)
class WatchState:
    """Everything the view shows, from one read of the run directory."""

    run_id: str
    status: str
    task: str
    policy: str
    n_envs: int
    episode_length: int
    rounds_planned: int
    round: int
    rounds_done: int
    step: int
    env_steps: int
    eps_last: float | None
    eps_live: float | None
    rewards: list[float]
    accuracy_last: float | None
    seeds: pl.DataFrame
    recent: list[str]
    writer: dict[str, Any]
    heartbeat_age_s: float | None
    error: str = ""
    note: str = ""


def _last(frame: pl.DataFrame) -> dict[str, Any]:
    return frame.row(-1, named=True) if frame.height else {}


def _progress(reader: RunReader) -> tuple[int, int, int, float | None]:
    """(current round, step reached in it, env-steps so far, live EPS of that round)."""
    rounds = reader.frame("round_started")
    current = int(rounds["round"].max()) if "round" in rounds.columns and rounds.height else -1  # type: ignore[arg-type]
    steps = reader.frame("env_step")
    if "step" not in steps.columns:
        return current, -1, 0, None
    now = steps.filter(pl.col("round") == current)
    if not now.height:
        return current, -1, steps.height, None
    span = (int(now["ts_ns"].max()) - int(now["ts_ns"].min())) / _NS_PER_S  # type: ignore[arg-type]
    return current, int(now["step"].max()), steps.height, now.height / span if span else None  # type: ignore[arg-type]


def _seed_table(reader: RunReader, current: int, n_envs: int) -> pl.DataFrame:
    """Seeds of the current round per env and stage (env x stage counts)."""
    key = ["rank", "env", "seed_id"]
    stages: dict[tuple[Any, ...], str] = {}
    for event_type, stage in (
        ("seed_germinated", SeedStage.GERMINATED.value),
        ("seed_stage_changed", None),
        ("seed_fossilized", SeedStage.FOSSILIZED.value),
        ("seed_pruned", SeedStage.PRUNED.value),
    ):
        frame = reader.frame(event_type)
        if "round" not in frame.columns:
            continue
        for row in frame.filter(pl.col("round") == current).iter_rows(named=True):
            ended = stages.get(tuple(row[k] for k in key))
            if ended in (SeedStage.FOSSILIZED.value, SeedStage.PRUNED.value):
                continue  # an ended seed stays ended
            stages[tuple(row[k] for k in key)] = stage or str(row["to_stage"])
    counts: dict[tuple[int, str], int] = {}
    for (_, env, _), stage in stages.items():
        counts[(int(env), stage)] = counts.get((int(env), stage), 0) + 1
    envs = sorted(set(range(n_envs)) | {e for e, _ in counts})
    return pl.DataFrame(
        [{"env": e, **{s: counts.get((e, s), 0) for s in STAGES}} for e in envs],
        schema={"env": pl.Int64, **dict.fromkeys(STAGES, pl.Int64)},
    )


def _recent(reader: RunReader) -> list[str]:
    """The latest rollbacks and anomalies, newest last, as one line each."""
    lines: list[tuple[int, str]] = []
    rollbacks = reader.frame("governor_rollback")
    for row in rollbacks.tail(RECENT_ROWS).iter_rows(named=True) if rollbacks.width > 2 else ():
        lines.append(
            (
                int(row["seq"]),
                f"rollback  round {row['round']} env {row['env']} step {row['step']}: "
                f"{row['reason']} (loss {row['loss']:.3g} > {row['threshold']:.3g})",
            )
        )
    anomalies = reader.frame("anomaly_detected")
    for row in anomalies.tail(RECENT_ROWS).iter_rows(named=True) if anomalies.width > 2 else ():
        where = f"round {row['round']}" + (f" env {row['env']}" if row["env"] >= 0 else "")
        lines.append((int(row["seq"]), f"anomaly   {where}: {row['kind']} {row['detail']}"))
    return [text for _, text in sorted(lines)[-RECENT_ROWS:]]


def snapshot(
    path: str | Path, *, reader: RunReader | None = None, now_ns: int | None = None
) -> WatchState:
    """Read the run directory once (no retry; see :func:`read_state`).

    Pass the same ``reader`` on every refresh: it reads each part file only once.
    """
    reader = reader or RunReader(path)
    reader.refresh()
    manifests = reader.manifests()
    manifest = manifests.get(0) or (manifests[min(manifests)] if manifests else {})
    started = _last(reader.frame("run_started"))
    n_envs = int(started.get("n_envs", 0))
    current, step, env_steps, eps_live = _progress(reader)
    finished = reader.frame("round_finished")
    if "round" in finished.columns:
        finished = finished.unique("round", keep="last").sort("round")
    end = _last(reader.frame("run_finished"))
    beat = manifest.get("heartbeat_ns")
    now = time.time_ns() if now_ns is None else now_ns
    writer = manifest.get("writer")
    has_rounds = "eps" in finished.columns and finished.height > 0
    return WatchState(
        run_id=str(manifest.get("run_id") or Path(path).name),
        status=reader.status(manifests).value,
        task=str(started.get("task", "?")),
        policy=str(started.get("policy_kind", "?")),
        n_envs=n_envs,
        episode_length=int(started.get("episode_length", 0)),
        rounds_planned=int(started.get("rounds", 0)),
        round=current,
        rounds_done=finished.height if has_rounds else 0,
        step=step,
        env_steps=int(end["env_steps"]) if end else env_steps,
        eps_last=float(finished["eps"][-1]) if has_rounds else None,
        eps_live=eps_live,
        rewards=[float(v) for v in finished["mean_episode_reward"]] if has_rounds else [],
        accuracy_last=float(finished["mean_final_accuracy"][-1]) if has_rounds else None,
        seeds=_seed_table(reader, current, n_envs),
        recent=_recent(reader),
        writer=writer if isinstance(writer, dict) else {},
        heartbeat_age_s=(now - beat) / _NS_PER_S if isinstance(beat, int) else None,
        error=str(end.get("error", "")),
        note=f"unreadable parts skipped: {len(reader.skipped)}" if reader.skipped else "",
    )


def read_state(
    path: str | Path,
    previous: WatchState | None = None,
    *,
    read: Callable[[str | Path], WatchState] = snapshot,
    sleep: Callable[[float], None] = time.sleep,
) -> WatchState:
    """A snapshot, retried when the directory changes mid-read; else the previous view."""
    error: Exception | None = None
    for attempt in range(READ_ATTEMPTS):
        try:
            return read(path)
        except _TRANSIENT as exc:
            error = exc
            if attempt + 1 < READ_ATTEMPTS:
                sleep(RETRY_PAUSE_S)
    if previous is None:
        assert error is not None
        raise error
    return dataclasses.replace(previous, note=f"last read failed, retrying: {error}")


def sparkline(values: list[float]) -> str:
    """Unicode block sparkline of the last :data:`SPARK_ROUNDS` values."""
    shown = values[-SPARK_ROUNDS:]
    if not shown:
        return ""
    lo, hi = min(shown), max(shown)
    top = len(SPARK_CHARS) - 1
    return "".join(SPARK_CHARS[0 if hi == lo else round((v - lo) / (hi - lo) * top)] for v in shown)


def _fmt(value: float | None, spec: str = ".3g") -> str:
    if value is None:
        return "—"
    text = format(value, spec)
    return "0" if text in ("-0", "-0.0") else text


_STATUS_STYLE: Final = {
    "running": "bold green",
    "finished": "bold",
    "crashed": "bold red",
    "failed": "bold red",
    "interrupted": "bold yellow",
}


def _header(s: WatchState) -> Text:
    text = Text(f"run {s.run_id}  ")
    text.append(s.status, style=_STATUS_STYLE.get(s.status, ""))
    shape = f"{plural(s.n_envs, 'env')} × {plural(s.episode_length, 'step')}"
    text.append(f"  {s.task} · {s.policy} · {shape}")
    if s.error:
        text.append(f"\nerror: {s.error}", style="red")
    return text


def _round(s: WatchState) -> str:
    """The current round counted from 1, out of the planned rounds."""
    return f"{s.round + 1}/{s.rounds_planned}" if s.round >= 0 else "—"


def _progress_lines(s: WatchState) -> Text:
    shown_round = _round(s)
    step = f"{s.step + 1}/{s.episode_length}" if s.step >= 0 else "—"
    # The round in progress has a live EPS; once the run stopped there is only the last
    # completed round's (one EPS per round, as the trainer reported it).
    live = f"  this round {_fmt(s.eps_live)}" if s.status == RunStatus.RUNNING.value else ""
    text = Text(
        f"round {shown_round} (done {s.rounds_done})  step {step}  env-steps {s.env_steps}\n"
        f"EPS last round {_fmt(s.eps_last)}{live}\n"
    )
    last = s.rewards[-1] if s.rewards else None
    text.append(f"mean episode reward/round {sparkline(s.rewards)} last {_fmt(last, '+.3f')}")
    text.append(f"  final acc {_fmt(s.accuracy_last, '.1f')}%")
    return text


def _seeds(s: WatchState) -> Table:
    table = Table(title=f"seeds by stage, round {_round(s)}", title_justify="left")
    table.add_column("env", justify="right")
    for stage in STAGES:
        table.add_column(_STAGE_ABBREV.get(stage, stage.lower()), justify="right")
    for row in s.seeds.iter_rows():
        table.add_row(str(row[0]), *(str(v) if v else "·" for v in row[1:]))
    return table


def _writer(s: WatchState) -> Text:
    w = s.writer
    blocked = w.get("blocked_ns")
    age = ""
    if s.status == RunStatus.RUNNING.value and s.heartbeat_age_s is not None:
        age = f"; heartbeat {s.heartbeat_age_s:.1f} s ago"
    return Text(
        f"writer: {w.get('events_written', '—')} events, {w.get('flushes', '—')} flushes, "
        f"backlog max {w.get('max_queue_depth', '—')} events/flush, blocked "
        f"{_fmt(None if blocked is None else blocked / _NS_PER_S)} s "
        f"({w.get('blocked_emits', '—')} emits), dropped {w.get('dropped', '—')}{age}"
    )


def render(s: WatchState) -> RenderableType:
    """The whole view as one rich renderable."""
    parts: list[RenderableType] = [_header(s), _progress_lines(s), _seeds(s)]
    parts.append(Text("recent rollbacks/anomalies:", style="bold"))
    parts.append(Text("\n".join(s.recent) if s.recent else "none"))
    parts.append(_writer(s))
    if s.note:
        parts.append(Text(s.note, style="yellow"))
    return Group(*parts)


def wait_for_run(
    path: str | Path,
    timeout_s: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    on_wait: Callable[[], None] = lambda: None,
) -> None:
    """Return once ``path`` is a run directory; ``on_wait`` is called once if it is not
    yet. A run that does not appear within ``timeout_s`` is a :class:`RunNotFoundError`,
    and so at once is a directory of runs (it will not become one)."""
    run_dir = Path(path)
    deadline = clock() + timeout_s
    waited = False
    while not is_run_dir(run_dir):
        if _holds_runs(run_dir):
            names = ", ".join(sorted(p.name for p in run_dir.iterdir() if is_run_dir(p))[:5])
            raise RunNotFoundError(
                f"{run_dir} holds runs ({names}), it is not one: pass a run directory"
            )
        if clock() >= deadline:
            raise RunNotFoundError(
                f"no run appeared at {run_dir} within {timeout_s:g} s "
                "(is the training started with this --telemetry-dir and --run-id? "
                "--wait S waits longer)"
            )
        if not waited:
            on_wait()
            waited = True
        sleep(WAIT_POLL_S)


def _holds_runs(path: Path) -> bool:
    """A telemetry directory (runs in it), not a run that is starting."""
    return path.is_dir() and any(p.is_dir() and is_run_dir(p) for p in path.iterdir())


def watch(
    path: str | Path,
    console: Console,
    *,
    once: bool = False,
    refresh_s: float = MAX_REFRESH_S,
    sleep: Callable[[float], None] = time.sleep,
    wait_s: float = 0.0,
) -> WatchState:
    """Show the run until it is no longer running (or once); returns the last state.

    ``wait_s``: how long to wait for a run directory that does not exist yet (a watcher
    started a moment before the trainer).
    """

    def waiting() -> None:
        console.print(
            f"waiting up to {wait_s:g} s for run {path} to start ...", markup=False, soft_wrap=True
        )

    wait_for_run(path, wait_s, sleep=sleep, on_wait=waiting)
    reader = RunReader(path)

    def read(p: str | Path) -> WatchState:
        return snapshot(p, reader=reader)

    state = read_state(path, read=read)
    if once or state.status != RunStatus.RUNNING.value:
        console.print(render(state))
        return state
    with Live(render(state), console=console, auto_refresh=False) as live:
        while state.status == RunStatus.RUNNING.value:
            sleep(refresh_s)
            state = read_state(path, state, read=read)
            live.update(render(state), refresh=True)
    return state
