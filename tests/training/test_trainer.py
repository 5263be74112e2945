"""End-to-end behaviour of the vectorized trainer on small digits runs."""

from __future__ import annotations

import gc
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from esper.config import Config, with_overrides
from esper.core.enums import RunStatus, TelemetryLevel
from esper.data.tasks import load_task
from esper.telemetry.events import EVENT_LEVELS, REWARD_COMPONENTS, event_tag
from esper.telemetry.memory_hub import MemoryHub
from esper.training.loop.faults import Fault, FaultKind, FaultPlan, InjectedDataError
from esper.training.run import train

#: Fields that legitimately differ between two identical runs (clocks and timings).
NONDETERMINISTIC = {
    "ts_ns",
    "wall_s",
    "eps",
    "train_ms",
    "val_ms",
    "features_ms",
    "policy_ms",
    "action_ms",
    "ppo_ms",
    "platform",
    "bytes",
    "path",
    "blocked_ns",
    "flushes",
    "max_queue_depth",
    "bytes_written",
    "blocked_emits",
}


def small_config(tmp: Path, **overrides: Any) -> Config:
    base = {
        "run.n_envs": 3,
        "run.rounds": 1,
        "run.episode_length": 5,
        "run.seed": 0,
        "run.run_id": "t",
        "task.train_samples_per_env": 192,
        "task.val_samples": 192,
        "policy.feature_dim": 32,
        "policy.lstm_hidden": 32,
        "telemetry.dir": str(tmp),
        "telemetry.flush_interval_s": 0.05,
    }
    base.update(overrides)
    return with_overrides(Config(), base)


@pytest.fixture(scope="module")
def digits():
    return load_task(Config().task, seed=0)


def _nan_safe(v: Any) -> Any:
    """NaN compares unequal to itself; map it to a marker so equal runs compare equal."""
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, list):
        return [_nan_safe(x) for x in v]
    return v


def _events(
    hub: MemoryHub, *, drop: frozenset[str] = frozenset({"run_id", "seq"})
) -> list[dict[str, Any]]:
    import msgspec

    out = []
    for e in hub.events:
        d = msgspec.to_builtins(e)
        d["type"] = event_tag(type(e))
        out.append(
            {k: _nan_safe(v) for k, v in d.items() if k not in NONDETERMINISTIC and k not in drop}
        )
    return out


def test_run_writes_lifecycle_and_normal_events(tmp_path: Path, digits) -> None:
    cfg = small_config(tmp_path, **{"run.rounds": 2})
    result = train(cfg, data=digits)
    assert result.status == RunStatus.FINISHED
    assert result.env_steps == 2 * 3 * 5
    run_dir = tmp_path / "t"
    types = {p.name.removeprefix("type=") for p in (run_dir / "events").iterdir()}
    always = {
        "run_started",
        "run_finished",
        "round_started",
        "round_finished",
        "env_step",
        "action_taken",
        "reward_computed",
        "counterfactual_computed",
        "episode_finished",
        "ppo_update",
        "checkpoint_saved",
        "writer_stats",
    }
    assert always <= types
    rewards = pl.read_parquet(run_dir / "events" / "type=reward_computed" / "**" / "*.parquet")
    assert rewards.height == 30
    summed = rewards.select(pl.sum_horizontal(list(REWARD_COMPONENTS))).to_series()
    assert (summed - rewards["total"]).abs().max() < 1e-9
    episodes = pl.read_parquet(run_dir / "events" / "type=episode_finished" / "**" / "*.parquet")
    by_env = rewards.group_by("round", "env").agg(pl.col("total").sum().alias("sum"))
    joined = episodes.join(by_env, on=["round", "env"])
    assert ((joined["episode_reward"] - joined["sum"]).abs() < 1e-6).all()
    assert (run_dir / "checkpoint.pt").exists()


