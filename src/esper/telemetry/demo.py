"""A deterministic synthetic training run, emitted through the real hub and writer.

Besides the trainer, this produces a realistic run directory: several envs and rounds,
seeds that germinate, advance through gates, blend, fossilize or get pruned (driven by
the model's own torch-free lifecycle code, :mod:`esper.telemetry.demo_env`), governor
rollbacks, PPO updates, an anomaly that escalates the level to ``debug`` for a bounded
number of rounds, checkpoints, and rewards whose components sum to the total. Every
event type of the catalogue appears with the default arguments. It is the one simulator
of the project: ``esper telemetry-demo`` and the analysis layer's synthetic runs
(:func:`esper_analysis.synth.synthesize_run`, the benchmarks' 10M-event run) both run
it. The numbers are synthetic (a seeded ``random.Random``), never measured; only
timestamps vary between two runs with the same seed.
"""

from __future__ import annotations

import platform
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import esper
from esper.core.constants import CNN_BLUEPRINTS, HEAD_NAMES
from esper.core.enums import AnomalyKind, RunStatus, TelemetryLevel
from esper.errors import UserError
from esper.telemetry import events as ev
from esper.telemetry.demo_env import DemoRound
from esper.telemetry.hub import Hub, open_run
from esper.telemetry.lock import RunLockedError, run_lock_owner
from esper.telemetry.manifest import read_manifests
from esper.telemetry.paths import resolve_run_dir

#: Round and env of the scripted governor rollback, and the round of the anomaly.
ROLLBACK_ROUND: Final = 1
ANOMALY_ROUND: Final = 0
#: Rounds the anomaly keeps the level at debug (the escalation is bounded).
ESCALATION_ROUNDS: Final = 1
DEMO_LAYERS: Final = ("stem.conv", "block0.conv", "block1.conv", "head.linear")


@dataclass(frozen=True)
class DemoResult:
    run_dir: Path
    counts: dict[str, int]
    events_emitted: int


@dataclass(frozen=True)
class DemoSettings:
    envs: int = 4
    rounds: int = 3
    steps: int = 10
    seed: int = 0
    level: TelemetryLevel = TelemetryLevel.NORMAL
    flush_interval_s: float = 0.5
    #: Chance that an episode has a governor rollback at a random step, besides the
    #: scripted one (round 1, env 0).
    rollback_p: float = 0.0
    #: Stop after the round in which this many events were emitted (0: no limit).
    max_events: int = 0


def run_demo(
    telemetry_dir: str | Path,
    run_id: str,
    settings: DemoSettings = DemoSettings(),
    *,
    force: bool = False,
) -> DemoResult:
    """Emit the synthetic run into ``<telemetry_dir>/<run_id>`` and return its counts."""
    for name in ("envs", "rounds", "steps"):
        if getattr(settings, name) < 1:
            raise UserError(f"--{name} must be >= 1")
    run_dir = resolve_run_dir(telemetry_dir, run_id)
    if run_dir.exists():
        if not force:
            raise UserError(f"{run_dir} already exists; pass --force to replace it")
        owner = run_lock_owner(run_dir)
        if owner is not None:  # --force replaces a dead run, never a live one
            raise RunLockedError(f"{run_dir} is being written by {owner}; not replacing it")
        shutil.rmtree(run_dir)
    started = time.perf_counter()
    hub = open_run(
        telemetry_dir,
        run_id,
        level=settings.level,
        config_hash=f"demo-{settings.seed}",
        flush_interval_s=settings.flush_interval_s,
    )
    with hub:
        emit_demo(hub, settings, started)
    counts: dict[str, int] = {}
    for manifest in read_manifests(run_dir).values() if run_dir.exists() else []:
        for tag, n in manifest.counts.items():
            counts[tag] = counts.get(tag, 0) + n
    return DemoResult(
        run_dir=run_dir, counts=dict(sorted(counts.items())), events_emitted=hub.events_emitted
    )


