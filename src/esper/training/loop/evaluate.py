"""``esper evaluate``: a trained policy, frozen, on hosts of the caller's choosing.

The checkpoint's policy acts deterministically (its most likely valid action), or with
``sample`` draws its actions as in training (seeded by the run seed), and nothing is
updated: no PPO step, no normaliser statistics. The run goes through the
training loop and telemetry unchanged, so it is a run like any other (``esper runs``,
``esper analyze``, the report), paired env by env with any other run of the same seed
and config by ``esper analyze compare``. ``run_started.eval_checkpoint`` names the
checkpoint and ``parent_run_id`` the run that wrote it. Typical use: train on part of a
host family, evaluate on held-out members (``configs/learning_family_holdout.toml``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

from esper.config import Config, config_from_dict, with_overrides
from esper.core.enums import PolicyKind, RunStatus
from esper.data.tasks import TaskData, load_task
from esper.errors import CheckpointError, ConfigError, UserError
from esper.policy.actions import ActionSpace
from esper.telemetry.hub import Hub
from esper.telemetry.paths import validate_run_id
from esper.training.learning.learner import Learner
from esper.training.learning.policy_factory import build_policy
from esper.training.loop.checkpoint import read_checkpoint
from esper.training.loop.recorder import Recorder
from esper.training.loop.run_setup import (
    action_space_for,
    check_envs_fit,
    configure_torch,
    resolve_device,
)
from esper.training.loop.trainer import ProgressFn, VectorizedTrainer
from esper.training.run import TrainResult, check_telemetry_dir, open_hub, run_rounds

#: The policy network's shape and inputs: taken from the checkpoint, whatever the config says.
NETWORK_KEYS = ("feature_dim", "lstm_hidden", "blueprint_embed_dim")


def evaluate(
    config: Config,
    checkpoint: str | Path,
    *,
    telemetry: Hub | None = None,
    data: TaskData | None = None,
    progress: ProgressFn | None = None,
    first_round: int = 0,
    sample: bool = False,
) -> TrainResult:
    """Run ``config.run.rounds`` rounds with the checkpoint's policy frozen (from round
    ``first_round``: the hosts of those rounds, e.g. those a rules table measured);
    ``sample``: sampled rather than greedy actions."""
    if not 0 <= first_round < config.run.rounds:
        raise UserError(
            f"first_round {first_round}: must be below run.rounds ({config.run.rounds})"
        )
    path = Path(checkpoint)
    state = read_checkpoint(path)
    trained = _trained_config(state, path)
    cfg = resolve_device(_evaluation_config(config, trained, path))
    configure_torch(cfg)
    run_id = validate_run_id(cfg.run.run_id or _default_eval_id(cfg, trained, sample))
    cfg = with_overrides(cfg, {"run.run_id": run_id})
    if telemetry is None:
        check_telemetry_dir(cfg, run_id, rank=0, checkpoint=path)
    data = data if data is not None else load_task(cfg.task, seed=cfg.run.seed)
    check_envs_fit(cfg, data)
    space = action_space_for(cfg, data)
    _check_same_actions(space, action_space_for(trained, data), path)
    learner = Learner(cfg, space, build_policy(cfg, space), frozen=True, sample=sample)
    learner_state = state.get("learner")
    try:
        if not isinstance(learner_state, dict):
            raise KeyError("learner")
        learner.load_state_dict(learner_state)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(
            f"{path}: the checkpoint's policy does not fit this configuration "
            f"({type(exc).__name__}: {exc})"
        ) from None
    parent = str(state.get("run_id", ""))
    hub = telemetry if telemetry is not None else open_hub(cfg, run_id, parent, None, False)
    try:
        recorder = Recorder(hub, reward_family=cfg.reward.family.value)
        trainer = VectorizedTrainer(
            cfg, recorder=recorder, task=data, learner=learner, progress=progress
        )
        recorder.run_started(
            cfg, learner, parent, first_round, eval_checkpoint=str(path), eval_sampled=sample
        )
    except BaseException as exc:
        hub.close(RunStatus.FAILED, f"{type(exc).__name__}: {exc}")
        raise
    return run_rounds(cfg, trainer, None, first_round, getattr(hub, "run_dir", None))


def _trained_config(state: dict[str, Any], path: Path) -> Config:
    """The configuration the checkpoint's policy was trained with (a PPO policy)."""
    raw = state.get("config")
    if not isinstance(raw, str):
        raise CheckpointError(f"{path}: the checkpoint stores no configuration")
    try:
        cfg = config_from_dict(msgspec.json.decode(raw), source=f"{path} (stored configuration)")
    except (msgspec.DecodeError, ConfigError) as exc:
        raise CheckpointError(
            f"{path}: the stored configuration does not load here ({exc})"
        ) from None
    if cfg.policy.kind != PolicyKind.PPO:
        raise CheckpointError(
            f"{path}: the checkpoint holds a {cfg.policy.kind.value} run, which has no "
            "learned policy to evaluate (baselines run with esper train --policy KIND)"
        )
    return cfg


def _evaluation_config(config: Config, trained: Config, path: Path) -> Config:
    """The caller's config with the trained network's shape; a PPO policy, no
    checkpoints. The observation must match: both with a host family or both without."""
    ours = with_overrides(config, {"policy.observe_host": trained.policy.observe_host})
    if ours.observes_host != trained.observes_host:
        has = "has" if trained.observes_host else "has no"
        raise ConfigError(
            f"$.family.members: {path} was trained with a policy that {has} host descriptors "
            "in its observation (a host family); evaluate it on a config that "
            f"{has} [[family.members]] too"
        )
    overrides: dict[str, Any] = {
        f"policy.{key}": getattr(trained.policy, key) for key in (*NETWORK_KEYS, "observe_host")
    }
    overrides["policy.kind"] = PolicyKind.PPO.value
    overrides["run.checkpoint_every"] = 0
    return with_overrides(config, overrides)


def _check_same_actions(space: ActionSpace, trained: ActionSpace, path: Path) -> None:
    """A policy's slot head names the slots it was trained on (the menus are masks, and
    may differ)."""
    if space.slot_ids != trained.slot_ids:
        raise ConfigError(
            f"{path}: the policy was trained on slots {list(trained.slot_ids)}, this config's "
            f"hosts offer {list(space.slot_ids)}; evaluate it on hosts with the same slots "
            "(host.slots)"
        )


def _default_eval_id(cfg: Config, trained: Config, sample: bool) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    source = trained.run.run_id or cfg.task.name.value
    what = "eval-sample" if sample else "eval"
    return f"{source}-{what}-s{cfg.run.seed}-{stamp}"[:128]