def test_same_config_and_seed_give_identical_events(tmp_path: Path, digits) -> None:
    runs = []
    for _ in range(2):
        hub = MemoryHub(run_id="same", level=TelemetryLevel.NORMAL)
        train(small_config(tmp_path), data=digits, telemetry=hub, save=tmp_path / "c.pt")
        runs.append(_events(hub))
    assert len(runs[0]) == len(runs[1]) > 50
    for a, b in zip(runs[0], runs[1], strict=True):
        assert a.keys() == b.keys()
        for key in a:
            va, vb = a[key], b[key]
            same = va == vb or (
                isinstance(va, float)
                and isinstance(vb, float)
                and math.isnan(va)
                and math.isnan(vb)
            )
            assert same, f"{a['type']}.{key}: {va!r} != {vb!r}"


def test_nan_in_one_env_rolls_back_only_that_env(tmp_path: Path, digits) -> None:
    clean_hub = MemoryHub(run_id="c", level=TelemetryLevel.NORMAL)
    train(small_config(tmp_path), data=digits, telemetry=clean_hub, save=tmp_path / "a.pt")
    hub = MemoryHub(run_id="f", level=TelemetryLevel.NORMAL)
    faults = FaultPlan([Fault(kind=FaultKind.NAN, round=0, step=3, env=1)])
    captured: dict[str, Any] = {}
    result = train(
        small_config(tmp_path),
        data=digits,
        telemetry=hub,
        faults=faults,
        save=tmp_path / "b.pt",
        progress=lambda item: captured.setdefault("seen", item),
    )
    assert result.rollbacks == 1
    rollbacks = [e for e in hub.events if event_tag(type(e)) == "governor_rollback"]
    assert len(rollbacks) == 1
    rb = rollbacks[0]
    assert (rb.env, rb.round, rb.step, rb.reason) == (1, 0, 3, "non_finite_loss")
    assert rb.penalty == -10.0 and rb.penalized_step == 2
    assert rb.transitions_affected == 3 - rb.restored_to_step
    episode = next(e for e in hub.events if event_tag(type(e)) == "episode_finished" and e.env == 1)
    assert episode.rollbacks == 1 and episode.rollback_penalty == -10.0

    def per_env(events: list[dict[str, Any]], env: int) -> list[dict[str, Any]]:
        kinds = {"action_taken", "reward_computed", "env_step", "counterfactual_computed"}
        return [e for e in events if e["type"] in kinds and e["env"] == env]

    # ``normalized`` divides by the reward normaliser's running std, a statistic shared
    # by all envs by design; everything env-specific must be identical.
    drop = frozenset({"run_id", "seq", "normalized"})
    clean, faulty = _events(clean_hub, drop=drop), _events(hub, drop=drop)
    for env in (0, 2):  # the other envs' transitions are untouched
        assert per_env(clean, env) == per_env(faulty, env)
    assert per_env(clean, 1) != per_env(faulty, 1)


def test_penalty_reaches_the_buffer_of_the_panicking_env_only(tmp_path: Path, digits) -> None:
    from esper.training import run as run_mod

    learners: list[Any] = []
    original = run_mod.Learner

    class Spy(original):  # type: ignore[misc,valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            learners.append(self)

    faults = FaultPlan([Fault(kind=FaultKind.NAN, round=0, step=0, env=2)])
    hub = MemoryHub(run_id="p", level=TelemetryLevel.LIFECYCLE)
    run_mod.Learner = Spy
    try:
        train(
            small_config(tmp_path),
            data=digits,
            telemetry=hub,
            faults=faults,
            save=tmp_path / "p.pt",
        )
    finally:
        run_mod.Learner = original
    buf = learners[0].buffer
    assert buf.penalties_raw[2, 0].item() == -10.0  # panic on step 0 -> transition 0
    assert buf.penalties_raw[[0, 1]].abs().sum().item() == 0.0


def test_policy_nan_skips_the_update_and_training_continues(tmp_path: Path, digits) -> None:
    hub = MemoryHub(run_id="n", level=TelemetryLevel.LIFECYCLE)
    faults = FaultPlan([Fault(kind=FaultKind.POLICY_NAN, round=0)])
    result = train(
        small_config(tmp_path, **{"run.rounds": 2}),
        data=digits,
        telemetry=hub,
        faults=faults,
        save=tmp_path / "n.pt",
    )
    assert result.status == RunStatus.FINISHED and result.rounds_completed == 2
    updates = [e for e in hub.events if event_tag(type(e)) == "ppo_update"]
    assert [u.skipped for u in updates] == [True, False]
    assert updates[0].skip_reason
    anomalies = [e for e in hub.events if event_tag(type(e)) == "anomaly_detected"]
    assert anomalies and anomalies[0].kind == "non_finite_loss"


