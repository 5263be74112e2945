"""``esper evaluate``: a trained policy, frozen (deterministic or sampled actions, no updates), on
the hosts a config names, through the same loop and telemetry; and ``train(first_round=)``,
which lets a benchmark play a rule-based policy's later rounds alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
from _family_support import family_config
from esper_analysis import load_run

from esper.cli import main as esper_main
from esper.config import Config
from esper.core.enums import Initiator
from esper.data.tasks import load_task
from esper.errors import CheckpointError, ConfigError, UserError
from esper.telemetry import events as ev
from esper.telemetry.memory_hub import MemoryHub
from esper.training.envs.host_envs import HostEnvs
from esper.training.learning.learner import Learner
from esper.training.learning.policy_factory import build_policy
from esper.training.loop.checkpoint import read_checkpoint
from esper.training.loop.evaluate import evaluate
from esper.training.loop.run_setup import action_space_for
from esper.training.run import train

HELD_OUT = [{"name": "held", "block_channels": [4, 8, 16]}]


def _config(tmp: Path, **overrides: Any) -> Config:
    base = {"run.n_envs": 2, "run.episode_length": 4, "telemetry.dir": str(tmp)}
    return family_config(**{**base, **overrides})


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("trained")
    train(_config(tmp, **{"run.run_id": "ppo"}))
    return tmp / "ppo" / "checkpoint.pt"


def _events(cfg: Config, checkpoint: Path, *, sample: bool = False) -> list[ev.Event]:
    hub = MemoryHub(run_id="eval")
    evaluate(cfg, checkpoint, telemetry=hub, sample=sample)
    return list(hub.events)


def _actions(events: list[ev.Event]) -> list[tuple[int, int, int, str, str]]:
    return [(e.round, e.env, e.step, e.op, e.slot) for e in events if isinstance(e, ev.ActionTaken)]


def test_evaluation_is_deterministic_updates_nothing_and_says_what_it_evaluated(
    trained: Path, tmp_path: Path
) -> None:
    before = read_checkpoint(trained)["learner"]
    cfg = _config(tmp_path, **{"family.members": HELD_OUT, "run.rounds": 2})
    first = _events(cfg, trained)
    assert _actions(first) == _actions(_events(cfg, trained))  # deterministic actions
    assert not any(isinstance(e, ev.PpoUpdate) for e in first)  # no updates
    started = next(e for e in first if isinstance(e, ev.RunStarted))
    assert started.eval_checkpoint == str(trained) and started.parent_run_id == "ppo"
    assert started.policy_kind == "ppo" and not started.eval_sampled
    hosts = {e.host for e in first if isinstance(e, ev.EpisodeFinished)}
    assert hosts == {"held"}
    after = read_checkpoint(trained)["learner"]  # the checkpoint is only read
    for key, value in before["policy"].items():
        assert torch.equal(value, after["policy"][key])


def test_a_sampled_evaluation_is_seeded_and_updates_nothing(trained: Path, tmp_path: Path) -> None:
    cfg = _config(tmp_path, **{"family.members": HELD_OUT, "run.rounds": 2})
    sampled = _events(cfg, trained, sample=True)
    assert _actions(sampled) == _actions(_events(cfg, trained, sample=True))  # seeded
    assert not any(isinstance(e, ev.PpoUpdate) for e in sampled)
    started = next(e for e in sampled if isinstance(e, ev.RunStarted))
    assert started.eval_sampled and started.eval_checkpoint == str(trained)


def test_a_frozen_learner_takes_the_most_likely_op(tmp_path: Path) -> None:
    """Frozen: every env's op is the argmax of its masked op distribution; frozen with
    ``sample`` (as in training) it draws others: a near-uniform untrained policy over 8
    envs and 3 steps, with the same draws for the same seed."""
    cfg = _config(tmp_path, **{"run.n_envs": 8, "policy.op_prior": {}})
    data = load_task(cfg.task, seed=0)
    space = action_space_for(cfg, data)
    envs = HostEnvs(cfg, data, space=space, policy_device=torch.device("cpu"),
                    amp=cfg.run.amp, initiator=Initiator.POLICY)  # fmt: skip
    envs.reset(0)
    greedy, ops = {}, {}
    for frozen, sample in ((True, False), (False, False), (True, True)):
        torch.manual_seed(0)  # the same policy weights each time
        learner = Learner(cfg, space, build_policy(cfg, space), frozen=frozen, sample=sample)
        hidden = learner.begin_round(cfg.run.n_envs)
        picks, taken = [], []
        for step in range(3):
            d = learner.decide(envs.observe(step), hidden)
            picks += (d.heads[:, 0] == d.op_probs.argmax(axis=1)).tolist()
            taken += d.heads[:, 0].tolist()
        greedy[frozen, sample], ops[frozen, sample] = picks, taken
    assert all(greedy[True, False])
    assert not all(greedy[False, False]) and not all(greedy[True, True])
    assert ops[True, True] == ops[False, False]  # sampling frozen draws as training does


def test_the_cli_evaluates_a_checkpoint_and_compare_pairs_it(trained: Path, tmp_path: Path) -> None:
    config = tmp_path / "held.toml"
    config.write_text(
        "[run]\nn_envs = 2\nepisode_length = 4\n[task]\ntrain_samples_per_env = 64\n"
        'val_samples = 64\n[host]\nslots = ["r0c0", "r0c1", "r0c2"]\n'
        '[[family.members]]\nname = "held"\nblock_channels = [4, 8, 16]\n'
    )
    common = ["--telemetry-dir", str(tmp_path), "--no-progress", "--rounds", "1"]
    for run_id, flags in (("ev", []), ("ev-sample", ["--sample"])):
        evaluation = ["evaluate", str(trained), "--config", str(config), "--run-id", run_id]
        assert esper_main([*evaluation, *flags, *common]) == 0
    sampled = load_run(tmp_path / "ev-sample").scan("run_started").collect().row(0, named=True)
    assert sampled["eval_sampled"] and sampled["eval_checkpoint"] == str(trained)
    assert (
        esper_main(
            ["train", "--policy", "static", "--config", str(config), "--run-id", "st", *common]
        )
        == 0
    )
    run = load_run(tmp_path / "ev")
    started = run.scan("run_started").collect().row(0, named=True)
    assert started["eval_checkpoint"] == str(trained) and not started["eval_sampled"]
    assert run.rows_on_disk("ppo_update") == 0 and not (tmp_path / "ev" / "checkpoint.pt").exists()
    assert esper_main(["analyze", "compare", str(tmp_path / "ev"), str(tmp_path / "st")]) == 0


def test_evaluation_refuses_what_it_cannot_evaluate(trained: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="host descriptors"):
        evaluate(_config(tmp_path, **{"family.members": []}), trained, telemetry=MemoryHub("x"))
    with pytest.raises(ConfigError, match="trained on slots"):
        evaluate(_config(tmp_path, **{"host.slots": ["r0c0", "r0c1"]}), trained,
                 telemetry=MemoryHub("x"))  # fmt: skip
    train(_config(tmp_path, **{"run.run_id": "static", "policy.kind": "static"}))
    with pytest.raises(CheckpointError, match="no learned policy"):
        evaluate(_config(tmp_path), tmp_path / "static" / "checkpoint.pt", telemetry=MemoryHub("x"))


def _static_episodes(cfg: Config, first_round: int = 0) -> list[tuple[int, int, float]]:
    hub = MemoryHub(run_id="rule")
    train(cfg, telemetry=hub, first_round=first_round)
    return [
        (e.round, e.env, e.final_val_acc) for e in hub.events if isinstance(e, ev.EpisodeFinished)
    ]


def test_a_rule_based_policys_later_rounds_alone_equal_those_of_a_full_run(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path, **{"policy.kind": "eager", "run.rounds": 3, "run.run_id": "e"})
    full = _static_episodes(cfg)
    assert _static_episodes(cfg, first_round=2) == [e for e in full if e[0] == 2]
    with pytest.raises(UserError, match="first_round 3"):
        _static_episodes(cfg, first_round=3)


def test_frozen_choices_show_in_the_hosts_analysis(trained: Path, tmp_path: Path) -> None:
    cfg = _config(tmp_path, **{"run.run_id": "ev2", "telemetry.level": "lifecycle"})
    evaluate(cfg, trained)
    from esper_analysis.hosts import host_choices

    result = host_choices(load_run(tmp_path / "ev2"))
    assert set(result.by_host["host"]) <= {"narrow", "wide"}
    assert result.by_host["episodes"].sum() == 2  # last third of two rounds: one round
    assert result.choices.filter(pl.col("phase").is_null()).height == 0
