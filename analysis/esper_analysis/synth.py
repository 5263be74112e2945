"""Synthetic runs of any size (benchmarks, tests), from the project's one simulator.

The telemetry demo (:mod:`esper.telemetry.demo`: seeds driven by the model's own
torch-free lifecycle code, rewards that sum to their totals, rollbacks that reach their
reward rows and episodes) is run for as many rounds as the requested number of events takes, through
the real hub and writer, so the run directory is exactly what a training run writes.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Final

from esper.core.enums import TelemetryLevel
from esper.telemetry.demo import DemoSettings, run_demo

SYNTH_N_ENVS: Final = 4
SYNTH_EPISODE_LENGTH: Final = 25
#: Chance of a governor rollback per episode.
ROLLBACK_P: Final = 0.02
#: Fewest events an env-step emits at level normal (env_step, action, reward,
#: counterfactual): bounds the rounds a requested size can take.
MIN_EVENTS_PER_STEP: Final = 4


@dataclasses.dataclass(frozen=True)
class SynthRun:
    path: Path
    n_events: int
    rounds: int
    n_envs: int
    episode_length: int


def synthesize_run(
    path: str | os.PathLike[str],
    n_events: int,
    *,
    seed: int,
    n_envs: int = SYNTH_N_ENVS,
    episode_length: int = SYNTH_EPISODE_LENGTH,
) -> SynthRun:
    """Write a finished synthetic run of about ``n_events`` events (whole rounds: it stops
    after the round that reaches the number).

    ``path`` is the run directory (its name becomes the run id) and must not exist.
    The same ``seed`` writes the same events (timestamps aside).
    """
    run_dir = Path(path)
    if run_dir.exists():
        raise FileExistsError(f"{run_dir} already exists")
    per_round = n_envs * episode_length * MIN_EVENTS_PER_STEP
    settings = DemoSettings(
        envs=n_envs,
        rounds=max(1, -(-n_events // per_round)),
        steps=episode_length,
        seed=seed,
        level=TelemetryLevel.NORMAL,
        flush_interval_s=1.0,
        rollback_p=ROLLBACK_P,
        max_events=n_events,
    )
    result = run_demo(run_dir.parent, run_dir.name, settings)
    rounds = result.counts.get("round_finished", 0)
    return SynthRun(result.run_dir, sum(result.counts.values()), rounds, n_envs, episode_length)