def test_the_rounds_run_with_the_setup_frozen_and_give_it_back(tmp_path: Path, digits) -> None:
    """The garbage collector skips what was alive before the rounds while they run
    (gc.freeze), and gets it back after them, whether the run ends well or fails."""
    frozen: list[int] = []

    def progress(_item: object) -> None:
        frozen.append(gc.get_freeze_count())

    train(small_config(tmp_path), data=digits, progress=progress)
    assert frozen and min(frozen) > 0
    assert gc.get_freeze_count() == 0
    faults = FaultPlan([Fault(kind=FaultKind.DATA_ERROR, round=0, step=1)])
    with pytest.raises(InjectedDataError):
        train(small_config(tmp_path / "failed"), data=digits, faults=faults)
    assert gc.get_freeze_count() == 0


def test_data_error_flushes_and_checkpoints(tmp_path: Path, digits) -> None:
    cfg = small_config(tmp_path, **{"run.rounds": 2})
    faults = FaultPlan([Fault(kind=FaultKind.DATA_ERROR, round=1, step=2)])
    with pytest.raises(InjectedDataError):
        train(cfg, data=digits, faults=faults)
    run_dir = tmp_path / "t"
    finished = pl.read_parquet(run_dir / "events" / "type=run_finished" / "**" / "*.parquet")
    assert finished["status"].to_list() == ["failed"]
    assert "InjectedDataError" in finished["error"][0]
    assert (run_dir / "checkpoint.pt").exists()
    import json

    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"
    # Steps 0-1 of round 1 completed: their reward events are written, the last one too
    # (it waits a step for a possible rollback penalty, and the round died before that).
    rewards = pl.read_parquet(run_dir / "events" / "type=reward_computed" / "**" / "*.parquet")
    late = rewards.filter(pl.col("round") == 1)
    n_envs = cfg.run.n_envs
    assert late.height == 2 * n_envs
    assert sorted(set(late["step"].to_list())) == [0, 1]


