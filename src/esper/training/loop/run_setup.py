"""What a run needs before its loop, shared by ``esper train`` and ``esper evaluate``:
process-wide torch settings, a device that exists, envs that fit the data, and the
policy's action space (from a probe model, which also validates the host settings).
"""

from __future__ import annotations

import os
import time

import torch

from esper.config import Config
from esper.core.constants import RECOMMENDED_BLUEPRINTS
from esper.core.enums import GerminationStyle
from esper.data.tasks import TaskData
from esper.errors import ConfigError, UserError
from esper.model import build_model
from esper.policy.actions import ActionSpace
from esper.training.envs.env_factory import check_family_slots, member_host


def intra_op_threads(requested: int) -> int:
    """``run.torch_threads``, with 0 meaning every core this process may use, shared
    among the local training processes (torchrun's ``LOCAL_WORLD_SIZE``)."""
    if requested:
        return requested
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, cores // max(1, local))


def configure_torch(cfg: Config) -> None:
    """Process-wide torch settings of a run: intra-op threads, and TF32 on CUDA (the
    hosts are small CNNs whose float32 convolutions and matmuls TF32 runs several times
    faster at an accuracy far below what the training noise already is)."""
    torch.set_num_threads(intra_op_threads(cfg.run.torch_threads))
    if torch.device(cfg.run.device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.run.tf32
        torch.backends.cudnn.allow_tf32 = cfg.run.tf32


def resolve_device(cfg: Config) -> Config:
    """Fail early and clearly on a device that is not there."""
    for name in [cfg.run.device, *cfg.run.env_devices]:
        dev = torch.device(name)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"device {name!r} requested but CUDA is not available here")
        if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return cfg


def default_run_id(cfg: Config) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{cfg.task.name.value}-{cfg.policy.kind.value}-s{cfg.run.seed}-{stamp}"


def check_envs_fit(cfg: Config, data: TaskData, world_size: int = 1) -> None:
    """Each env (of every rank) trains on its own share of the data: one sample each
    (unless ``task.env_split`` is off: then every env trains on the same samples)."""
    n_train = int(data.train_y.shape[0])
    if cfg.task.env_split and cfg.run.n_envs * world_size > n_train:
        ranks = f" x {world_size} ranks" if world_size > 1 else ""
        raise ConfigError(
            f"--envs {cfg.run.n_envs}{ranks} (run.n_envs): task {cfg.task.name.value!r} has "
            f"{n_train} training samples, so at most {n_train} envs (one sample each; "
            "task.env_split = false gives every env the same samples)"
        )


def action_space_for(cfg: Config, data: TaskData) -> ActionSpace:
    """The policy's action space, from a probe model (which also validates ``host``)."""
    host = member_host(cfg, 0, 0)[1]  # with a family: a member (all offer the same slots)
    try:
        probe = build_model(host, data.spec, seed=cfg.run.seed)
    except ValueError as exc:  # e.g. host.slots naming a slot this host does not have
        raise ConfigError(f"host: {exc} (task {cfg.task.name.value!r})") from None
    check_family_slots(cfg, data.spec, probe.slot_ids)
    menu = cfg.policy.blueprints
    chosen = tuple(menu) if menu is not None else RECOMMENDED_BLUEPRINTS[probe.topology]
    blueprints = chosen or None
    try:
        return ActionSpace(
            slot_ids=probe.slot_ids,
            topology=probe.topology,
            blueprints=blueprints,
            alpha_targets=tuple(cfg.policy.alpha_targets) or None,
            styles=tuple(GerminationStyle[s.upper()] for s in cfg.policy.styles) or None,
            tempos=tuple(cfg.policy.tempos) or None,
        )
    except ValueError as exc:
        raise ConfigError(f"$.policy.blueprints: {exc}") from None
