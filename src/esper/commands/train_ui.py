"""Terminal side of ``esper train``/``esper heuristic``: progress bar, summary, exit codes.

Imports torch (through the trainer); only loaded once a training command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from esper.config import Config
from esper.errors import UserError
from esper.telemetry.writer import TelemetryWriteError
from esper.training.loop.distributed import DEFAULT_TIMEOUT_S, Collective, init_collective
from esper.training.loop.faults import FaultPlan, parse_fault
from esper.training.loop.trainer import RoundSummary, StepProgress
from esper.training.run import CheckpointLedger, Terminated, TrainResult, train

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
#: 128 + SIGTERM, what shells and supervisors expect from a process ended by SIGTERM.
EXIT_TERMINATED = 143


class _ProgressView:
    """Rounds and steps with EPS and mean reward, drawn on stderr."""

    def __init__(self, cfg: Config, console: Console, enabled: bool) -> None:
        self.enabled = enabled
        self.total_steps = cfg.run.rounds * cfg.run.episode_length
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} steps"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self.task = self.progress.add_task("round 0", total=self.total_steps, info="")
        self.last = ""

    def __call__(self, item: StepProgress | RoundSummary) -> None:
        if isinstance(item, StepProgress):
            done = item.rnd * item.episode_length + item.step + 1
            self.progress.update(
                self.task,
                completed=done,
                description=f"round {item.rnd + 1}/{item.total_rounds}",
                info=self.last,
            )
        else:
            self.last = (
                f"EPS {item.eps:.1f}  reward {item.mean_reward:+.2f}  "
                f"acc {item.mean_final_acc:.1f}%"
            )
            self.progress.update(self.task, info=self.last)


def run_training(cfg: Config, args: argparse.Namespace) -> int:
    """One process, or one rank of a torchrun launch (``WORLD_SIZE`` > 1)."""
    timeout = float(getattr(args, "dist_timeout", DEFAULT_TIMEOUT_S))
    collective = init_collective(cfg.run.device, timeout_s=timeout)
    try:
        return _run_training(cfg, args, collective)
    finally:
        if collective is not None:
            collective.close()


def _run_training(cfg: Config, args: argparse.Namespace, collective: Collective | None) -> int:
    console = Console(stderr=True)
    main = collective is None or collective.is_main
    if collective is not None and not main:  # say which rank the messages come from
        console.print(f"rank {collective.rank}/{collective.world_size}", markup=False)
    faults = FaultPlan([parse_fault(s) for s in args.inject_fault])
    tty = not args.no_progress and sys.stderr.isatty()
    view = _ProgressView(cfg, console, enabled=main and tty)
    ledger = CheckpointLedger()
    try:
        with view.progress, _sigterm_as_interrupt(), _resume_names_rank0(ledger, collective):
            result = train(
                cfg,
                progress=view,
                faults=faults,
                save=args.save,
                resume=args.resume,
                continue_run=args.continue_run,
                ledger=ledger,
                collective=collective,
            )
        if collective is not None:  # every rank's telemetry closed before the report
            collective.barrier()
    except KeyboardInterrupt as exc:
        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        console.print(
            f"{what}: telemetry flushed; {_checkpoint_note(ledger)}", markup=False, soft_wrap=True
        )
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    except UserError:
        raise
    except Exception as exc:  # a failed run: say what and where the data is
        if os.environ.get("ESPER_TRACEBACK"):
            traceback.print_exc()
        # soft_wrap: one line per message whatever the terminal width (logs, grep)
        console.print(
            f"error: training failed: {type(exc).__name__}: {exc}", markup=False, soft_wrap=True
        )
        saved = (
            "the events written before the failure are intact"
            if isinstance(exc, TelemetryWriteError)
            else "telemetry was flushed"
        )
        console.print(
            f"{saved}; {_checkpoint_note(ledger, said=str(exc))}; "
            "set ESPER_TRACEBACK=1 for the traceback",
            markup=False,
            soft_wrap=True,
        )
        return EXIT_FAILED
    out = Console()
    if not main:
        return 0
    _print_summary(result, out)
    if args.report is not None:
        _write_report(result, args.report, out)
    return 0


def run_evaluation(cfg: Config, args: argparse.Namespace) -> int:
    """``esper evaluate``: progress, the summary table and the optional report."""
    from esper.training.loop.evaluate import evaluate

    console = Console(stderr=True)
    view = _ProgressView(cfg, console, enabled=not args.no_progress and sys.stderr.isatty())
    try:
        with view.progress, _sigterm_as_interrupt():
            result = evaluate(cfg, args.checkpoint, progress=view, sample=args.sample)
    except KeyboardInterrupt as exc:
        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        console.print(f"{what}: telemetry flushed", markup=False)
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    out = Console()
    _print_summary(result, out)
    if args.report is not None:
        _write_report(result, args.report, out)
    return 0


def _checkpoint_note(ledger: CheckpointLedger, *, said: str = "") -> str:
    """Which checkpoint resumes the run: only what is true on disk (``said``: the error
    already printed, so a failed save is not reported twice)."""
    failed = ""
    if ledger.save_error and ledger.save_error not in said:
        failed = f"saving a checkpoint failed ({ledger.save_error}); "
    if ledger.path is None:
        return f"{failed}no checkpoint was written, so there is none to resume from"
    return (
        f"{failed}the last good checkpoint is {ledger.path} "
        f"(resumes at round {ledger.next_round}: --resume {ledger.path})"
    )


@contextlib.contextmanager
def _resume_names_rank0(ledger: CheckpointLedger, collective: Collective | None) -> Iterator[None]:
    """On rank r > 0 the resume hint names rank 0's file: ``--resume`` takes that one,
    every rank finds its own ``-rank<r>`` file beside it."""
    try:
        yield
    finally:
        if collective is not None and collective.rank and ledger.path is not None:
            suffix = f"-rank{collective.rank}"
            stem = ledger.path.stem.removesuffix(suffix)
            ledger.path = ledger.path.with_name(stem + ledger.path.suffix)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (docker stop, Slurm, systemd, timeout) ends the run like Ctrl-C does.

    The first SIGTERM raises :class:`Terminated` in the main thread; later ones are
    ignored so they cannot cut the clean close short (SIGKILL still works).
    """

    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _write_report(r: TrainResult, target: str, console: Console) -> None:
    """Hand the finished run to the analysis layer (it reads only the Parquet events)."""
    if r.run_dir is None:
        console.print("no report: telemetry level is off, so there is no run directory")
        return
    from esper_analysis import load_run, write_report

    path = write_report(load_run(r.run_dir), target or r.run_dir / "report.html")
    console.print(f"report: {path.absolute()}", soft_wrap=True)


def _print_summary(r: TrainResult, console: Console) -> None:
    table = Table(title=f"run {r.run_id}: {r.status.value}", show_header=True)
    for col in ("round", "mean reward", "final acc %", "rollbacks", "EPS"):
        table.add_column(col, justify="right")
    rows = r.rounds if len(r.rounds) <= 12 else [*r.rounds[:5], *r.rounds[-6:]]
    for s in rows:
        table.add_row(
            str(s.rnd),
            f"{s.mean_reward:+.3f}",
            f"{s.mean_final_acc:.1f}",
            str(s.rollbacks),
            f"{s.eps:.1f}",
        )
    console.print(table)
    console.print(
        f"env-steps {r.env_steps} in {r.wall_s:.1f}s ({r.eps:.1f} EPS), rollbacks {r.rollbacks}"
    )
    # Absolute paths, all three alike: they are copied into other commands.
    if r.run_dir is not None:
        console.print(f"run directory: {r.run_dir.absolute()}", soft_wrap=True)
    if r.checkpoint is not None:
        console.print(f"checkpoint: {r.checkpoint.absolute()}", soft_wrap=True)