@pytest.mark.parametrize("batched", [False, True], ids=["per-env", "batched"])
def test_resume_matches_an_uninterrupted_run(tmp_path: Path, digits, batched: bool) -> None:
    """Batched, the uninterrupted run's round 1 renews round 0's models; the resumed
    one builds them: the same events either way."""
    full = MemoryHub(run_id="full", level=TelemetryLevel.NORMAL)
    train(
        small_config(tmp_path, **{"run.rounds": 2, "run.batch_envs": batched}),
        data=digits,
        telemetry=full,
        save=tmp_path / "full.pt",
    )
    first = MemoryHub(run_id="part", level=TelemetryLevel.NORMAL)
    train(
        small_config(tmp_path, **{"run.rounds": 1, "run.batch_envs": batched}),
        data=digits,
        telemetry=first,
        save=tmp_path / "part.pt",
    )
    second = MemoryHub(run_id="part-resume1", level=TelemetryLevel.NORMAL)
    result = train(
        small_config(tmp_path, **{"run.rounds": 2, "run.batch_envs": batched}),
        data=digits,
        telemetry=second,
        resume=tmp_path / "part.pt",
        save=tmp_path / "part2.pt",
    )
    assert result.rounds_completed == 1

    def round1(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        skip = {"checkpoint_saved", "checkpoint_loaded"}
        return [
            {k: v for k, v in e.items() if k not in skip}
            for e in events
            if e.get("round") == 1 and e["type"] not in skip
        ]

    assert round1(_events(full)) == round1(_events(second))
    loaded = [e for e in second.events if event_tag(type(e)) == "checkpoint_loaded"]
    assert loaded and loaded[0].next_round == 1


def test_heuristic_policy_runs_through_the_same_loop(tmp_path: Path, digits) -> None:
    cfg = small_config(tmp_path, **{"policy.kind": "heuristic", "run.episode_length": 8})
    hub = MemoryHub(run_id="h", level=TelemetryLevel.NORMAL)
    result = train(cfg, data=digits, telemetry=hub, save=tmp_path / "h.pt")
    assert result.status == RunStatus.FINISHED
    kinds = {event_tag(type(e)) for e in hub.events}
    assert "ppo_update" not in kinds and "action_taken" in kinds


def test_every_event_type_has_a_level() -> None:
    assert all(level >= TelemetryLevel.LIFECYCLE for level in EVENT_LEVELS.values())


def test_anomaly_escalates_to_debug_for_a_bounded_number_of_rounds(tmp_path: Path, digits) -> None:
    cfg = small_config(
        tmp_path, **{"run.rounds": 3, "run.episode_length": 3, "telemetry.escalation_rounds": 1}
    )
    hub = MemoryHub(run_id="esc", level=TelemetryLevel.NORMAL)
    faults = FaultPlan([Fault(kind=FaultKind.POLICY_NAN, round=0)])
    train(cfg, data=digits, telemetry=hub, faults=faults, save=tmp_path / "e.pt")
    changes = [e for e in hub.events if event_tag(type(e)) == "telemetry_level_changed"]
    assert [(c.round, c.old_level, c.new_level) for c in changes] == [
        (0, "normal", "debug"),
        (2, "debug", "normal"),
    ]
    layer_rounds = {e.round for e in hub.events if event_tag(type(e)) == "layer_grad_stats"}
    assert layer_rounds == {1}  # debug detail only while escalated
    stats = [e for e in hub.events if event_tag(type(e)) == "layer_grad_stats"]
    assert len({(e.env, e.step) for e in stats}) == 3 * 3
    assert all(math.isfinite(e.grad_norm) and e.param_norm > 0 for e in stats)


def test_ctrl_c_before_the_first_round_marks_the_run_interrupted(tmp_path: Path, digits) -> None:
    class InterruptOnStart(MemoryHub):
        def emit(self, event: Any) -> None:
            if event_tag(type(event)) == "run_started":
                raise KeyboardInterrupt
            super().emit(event)

    hub = InterruptOnStart(run_id="early", level=TelemetryLevel.NORMAL)
    with pytest.raises(KeyboardInterrupt):
        train(small_config(tmp_path), data=digits, telemetry=hub, save=tmp_path / "x.pt")
    assert hub.status == RunStatus.INTERRUPTED


def test_bad_flag_value_names_the_flag() -> None:
    import argparse

    from esper.commands.train import build_config, configure_parser
    from esper.core.enums import PolicyKind
    from esper.errors import ConfigError

    parser = argparse.ArgumentParser()
    configure_parser(parser)
    with pytest.raises(ConfigError, match=r"^--envs: .*\$\.run\.n_envs"):
        build_config(parser.parse_args(["--envs", "0"]), PolicyKind.PPO)


def test_op_prior_config_is_strict_and_reaches_the_policy() -> None:
    from typing import get_args

    from esper.config import OpName
    from esper.core.enums import LifecycleOp, Topology
    from esper.errors import ConfigError
    from esper.policy.actions import ActionSpace
    from esper.training.learning.policy_factory import build_policy, op_prior_logits

    assert get_args(OpName) == tuple(op.name.lower() for op in LifecycleOp)  # same order too
    assert op_prior_logits(Config()) == [0.0, 3.0, 0.0, -5.0, 0.0, 0.0]  # germinate 3, prune -5
    cfg = with_overrides(Config(), {"policy.op_prior": {"advance": 1.5}})
    assert op_prior_logits(cfg) == [0.0, 0.0, 0.0, 0.0, 0.0, 1.5]
    net = build_policy(cfg, ActionSpace(slot_ids=("r0c0", "r1c0"), topology=Topology.CNN))
    assert net.op_head.bias.tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 1.5]  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"'prun'.*\$\.policy\.op_prior"):
        with_overrides(Config(), {"policy.op_prior": {"prun": -1.0}})
    with pytest.raises(ConfigError, match=r"\$\.policy\.op_prior\.prune: must be within"):
        with_overrides(Config(), {"policy.op_prior": {"prune": -50.0}})
