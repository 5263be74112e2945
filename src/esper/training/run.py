"""``esper.train(config, ...)``: build the collaborators, run the rounds, never lose data.

Collaborators are injected (``telemetry=``, ``data=``, ``policy=``) and built from the
config only when not given. Whatever happens (normal end, exception, Ctrl-C, SIGTERM)
the hub is flushed and closed with the right status, and the checkpoint on disk is the
state at the end of the last completed round: a partial round is never checkpointed
(its events lie after the checkpoint's sequence position, so ``--continue-run`` cuts
them and replays the round exactly as an uninterrupted run would).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from esper.config import Config, config_hash_of, with_overrides
from esper.core.enums import RunStatus, TelemetryLevel
from esper.data.tasks import TaskData, load_task
from esper.errors import CheckpointError, CheckpointSaveError, UserError
from esper.policy.protocol import Policy
from esper.telemetry.emit_log import with_emit_log
from esper.telemetry.hub import Hub, open_run
from esper.telemetry.paths import resolve_run_dir, validate_run_id
from esper.telemetry.resume import check_new_run_dir, check_resumable
from esper.training.learning.learner import Learner
from esper.training.learning.policy_factory import build_policy
from esper.training.loop.checkpoint import compat_fingerprint, load_checkpoint, save_checkpoint
from esper.training.loop.distributed import (
    Collective,
    RankHub,
    check_world_size,
    global_run,
    rank_checkpoint,
    rank_device,
    rank_path,
)
from esper.training.loop.faults import FaultPlan, check_faults
from esper.training.loop.recorder import Recorder
from esper.training.loop.run_setup import (
    action_space_for,
    check_envs_fit,
    configure_torch,
    default_run_id,
    resolve_device,
)
from esper.training.loop.trainer import ProgressFn, RoundSummary, VectorizedTrainer

CHECKPOINT_NAME = "checkpoint.pt"


class Terminated(KeyboardInterrupt):
    """SIGTERM (docker stop, Slurm, systemd, ``timeout``): handled exactly like Ctrl-C."""


@dataclass
class CheckpointLedger:
    """The last good checkpoint of this run's progress, for messages that must be true.

    Passed in by the caller and kept up to date while training, so that after an
    interrupt or an error (when :func:`train` returns nothing) the CLI can say which
    checkpoint resumes the run, from which round, or that none was written.
    """

    path: Path | None = None
    #: The round that checkpoint resumes at.
    next_round: int = -1
    #: Why the last save failed ("" when none did).
    save_error: str = ""


@dataclass
class _RoundEnd:
    """The training state at the end of a completed round, not yet on disk."""

    next_round: int
    seq_position: int
    learner: dict[str, Any]
    torch_rng: torch.Tensor
    #: Rollbacks of the whole run so far (a continued run's totals include them).
    rollbacks: int
    #: Wall seconds of the whole run so far, every session's (its EPS divides by them).
    wall_s: float


@dataclass
class TrainResult:
    run_id: str
    run_dir: Path | None
    status: RunStatus
    rounds_completed: int
    env_steps: int
    wall_s: float
    eps: float
    rollbacks: int
    checkpoint: Path | None
    rounds: list[RoundSummary] = field(default_factory=list)


def train(
    config: Config,
    *,
    telemetry: Hub | None = None,
    data: TaskData | None = None,
    policy: Policy | None = None,
    progress: ProgressFn | None = None,
    faults: FaultPlan | None = None,
    save: str | Path | None = None,
    resume: str | Path | None = None,
    continue_run: bool = False,
    ledger: CheckpointLedger | None = None,
    collective: Collective | None = None,
    first_round: int = 0,
) -> TrainResult:
    """Train (PPO or heuristic, per ``config.policy.kind``) and return a summary.

    ``first_round`` (a fresh run): play rounds ``first_round .. run.rounds - 1`` only. A
    rule-based policy's round depends on nothing but the seed and the round, so this
    measures exactly those rounds of a full run (benchmarks pair them with a learning
    run's last third); a learning policy starts there untrained.

    ``ledger`` (optional) is kept pointing at the last good checkpoint, for callers that
    report on an interrupted or failed run. ``collective`` makes this process one rank
    of a multi-process run (:mod:`esper.training.loop.distributed`); checkpoint paths
    (``save``, ``resume``) name rank 0's file, rank r uses ``<stem>-rank<r>.pt``.
    """
    rank = collective.rank if collective is not None else 0
    if collective is not None:
        config = with_overrides(config, {"run.device": rank_device(config.run.device, collective)})
        resume = rank_checkpoint(Path(resume), collective) if resume is not None else None
    cfg = resolve_device(config)
    if continue_run and resume is None:
        raise UserError("--continue-run needs --resume PATH (the checkpoint to continue from)")
    configure_torch(cfg)
    state = load_checkpoint(resume, cfg) if resume is not None else None
    if state is not None:
        check_world_size(state, resume, collective)
    start = _first_round(cfg, state, resume, first_round)
    if faults is not None:
        check_faults(faults, global_run(cfg.run, collective), start_round=start)
    ledger = ledger if ledger is not None else CheckpointLedger()
    if state is not None and resume is not None:
        ledger.path, ledger.next_round = Path(resume), start
    run_id, parent = _run_identity(cfg, state, continue_run)
    if collective is not None:  # the default id has a timestamp: rank 0's is the run's
        run_id = collective.broadcast_str(run_id)
    cfg = with_overrides(cfg, {"run.run_id": run_id})
    continued = continue_run and state is not None
    open_status = (
        _check_continued(cfg, run_id, resume, rank) if continued and telemetry is None else None
    )
    if not (continued and open_status is not None and open_status is not RunStatus.FINISHED):
        _check_rounds_left(cfg, start, resume)  # a never-closed run is closed instead
    ckpt_path = Path(save) if save is not None else _default_checkpoint(cfg, run_id)
    restart = False
    if telemetry is None and not continued:
        restart = check_telemetry_dir(cfg, run_id, rank=rank, checkpoint=rank_path(ckpt_path, rank))
    data = data if data is not None else load_task(cfg.task, seed=cfg.run.seed)
    check_envs_fit(cfg, data, collective.world_size if collective is not None else 1)
    space = action_space_for(cfg, data)
    learner = Learner(
        cfg,
        space,
        policy if policy is not None else build_policy(cfg, space),
        collective=collective,
    )
    if state is not None:
        _restore_learner(learner, state, resume)
    hub = (
        telemetry
        if telemetry is not None
        else open_hub(cfg, run_id, parent, state, continue_run, collective=collective,
                       replace=restart)
    )  # fmt: skip
    if collective is not None:
        hub = RankHub(hub, rank=rank)
    try:
        recorder = Recorder(hub, reward_family=cfg.reward.family.value)
        trainer = VectorizedTrainer(
            cfg, recorder=recorder, task=data, learner=learner, faults=faults,
            progress=progress, collective=collective,
        )  # fmt: skip
        _session_started(recorder, cfg, learner, parent, state, resume, continued)
    except KeyboardInterrupt as exc:  # before the first round: nothing to checkpoint yet
        hub.close(RunStatus.INTERRUPTED, f"{_interrupt_reason(exc)} before the first round")
        raise
    except BaseException as exc:
        hub.close(RunStatus.FAILED, f"{type(exc).__name__}: {exc}")
        raise
    run_dir = getattr(hub, "run_dir", None)
    saver = _Saver(cfg, learner, recorder, rank_path(ckpt_path, rank), ledger, collective)
    before = _Before.of(cfg, state, saver.world_size) if continued else _Before()
    return run_rounds(cfg, trainer, saver, start, run_dir, before)


def _first_round(
    cfg: Config, state: dict[str, Any] | None, resume: str | Path | None, first_round: int
) -> int:
    """Where the run starts: the checkpoint's next round, or ``first_round`` of a fresh
    run (which must lie inside it)."""
    if first_round and (resume is not None or not 0 < first_round < cfg.run.rounds):
        raise UserError(
            f"first_round {first_round}: a fresh run's first round, below run.rounds "
            f"({cfg.run.rounds}); a resume starts where its checkpoint says"
        )
    return int(state["next_round"]) if state is not None else first_round


def _restore_learner(learner: Learner, state: dict[str, Any], resume: str | Path | None) -> None:
    """A resumed run's policy, optimiser and normaliser state, or an error naming the file."""
    try:
        learner.load_state_dict(state["learner"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(
            f"{resume}: the checkpoint's policy state does not fit this configuration "
            f"({type(exc).__name__}: {exc})"
        ) from None


@dataclass(frozen=True)
class _Before:
    """What the sessions before a continued one completed (a run's totals span them)."""

    rounds: int = 0
    env_steps: int = 0
    rollbacks: int = 0
    wall_s: float = 0.0

    @classmethod
    def of(cls, cfg: Config, state: dict[str, Any] | None, world_size: int) -> _Before:
        if state is None:
            return cls()
        rounds = int(state["next_round"])
        steps = rounds * cfg.run.n_envs * cfg.run.episode_length * world_size
        wall = float(state.get("wall_s", 0.0))  # 0: a checkpoint from before it was saved
        return cls(rounds, steps, int(state.get("rollbacks", 0)), wall)


def _session_started(
    recorder: Recorder,
    cfg: Config,
    learner: Learner,
    parent: str,
    state: dict[str, Any] | None,
    resume: str | Path | None,
    continued: bool,
) -> None:
    """A session's first events. A continued run first records again the checkpoint it
    resumes from (its ``checkpoint_saved`` was at the checkpoint's seq position, where
    the cut begins), so it keeps every checkpoint event an uninterrupted run has."""
    start_round = int(state["next_round"]) if state is not None else 0
    if continued and state is not None and resume is not None:
        recorder.checkpoint_saved(
            str(state.get("path") or resume),
            size=Path(resume).stat().st_size,
            next_round=start_round,
            seq=int(state["seq_position"]),
        )
    recorder.run_started(cfg, learner, parent, start_round)
    if state is not None and resume is not None:
        recorder.checkpoint_loaded(
            str(resume),
            next_round=start_round,
            parent=str(state["run_id"]),
            seq=int(state["seq_position"]),
        )


def _check_rounds_left(cfg: Config, start: int, resume: str | Path | None) -> None:
    """``run.rounds`` is the run's total: a resume past it would run nothing."""
    if start >= cfg.run.rounds:
        raise UserError(
            f"{resume}: the checkpoint resumes at round {start}, but --rounds (run.rounds, "
            f"the total number of rounds) is {cfg.run.rounds}: nothing is left to run; "
            f"pass --rounds greater than {start}"
        )


@contextlib.contextmanager
def _setup_frozen() -> Iterator[None]:
    """Leave the objects alive when the rounds start (torch's modules, the task, the
    policy: they outlive the rounds) out of the garbage collector's full passes
    (``gc.freeze``): scanning them cost 0.1-0.2 s per full collection at 64 envs on a
    2-core CPU, a pause a GPU waits through. Given back after the rounds (garbage among
    them is collected then), so runs repeated in one process leave nothing frozen."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_rounds(
    cfg: Config,
    trainer: VectorizedTrainer,
    saver: _Saver | None,
    start_round: int,
    run_dir: Path | None,
    before: _Before = _Before(),
) -> TrainResult:
    """Run the rounds; on any way out, checkpoint only completed rounds, then close."""
    t0 = time.perf_counter()
    next_round = start_round
    status, error = RunStatus.FINISHED, ""
    hub = trainer.hub
    try:
        with _setup_frozen():
            for rnd in range(start_round, cfg.run.rounds):
                trainer.run_round(rnd)
                if trainer.collective is not None and isinstance(trainer.learner.policy, nn.Module):
                    trainer.collective.check_replicas(trainer.learner.policy)
                next_round = rnd + 1
                every = cfg.run.checkpoint_every
                due = bool(every) and (next_round % every == 0 or next_round == cfg.run.rounds)
                rollbacks = before.rollbacks + trainer.state.rollbacks
                if saver is not None:  # None: an evaluation, which saves nothing
                    wall_s = before.wall_s + time.perf_counter() - t0
                    saver.round_completed(
                        next_round, save_now=due, rollbacks=rollbacks, wall_s=wall_s
                    )
    except KeyboardInterrupt as exc:
        status, error = RunStatus.INTERRUPTED, _interrupt_reason(exc)
        raise
    except BaseException as exc:
        status, error = RunStatus.FAILED, f"{type(exc).__name__}: {exc}"
        raise
    finally:
        wall = time.perf_counter() - t0
        # Multi-rank: every rank steps the same envs per step in lockstep.
        env_steps = trainer.state.env_steps * (saver.world_size if saver is not None else 1)
        with _sigterm_ignored():  # torchrun SIGTERMs every rank once one fails
            try:  # a failed telemetry writer makes these emits raise: still close the hub
                if status != RunStatus.FINISHED and saver is not None:
                    saver.save_pending_quietly()
                trainer.recorder.run_finished(  # totals of the whole run
                    status,
                    rounds=before.rounds + next_round - start_round,
                    env_steps=before.env_steps + env_steps,
                    wall=before.wall_s + wall,
                    rollbacks=before.rollbacks + trainer.state.rollbacks,
                    error=error,
                )
            finally:
                hub.close(status, error)
    return TrainResult(
        run_id=cfg.run.run_id,
        run_dir=run_dir,
        status=status,
        rounds_completed=next_round - start_round,
        env_steps=env_steps,
        wall_s=wall,
        eps=env_steps / wall if wall > 0 else 0.0,
        rollbacks=trainer.state.rollbacks,
        checkpoint=saver.path if saver is not None and saver.path.exists() else None,
        rounds=trainer.state.round_summaries,
    )


@contextlib.contextmanager
def _sigterm_ignored() -> Iterator[None]:
    """The run is ending: its last checkpoint and telemetry close must not be cut short.

    A SIGTERM now (torchrun sends one to every rank as soon as one rank fails, usually
    while the others are closing after the failed collective) would leave the run
    half-closed; it is ignored until the hub is closed. SIGKILL still works.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt_reason(exc: KeyboardInterrupt) -> str:
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted by user (Ctrl-C)"


def _run_identity(cfg: Config, state: dict[str, Any] | None, continue_run: bool) -> tuple[str, str]:
    """(run id, parent run id). A resume continues the parent or starts a linked run."""
    if state is None:
        return validate_run_id(cfg.run.run_id or default_run_id(cfg)), ""
    parent = str(state["run_id"])
    if continue_run:
        return validate_run_id(parent), ""
    child = cfg.run.run_id if cfg.run.run_id and cfg.run.run_id != parent else ""
    if child:
        return validate_run_id(child), parent
    return _free_run_id(cfg, validate_run_id(f"{parent}-resume{int(state['next_round'])}")), parent


def _free_run_id(cfg: Config, base: str) -> str:
    """An automatic id not taken yet: resuming one checkpoint twice must not collide."""
    if cfg.telemetry.level_enum == TelemetryLevel.OFF:
        return base
    candidate, n = base, 1
    while resolve_run_dir(cfg.telemetry.dir, candidate).exists():
        n += 1
        candidate = validate_run_id(f"{base}-{n}")
    return candidate


def check_telemetry_dir(cfg: Config, run_id: str, *, rank: int, checkpoint: Path) -> bool:
    """Fail on an unusable run directory before the (possibly slow) data load. True when
    the run id holds a run that stopped before completing a round (restarted: nothing
    complete is lost)."""
    if cfg.telemetry.level_enum == TelemetryLevel.OFF:
        return False
    run_dir = resolve_run_dir(cfg.telemetry.dir, run_id)
    return check_new_run_dir(
        run_dir, run_id=run_id, rank=rank, checkpoint=checkpoint, config_hash=cfg.fingerprint()
    )


def _check_continued(
    cfg: Config, run_id: str, resume: str | Path | None, rank: int
) -> RunStatus | None:
    """``--continue-run`` writes only into the run directory that holds the checkpoint,
    and only a run of the checkpoint's id; returns the run's status (None: telemetry off)."""
    if cfg.telemetry.level_enum == TelemetryLevel.OFF or resume is None:
        return None
    run_dir = resolve_run_dir(cfg.telemetry.dir, run_id)
    if Path(resume).resolve().parent != run_dir.resolve():
        raise UserError(
            f"--continue-run writes into the run directory that holds the checkpoint, but "
            f"{resume} belongs to run {run_id!r}, whose directory is {run_dir}; move the "
            "checkpoint back there, or drop --continue-run to start a new run linked to it"
        )
    return check_resumable(run_dir, run_id=run_id, rank=rank)


def open_hub(
    cfg: Config,
    run_id: str,
    parent: str,
    state: dict[str, Any] | None,
    continue_run: bool,
    *,
    collective: Collective | None = None,
    replace: bool = False,
) -> Hub:
    start_seq = int(state["seq_position"]) if state is not None and continue_run else 0
    hub = open_run(
        cfg.telemetry.dir,
        run_id,
        level=cfg.telemetry.level_enum,
        rank=collective.rank if collective is not None else 0,
        world_size=collective.world_size if collective is not None else 1,
        config_hash=cfg.fingerprint(),
        flush_interval_s=cfg.telemetry.flush_interval_s,
        queue_capacity=cfg.telemetry.queue_capacity,
        drop_when_full=cfg.telemetry.drop_when_full,
        start_seq=start_seq,
        parent_run_id=parent,
        resume=continue_run and state is not None,
        replace=replace,
        checkpoint_hash=config_hash_of(state.get("config")) if state and continue_run else "",
    )
    return with_emit_log(hub)  # the crash tests' side channel; a no-op unless asked for


def _default_checkpoint(cfg: Config, run_id: str) -> Path:
    return Path(cfg.telemetry.dir) / run_id / CHECKPOINT_NAME


class _Saver:
    """Writes checkpoints of completed rounds only, and keeps the ledger true.

    ``seq_position`` is the sequence number right after the round's last event (the
    ``checkpoint_saved`` event of an end-of-round save). Every event before it is
    flushed to disk first, so whenever the checkpoint exists the events it covers are
    durable: a ``--continue-run`` resume restarts at ``seq_position`` (cutting anything
    later, e.g. a partial round) without leaving a gap. A completed round that was not
    saved (``checkpoint_every`` > 1) is kept in memory and written on an interrupt or
    error, so the last completed round is never lost and never replaced by a partial one.
    """

    def __init__(
        self,
        cfg: Config,
        learner: Learner,
        recorder: Recorder,
        path: Path,
        ledger: CheckpointLedger,
        collective: Collective | None = None,
    ) -> None:
        self.cfg, self.learner, self.path, self.ledger = cfg, learner, path, ledger
        self.recorder, self.hub = recorder, recorder.hub
        self.world_size = collective.world_size if collective is not None else 1
        self.rank = collective.rank if collective is not None else 0
        self.pending: _RoundEnd | None = None

    def round_completed(
        self, next_round: int, *, save_now: bool, rollbacks: int, wall_s: float = 0.0
    ) -> None:
        state = self.learner.state_dict()
        self.pending = _RoundEnd(
            next_round=next_round,
            seq_position=self.hub.next_seq,
            # Kept past this call only when not saved now: copy, the learner moves on.
            learner=state if save_now else copy.deepcopy(state),
            torch_rng=torch.get_rng_state(),
            rollbacks=rollbacks,
            wall_s=wall_s,
        )
        if save_now:
            self._save(self.pending)

    def save_pending_quietly(self) -> None:
        """On the way out: write the last completed round if it is not on disk yet.

        A failure is recorded in the ledger, not raised: it must not mask the reason
        the run is ending. A save that already failed is not retried.
        """
        if self.pending is None or self.ledger.save_error:
            return
        try:
            self._save(self.pending)
        except Exception as exc:
            self.ledger.save_error = self.ledger.save_error or str(exc)

    def _save(self, end: _RoundEnd) -> None:
        # Durable (fsynced) before the checkpoint points past it: a failed flush fails
        # the checkpoint (an interrupted one is retried by save_pending_quietly).
        self.hub.flush()
        try:
            size = save_checkpoint(
                self.path,
                {
                    "run_id": self.cfg.run.run_id,
                    "next_round": end.next_round,
                    "seq_position": end.seq_position,
                    "config": self.cfg.to_json(),
                    "compat": compat_fingerprint(self.cfg),
                    "learner": end.learner,
                    "torch_rng": end.torch_rng,
                    "world_size": self.world_size,
                    "rank": self.rank,
                    "path": str(self.path),  # as its checkpoint_saved event names it
                    "rollbacks": end.rollbacks,
                    "wall_s": end.wall_s,
                },
            )
        except CheckpointSaveError as exc:
            self.ledger.save_error = str(exc)
            raise
        self.pending = None
        self.ledger.path, self.ledger.next_round = self.path, end.next_round
        self.recorder.checkpoint_saved(
            str(self.path), size=size, next_round=end.next_round, seq=end.seq_position
        )