def emit_demo(hub: Hub, settings: DemoSettings, started: float | None = None) -> None:
    """Emit the synthetic run into an open hub (the caller closes it); ``started``: the
    ``perf_counter`` its wall time counts from (default: now)."""
    _DemoRun(hub, settings).run(time.perf_counter() if started is None else started)


class _DemoRun:
    def __init__(self, hub: Hub, settings: DemoSettings) -> None:
        self.hub = hub
        self.s = settings
        self.rng = random.Random(settings.seed)
        self.base_level = settings.level
        self.escalated_until = -1
        self.rollbacks = 0
        self.best_round = 0
        self.best_acc = -1.0

    def run(self, started: float) -> None:
        self._run_started()
        rounds = 0
        while rounds < self.s.rounds and not 0 < self.s.max_events <= self.hub.events_emitted:
            self._round(rounds)
            rounds += 1
        self._final_evaluation(rounds)
        wall = time.perf_counter() - started
        env_steps = rounds * self.s.steps * self.s.envs
        self.hub.emit(
            ev.RunFinished(
                status=RunStatus.FINISHED.value,
                rounds_completed=rounds,
                env_steps=env_steps,
                wall_s=wall,
                eps=env_steps / wall if wall > 0 else float("nan"),
                events_emitted=self.hub.events_emitted,
                rollbacks=self.rollbacks,
                error="",
            )
        )

    def _run_started(self) -> None:
        config = (
            f'{{"demo":true,"envs":{self.s.envs},"rounds":{self.s.rounds},'
            f'"steps":{self.s.steps},"seed":{self.s.seed}}}'
        )
        self.hub.emit(
            ev.RunStarted(
                config_json=config,
                config_hash=f"demo-{self.s.seed}",
                parent_run_id="",
                resumed_from_round=-1,
                esper_version=esper.__version__,
                torch_version="",
                python_version=sys.version.split()[0],
                platform=platform.platform(),
                device="cpu",
                env_devices=["cpu"] * self.s.envs,
                amp="off",
                compile_policy=False,
                policy_kind="synthetic",
                task="synthetic",
                n_envs=self.s.envs,
                episode_length=self.s.steps,
                rounds=self.s.rounds,
                seed=self.s.seed,
                telemetry_level=self.base_level.name.lower(),
                deterministic=True,
            )
        )

    def _round(self, rnd: int) -> None:
        if self.escalated_until >= 0 and rnd > self.escalated_until:
            self.hub.set_level(
                self.base_level, reason="escalation expired", round=rnd, until_round=-1
            )
            self.escalated_until = -1
        round_start = time.perf_counter()
        entropy_coef = 0.05 * (1.0 - rnd / max(1, self.s.rounds))
        self.hub.emit(
            ev.RoundStarted(
                round=rnd,
                n_envs=self.s.envs,
                episode_length=self.s.steps,
                entropy_coef=entropy_coef,
                lr=3e-4,
            )
        )
        demo_round = DemoRound(self.hub, self.rng, rnd, self.s.envs, CNN_BLUEPRINTS)
        envs = demo_round.envs
        panics = {(0, self.s.steps // 2)} if rnd == ROLLBACK_ROUND else set()
        if self.s.rollback_p > 0:
            for i in range(self.s.envs):
                if self.rng.random() < self.s.rollback_p:
                    panics.add((i, self.rng.randrange(self.s.steps)))
        for step in range(self.s.steps):
            demo_round.step(step, {env for env, at in panics if at == step})
        self.rollbacks += sum(e.rollbacks for e in envs)
        rewards, accs = [], []
        for env in envs:
            reward, acc = env.finish(self.s.steps)
            rewards.append(reward)
            accs.append(acc)
        self._ppo_update(rnd, entropy_coef)
        self._checkpoint(rnd, sum(accs) / len(accs))
        wall = time.perf_counter() - round_start
        steps = self.s.steps * self.s.envs
        self.hub.emit(
            ev.RoundFinished(
                round=rnd,
                wall_s=wall,
                eps=steps / wall if wall > 0 else float("nan"),
                mean_episode_reward=sum(rewards) / len(rewards),
                mean_final_accuracy=sum(accs) / len(accs),
                rollbacks=sum(e.rollbacks for e in envs),
                train_ms=wall * 600.0,
                val_ms=wall * 250.0,
                policy_ms=wall * 80.0,
                action_ms=wall * 40.0,
                ppo_ms=wall * 30.0,
            )
        )

    def _ppo_update(self, rnd: int, entropy_coef: float) -> None:
        r = self.rng
        entropies: dict[str, Any] = {f"entropy_{h}": r.uniform(0.2, 1.8) for h in HEAD_NAMES}
        clips: dict[str, Any] = {f"clip_frac_{h}": r.uniform(0.0, 0.3) for h in HEAD_NAMES}
        ratio_max = r.uniform(1.1, 1.6) if rnd != ANOMALY_ROUND else r.uniform(6.0, 9.0)
        self.hub.emit(
            ev.PpoUpdate(
                round=rnd,
                policy_loss=r.gauss(-0.02, 0.01),
                value_loss=r.uniform(0.1, 1.0),
                entropy=sum(entropies.values()),
                **entropies,
                clip_frac=sum(clips.values()) / len(clips),
                **clips,
                approx_kl=r.uniform(0.001, 0.02),
                explained_variance=r.uniform(-0.2, 0.6),
                grad_norm=r.uniform(0.5, 4.0),
                lr=3e-4,
                entropy_coef=entropy_coef,
                epochs_run=4,
                minibatches=4,
                early_stopped=False,
                skipped=False,
                skip_reason="",
                n_transitions=self.s.envs * self.s.steps,
                ratio_max=ratio_max,
                value_mean=r.gauss(0.0, 1.0),
                return_mean=r.gauss(0.0, 1.0),
            )
        )
        if rnd == ANOMALY_ROUND:
            self._anomaly(rnd, ratio_max)
        if self.hub.enabled(TelemetryLevel.DEBUG):
            for layer in DEMO_LAYERS:
                self.hub.emit(
                    ev.LayerGradStats(
                        round=rnd,
                        layer=layer,
                        grad_norm=r.uniform(0.01, 2.0),
                        param_norm=r.uniform(1.0, 20.0),
                        grad_max_abs=r.uniform(0.01, 1.0),
                        zero_frac=r.uniform(0.0, 0.2),
                    )
                )

    def _anomaly(self, rnd: int, ratio_max: float) -> None:
        threshold = 5.0
        escalate = self.hub.level < TelemetryLevel.DEBUG
        self.hub.emit(
            ev.AnomalyDetected(
                round=rnd,
                kind=AnomalyKind.RATIO_EXPLOSION.value,
                detail=f"max importance ratio {ratio_max:.2f} > {threshold}",
                value=ratio_max,
                threshold=threshold,
                escalated=escalate,
            )
        )
        if escalate:
            self.escalated_until = rnd + ESCALATION_ROUNDS
            self.hub.set_level(
                TelemetryLevel.DEBUG,
                reason=AnomalyKind.RATIO_EXPLOSION.value,
                round=rnd,
                until_round=self.escalated_until,
            )

    def _checkpoint(self, rnd: int, mean_acc: float) -> None:
        if mean_acc > self.best_acc:
            self.best_acc, self.best_round = mean_acc, rnd
        self.hub.emit(
            ev.CheckpointSaved(
                round=rnd,
                path=f"checkpoints/round-{rnd:04d}.pt",
                bytes=self.rng.randint(900_000, 1_100_000),
                next_round=rnd + 1,
                seq_position=self.hub.next_seq + 1,
            )
        )

    def _final_evaluation(self, rounds: int) -> None:
        """Reload the best checkpoint for the final evaluation (as a trainer would)."""
        self.hub.emit(
            ev.CheckpointLoaded(
                round=rounds - 1,
                path=f"checkpoints/round-{self.best_round:04d}.pt",
                next_round=self.best_round + 1,
                parent_run_id="",
                seq_position=self.hub.next_seq + 1,
            )
        )
