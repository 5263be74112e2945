"""Build the N environments of a round: fresh hosts, optimizers, governors, streams.

Every round starts from fresh, deterministically seeded hosts: the seed of env ``e`` in
round ``r`` derives from the run seed alone, so a resumed run rebuilds exactly the same
hosts as an uninterrupted one. With a host family the member each env trains is drawn
from the same seeds (:func:`esper.core.host_family.member_index`).
"""

from __future__ import annotations

import msgspec
import torch

from esper.config import Config, FamilyMember, HostConfig
from esper.core.constants import ENV_SEED_STRIDE, ROUND_SEED_STRIDE
from esper.core.enums import AmpMode
from esper.core.host_family import member_index
from esper.data.tasks import TaskSpec
from esper.errors import ConfigError
from esper.model import MorphogeneticModel, build_model
from esper.policy.signals import SignalTracker
from esper.training.env_state import EnvState
from esper.training.env_table import EnvTable
from esper.training.governor import Governor


def env_seed(run_seed: int, rnd: int, env: int) -> int:
    return run_seed + rnd * ROUND_SEED_STRIDE + env * ENV_SEED_STRIDE


def resolve_env_devices(cfg: Config) -> list[torch.device]:
    """``env_devices`` round-robin, defaulting to the run device for every env."""
    names = cfg.run.env_devices or [cfg.run.device]
    return [torch.device(names[i % len(names)]) for i in range(cfg.run.n_envs)]


def member_host(cfg: Config, rnd: int, env: int) -> tuple[str, HostConfig]:
    """(member name, host config) of global env ``env`` in round ``rnd``; without a
    family, ("", ``[host]``)."""
    members = cfg.family.members
    if not members:
        return "", cfg.host
    member = members[member_index(cfg.run.seed, rnd, env, len(members))]
    return member.name, _member_config(cfg, member)


def _member_config(cfg: Config, member: FamilyMember) -> HostConfig:
    """``[host]`` with the member's block widths (everything else is shared)."""
    return msgspec.structs.replace(cfg.host, block_channels=member.block_channels)


def check_family_slots(cfg: Config, spec: TaskSpec, slot_ids: tuple[str, ...]) -> None:
    """Every family member must offer the action space's slots, in its order: one policy
    acts on all of them (``host.slots`` can name the slots that members of different
    depths share)."""
    for i, member in enumerate(cfg.family.members):
        try:
            probe = build_model(_member_config(cfg, member), spec, seed=cfg.run.seed)
        except ValueError as exc:
            raise ConfigError(f"$.family.members[{i}] ({member.name!r}): {exc}") from None
        if probe.slot_ids != slot_ids:
            raise ConfigError(
                f"$.family.members[{i}] ({member.name!r}): its slots {list(probe.slot_ids)} "
                f"differ from the first member's {list(slot_ids)}; every member must offer "
                "the same slots (set host.slots to the slots they share)"
            )


def make_host_optimizer(model: MorphogeneticModel, cfg: HostConfig) -> torch.optim.Optimizer:
    # foreach on every device: a few multi-tensor kernels per step instead of three per
    # parameter (torch picks foreach only on CUDA; on a CPU the results are identical).
    return torch.optim.SGD(
        model.host_parameters(),
        lr=cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        foreach=True,
    )


def make_seed_optimizer(params: list[torch.nn.Parameter], cfg: HostConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=cfg.seed_lr, momentum=cfg.momentum, foreach=True)


class EnvFactory:
    """Creates the envs of each round from the config and the task."""

    def __init__(self, cfg: Config, spec: TaskSpec, *, env_offset: int = 0) -> None:
        self.cfg = cfg
        self.spec = spec
        self.devices = resolve_env_devices(cfg)
        #: Global index of the first env (multi-rank runs: rank * n_envs).
        self.env_offset = env_offset

    def create_round(self, rnd: int) -> list[EnvState]:
        """The round's envs, their state in one fresh :class:`EnvTable`."""
        models = [self._model(rnd, i) for i in range(self.cfg.run.n_envs)]
        table = EnvTable.for_round(self.cfg, self.spec, len(models[0][1].slot_ids))
        return [self.create_env(table, i, *built) for i, built in enumerate(models)]

    def _model(self, rnd: int, local: int) -> tuple[str, MorphogeneticModel]:
        """Env ``local``'s host (its family member's name, or "")."""
        index = self.env_offset + local
        name, host = member_host(self.cfg, rnd, index)
        model = build_model(
            host,
            self.spec,
            seed=env_seed(self.cfg.run.seed, rnd, index),
            strict_gates=self.cfg.host.strict_gates,
        )
        return name, model

    def create_env(
        self, table: EnvTable, local: int, name: str, model: MorphogeneticModel
    ) -> EnvState:
        """Env ``local`` of this process (row ``local`` of ``table``); seeded and named by
        its global index."""
        device = self.devices[local]
        index = self.env_offset + local
        model.bind_table(table.slots, local)
        descriptor = model.describe(name)
        model = model.to(device, non_blocking=True)
        if self.cfg.task.channels_last and len(self.spec.input_shape) == 3:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        governor = Governor(
            self.cfg.governor,
            random_guess_loss=self.spec.random_guess_loss,
            guard=table.guard,
            row=local,
        )
        use_cuda = device.type == "cuda"
        env = EnvState(
            index=index,
            device=device,
            model=model,
            host_optimizer=make_host_optimizer(model, self.cfg.host),
            host_cfg=self.cfg.host,
            host=descriptor,
            governor=governor,
            tracker=SignalTracker(table=table.signals, row=local),
            table=table,
            row=local,
            stream=torch.cuda.Stream(device=device) if use_cuda else None,  # type: ignore[no-untyped-call]
            scaler=(
                torch.amp.GradScaler("cuda")
                if use_cuda and self.cfg.run.amp == AmpMode.FP16
                else None
            ),
        )
        model.set_reporter(table.reporter(local))
        table.host_params[local] = descriptor.params
        table.ref_params[local] = model.ref_params()
        governor.maybe_snapshot(0, model, force=True)
        return env
