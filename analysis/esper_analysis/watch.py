"""``esper watch RUN``: a live terminal view of a run, read from its directory alone.

The view is rebuilt from the manifest and the *closed* Parquet parts on every refresh
by the one reader of runs (:func:`esper_analysis.loader.load_run`: the writer renames a
part into place only when it is complete), so the watcher never talks to the trainer
or its writer; it costs the trainer only the CPU of its reads: each file's footer is
read once, and the queries read the current round's rows and the small event types. A
part merged away between listing and reading fails the read, which is retried; the
previous view stays on screen meanwhile.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec
import polars as pl
import pyarrow as pa
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from esper.core.enums import RunStatus, SeedStage
from esper_analysis.errors import CorruptFileError, RunNotFoundError
from esper_analysis.loader import Run, is_run_dir, load_run
from esper_analysis.tables import plural

#: Longest allowed refresh interval (the issue's bound) and the default.
MAX_REFRESH_S: Final = 1.0
#: Poll interval while waiting for a run directory to appear.
WAIT_POLL_S: Final = 0.2
#: Reads tried per refresh when a part vanishes mid-read (a merge), and the pause.
READ_ATTEMPTS: Final = 8
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


def _frame(
    run: Run,
    event_type: str,
    *columns: str,
    current: int | None = None,
    since: dict[int, int] | None = None,
) -> pl.DataFrame:
    """``rank``, ``seq`` and ``columns`` of one type in order (of round ``current``,
    from the files that reach ``since``, per rank)."""
    lf = run.scan(event_type, since=since)
    if current is not None:
        lf = lf.filter(pl.col("round") == current)
    return lf.select("rank", "seq", *columns).sort("rank", "seq").collect()


def _progress(run: Run) -> tuple[int, int, dict[int, int], int, float | None]:
    """(current round, step reached in it, where it starts per rank, env-steps so far,
    live EPS of that round). Only the newest files of the big types are read."""
    newest = {f.rank: f.first for f in run.files.get("round_started", ())}  # ascending
    rounds = _frame(run, "round_started", "round", since=newest)
    current = int(rounds["round"].max()) if rounds.height else -1  # type: ignore[arg-type]
    starts = dict(rounds.filter(pl.col("round") == current).select("rank", "seq").rows())
    since = {
        rank: starts.get(rank, 0) for rank in {f.rank for fs in run.files.values() for f in fs}
    }
    env_steps = run.rows_on_disk("env_step")
    now = _frame(run, "env_step", "step", "ts_ns", current=current, since=since)
    if not now.height:
        return current, -1, since, env_steps, None
    span = (int(now["ts_ns"].max()) - int(now["ts_ns"].min())) / _NS_PER_S  # type: ignore[arg-type]
    eps = now.height / span if span else None
    return current, int(now["step"].max()), since, env_steps, eps  # type: ignore[arg-type]


def _seed_table(run: Run, current: int, since: dict[int, int], n_envs: int) -> pl.DataFrame:
    """Seeds of the current round per env and stage (env x stage counts)."""
    key = ["rank", "env", "seed_id"]
    stages: dict[tuple[Any, ...], str] = {}
    for event_type, stage in (
        ("seed_germinated", SeedStage.GERMINATED.value),
        ("seed_stage_changed", None),
        ("seed_fossilized", SeedStage.FOSSILIZED.value),
        ("seed_pruned", SeedStage.PRUNED.value),
    ):
        columns = ("env", "seed_id", "to_stage") if stage is None else ("env", "seed_id")
        rows = _frame(run, event_type, *columns, current=current, since=since)
        for row in rows.iter_rows(named=True):
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


def _recent(run: Run) -> list[str]:
    """The latest rollbacks and anomalies, newest last, as one line each."""
    lines: list[tuple[int, str]] = []
    rollbacks = _frame(
        run, "governor_rollback", "round", "env", "step", "reason", "loss", "threshold"
    )
    for row in rollbacks.tail(RECENT_ROWS).iter_rows(named=True):
        lines.append(
            (
                int(row["seq"]),
                f"rollback  round {row['round']} env {row['env']} step {row['step']}: "
                f"{row['reason']} (loss {row['loss']:.3g} > {row['threshold']:.3g})",
            )
        )
    anomalies = _frame(run, "anomaly_detected", "round", "env", "kind", "detail")
    for row in anomalies.tail(RECENT_ROWS).iter_rows(named=True):
        where = f"round {row['round']}" + (f" env {row['env']}" if row["env"] >= 0 else "")
        lines.append((int(row["seq"]), f"anomaly   {where}: {row['kind']} {row['detail']}"))
    return [text for _, text in sorted(lines)[-RECENT_ROWS:]]


def snapshot(path: str | Path, *, now_ns: int | None = None) -> WatchState:
    """Read the run directory once (no retry; see :func:`read_state`)."""
    with warnings.catch_warnings():  # a live run's skipped parts are noted in the view
        warnings.simplefilter("ignore")
        run = load_run(path)
    manifest = run.manifest
    started = _last(
        _frame(run, "run_started", "task", "policy_kind", "n_envs", "episode_length", "rounds")
    )
    n_envs = int(started.get("n_envs", 0))
    current, step, since, env_steps, eps_live = _progress(run)
    finished = _frame(
        run, "round_finished", "round", "eps", "mean_episode_reward", "mean_final_accuracy"
    )
    finished = finished.unique("round", keep="last").sort("round")
    end = _last(_frame(run, "run_finished", "env_steps", "error"))
    now = time.time_ns() if now_ns is None else now_ns
    has_rounds = finished.height > 0
    return WatchState(
        run_id=run.run_id,
        status=run.status.value,
        task=str(started.get("task", "?")),
        policy=str(started.get("policy_kind", "?")),
        n_envs=n_envs,
        episode_length=int(started.get("episode_length", 0)),
        rounds_planned=int(started.get("rounds", 0)),
        round=current,
        rounds_done=finished.height,
        step=step,
        env_steps=int(end["env_steps"]) if end else env_steps,
        eps_last=float(finished["eps"][-1]) if has_rounds else None,
        eps_live=eps_live,
        rewards=[float(v) for v in finished["mean_episode_reward"]],
        accuracy_last=float(finished["mean_final_accuracy"][-1]) if has_rounds else None,
        seeds=_seed_table(run, current, since, n_envs),
        recent=_recent(run),
        writer=msgspec.structs.asdict(manifest.writer) if manifest else {},
        heartbeat_age_s=(now - manifest.heartbeat_ns) / _NS_PER_S if manifest else None,
        error=str(end.get("error", "")),
        note=f"unreadable parts skipped: {len(run.skipped)}" if run.skipped else "",
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
    state = read_state(path)
    if once or state.status != RunStatus.RUNNING.value:
        console.print(render(state))
        return state
    with Live(render(state), console=console, auto_refresh=False) as live:
        while state.status == RunStatus.RUNNING.value:
            sleep(refresh_s)
            state = read_state(path, state)
            live.update(render(state), refresh=True)
    return state
