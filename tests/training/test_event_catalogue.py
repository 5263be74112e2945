"""The trainer writes every lifecycle and normal event type of the catalogue.

A plain short run cannot show them all: a fossilization needs a seed to go through
G2's 10 training epochs, a blend and a hold, and rollbacks, anomalies and loaded
checkpoints only happen on faults and resumes. So three small runs through the real
writer, each exercising its part on purpose, must together leave a directory for every
event type at ``lifecycle`` and ``normal`` level, with the lifecycle ones carrying the
values that say what happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from esper.config import Config, with_overrides
from esper.core.enums import LifecycleOp, RunStatus, SeedStage, TelemetryLevel
from esper.core.records import SlotReport
from esper.data.tasks import load_task
from esper.policy.actions import DecodedAction
from esper.policy.heuristic import HeuristicPolicy, validity
from esper.policy.signals import SignalTracker
from esper.telemetry.events import EVENT_LEVELS, event_tag
from esper.training.loop.faults import Fault, FaultKind, FaultPlan
from esper.training.loop.run_setup import action_space_for
from esper.training.run import train

#: Long enough for germinate (1) + G1 (1) + G2's 10 epochs + a 5-epoch blend + hold + fossilize.
LIFECYCLE_EPISODE = 20


class WalkTheLifecycle(HeuristicPolicy):
    """The heuristic's progress rule, but germinating at once and fossilizing every held seed.

    On digits no seed clears the heuristic's contribution threshold, so the plain
    heuristic would never fossilize; this script does whatever the gates allow.
    """

    def decide(
        self,
        reports: Sequence[SlotReport],
        tracker: SignalTracker,
        masks: dict[str, np.ndarray],
        memory: Any,
    ) -> DecodedAction:
        valid = validity(masks)
        for s, r in enumerate(reports):
            if r.stage == SeedStage.HOLDING and valid(LifecycleOp.FOSSILIZE, s):
                return DecodedAction(op=LifecycleOp.FOSSILIZE, slot_id=r.slot_id)
            action = self._progress(r, s, valid)
            if action is not None:
                return action
        for s, r in enumerate(reports):
            if valid(LifecycleOp.GERMINATE, s):
                return self._germinate(r, masks["blueprint"], memory)
        return DecodedAction(op=LifecycleOp.WAIT)


def _config(tmp: Path, run_id: str, **overrides: Any) -> Config:
    base = {
        "run.n_envs": 2,
        "run.rounds": 1,
        "run.episode_length": 4,
        "run.seed": 0,
        "run.run_id": run_id,
        "task.train_samples_per_env": 128,
        "task.val_samples": 128,
        "policy.feature_dim": 16,
        "policy.lstm_hidden": 16,
        "telemetry.dir": str(tmp),
        "telemetry.flush_interval_s": 0.05,
    }
    base.update(overrides)
    return with_overrides(Config(), base)


def _types(run_dir: Path) -> set[str]:
    return {p.name.removeprefix("type=") for p in (run_dir / "events").iterdir() if p.is_dir()}


def _read(run_dir: Path, event_type: str) -> pl.DataFrame:
    return pl.read_parquet(run_dir / "events" / f"type={event_type}" / "**" / "*.parquet")


@pytest.fixture(scope="module")
def digits():
    return load_task(Config().task, seed=0)


@pytest.mark.slow
def test_three_runs_write_every_lifecycle_and_normal_event_type(tmp_path: Path, digits) -> None:
    # 1. A scripted walk through the lifecycle, with a NaN in env 1 (rollback + prune).
    walk = _config(
        tmp_path,
        "walk",
        **{"policy.kind": "heuristic", "run.episode_length": LIFECYCLE_EPISODE},
    )
    policy = WalkTheLifecycle(action_space_for(walk, digits), walk.policy)
    nan = FaultPlan([Fault(kind=FaultKind.NAN, round=0, step=6, env=1)])
    assert train(walk, data=digits, policy=policy, faults=nan).status == RunStatus.FINISHED
    # 2. PPO with a non-finite update: anomaly, escalation to debug, checkpoint saved.
    ppo = _config(tmp_path, "ppo", **{"telemetry.escalation_rounds": 1})
    bad_update = FaultPlan([Fault(kind=FaultKind.POLICY_NAN, round=0)])
    train(ppo, data=digits, faults=bad_update, save=tmp_path / "ppo.pt")
    # 3. A resume from that checkpoint (a new run linked to its parent).
    more = _config(tmp_path, "resumed", **{"run.rounds": 2})
    train(more, data=digits, resume=tmp_path / "ppo.pt")

    runs = [tmp_path / name for name in ("walk", "ppo", "resumed")]
    written = set().union(*(_types(r) for r in runs))
    wanted = {event_tag(c) for c, lvl in EVENT_LEVELS.items() if lvl <= TelemetryLevel.NORMAL}
    assert wanted - written == set()

    fossils = _read(runs[0], "seed_fossilized")
    assert fossils.height >= 1 and (fossils["env"] == 0).all()
    first = fossils.sort("step").row(0, named=True)
    stages = _read(runs[0], "seed_stage_changed").filter(
        (pl.col("env") == 0) & (pl.col("seed_id") == first["seed_id"])
    )
    path = [SeedStage(s) for s in stages.sort("seq")["to_stage"]]
    assert path == [
        SeedStage.GERMINATED,
        SeedStage.TRAINING,
        SeedStage.BLENDING,
        SeedStage.HOLDING,
        SeedStage.FOSSILIZED,
    ]
    rollback = _read(runs[0], "governor_rollback")
    assert rollback.select("env", "step").rows() == [(1, 6)]
    pruned = _read(runs[0], "seed_pruned")
    assert (pruned["env"] == 1).any()
    assert _read(runs[1], "anomaly_detected").height >= 1
    loaded = _read(runs[2], "checkpoint_loaded")
    assert loaded.select("parent_run_id", "next_round").rows() == [("ppo", 1)]
