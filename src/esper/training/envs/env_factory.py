"""Build the N environments of a round: fresh hosts, optimizers, governors, streams.

Every round starts from fresh, deterministically seeded hosts: the seed of env ``e`` in
round ``r`` derives from the run seed alone, so a resumed run rebuilds exactly the same
hosts as an uninterrupted one. With a host family the member each env trains is drawn
from the same seeds (:func:`esper.core.host_family.member_index`). A stacked round
renews the last stacked round's modules rather than building new ones (the values are
the same: tests/training/test_host_batching.py), so a round's start costs no module
construction per env.
"""

from __future__ import annotations

import msgspec
import numpy as np
import torch

from esper.config import Config, FamilyMember, HostConfig
from esper.core.constants import ENV_SEED_STRIDE, ROUND_SEED_STRIDE
from esper.core.enums import AmpMode, Topology
from esper.core.host_family import member_index
from esper.data.tasks import TaskSpec
from esper.errors import ConfigError
from esper.model import MorphogeneticModel, build_model
from esper.model.seed_pool import SeedPool
from esper.model.slot_table import SlotTable
from esper.policy.signals import SignalTracker
from esper.training.envs.env_state import EnvState
from esper.training.envs.env_table import EnvTable
from esper.training.envs.governor import Governor


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


class EnvFactory:
    """Creates the envs of each round from the config and the task."""

    def __init__(self, cfg: Config, spec: TaskSpec, *, env_offset: int = 0) -> None:
        self.cfg = cfg
        self.spec = spec
        self.devices = resolve_env_devices(cfg)
        #: Global index of the first env (multi-rank runs: rank * n_envs).
        self.env_offset = env_offset
        #: The last stacked round's models by host member: the next stacked round renews
        #: them rather than building N models again (the modules' structure is the
        #: member's; everything per round is reset, and the store initialises the host).
        self._spare: dict[str, list[MorphogeneticModel]] = {}
        #: The removed seeds' modules of every model made here, for germinations in any
        #: env to initialise instead of building (the values are a new module's).
        self.pool = SeedPool()

    def stacks(self) -> bool:
        """Whether the round's hosts are built straight into batched stores (a batched
        CNN run without fp16's GradScaler: ``host_batching.batchable``)."""
        fp16 = self.cfg.run.amp == AmpMode.FP16 and self.devices[0].type == "cuda"
        return self.cfg.batches_envs() and self.spec.topology == Topology.CNN and not fp16

    def create_round(self, rnd: int, *, stacked: bool = False) -> list[EnvState]:
        """The round's envs, their state in one fresh :class:`EnvTable`; ``stacked``:
        the hosts initialised straight into the round's batched stores (same values)."""
        n = self.cfg.run.n_envs
        spare, self._spare = (self._spare if stacked else {}), {}
        first = self._model(rnd, 0, None, spare, materialized=not stacked)
        table = EnvTable.for_round(self.cfg, self.spec, len(first[1].slot_ids))
        first[1].bind_table(table.slots, 0)
        rest = [self._model(rnd, i, table, spare, materialized=not stacked) for i in range(1, n)]
        models = [first, *rest]
        envs = [
            self.create_env(table, i, *built, stacked=stacked) for i, built in enumerate(models)
        ]
        if stacked:
            self._stack(rnd, envs, table)
            for name, model in models:
                self._spare.setdefault(name, []).append(model)
        for env in envs:
            env.model.set_reporter(table.reporter(env.row))
        return envs

    def _model(
        self,
        rnd: int,
        local: int,
        table: EnvTable | None,
        spare: dict[str, list[MorphogeneticModel]],
        *,
        materialized: bool,
    ) -> tuple[str, MorphogeneticModel]:
        """Env ``local``'s host (its family member's name, or ""), its slots in row
        ``local`` of ``table`` (or a table of its own, for the first: the table's width
        is its slots'): a spare model of that member renewed, or a new one."""
        index = self.env_offset + local
        name, host = member_host(self.cfg, rnd, index)
        seed = env_seed(self.cfg.run.seed, rnd, index)
        kept = spare.get(name)
        if kept:
            model = kept.pop()
            slots = SlotTable(1, len(model.slot_ids)) if table is None else table.slots
            model.renew(seed=seed, table=slots, row=local)
            return name, model
        model = build_model(
            host,
            self.spec,
            seed=seed,
            strict_gates=self.cfg.host.strict_gates,
            materialized=materialized,
            table=None if table is None else table.slots,
            row=local,
            pool=self.pool,
        )
        return name, model

    def _stack(self, rnd: int, envs: list[EnvState], table: EnvTable) -> None:
        """The round's stores (one per device and host member), the host optimizers over
        the stored tensors, and every env's first governor snapshot, taken at once."""
        from esper.training.passes.host_batching import make_stores, snapshot_rows

        seeds = [env_seed(self.cfg.run.seed, rnd, env.index) for env in envs]
        channels_last = self.cfg.task.channels_last and len(self.spec.input_shape) == 3
        stores = make_stores(envs, seeds, channels_last=channels_last)
        for store in stores:
            snapshot_rows(store, np.arange(len(store.envs)), step=0)

    def create_env(
        self,
        table: EnvTable,
        local: int,
        name: str,
        model: MorphogeneticModel,
        *,
        stacked: bool = False,
    ) -> EnvState:
        """Env ``local`` of this process (row ``local`` of ``table``); seeded and named by
        its global index. ``stacked``: its host is on the meta device until the round's
        stores are made (:meth:`create_round`), which also snapshot it."""
        device = self.devices[local]
        index = self.env_offset + local
        descriptor = model.describe(name)
        if not stacked:
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
            host_cfg=self.cfg.host,
            host=descriptor,
            governor=governor,
            tracker=SignalTracker(table=table.signals, row=local),
            table=table,
            row=local,
            # Env streams overlap the per-env passes; a batched round's passes run once.
            stream=torch.cuda.Stream(device=device) if use_cuda and not stacked else None,  # type: ignore[no-untyped-call]
            scaler=(
                torch.amp.GradScaler("cuda")
                if use_cuda and self.cfg.run.amp == AmpMode.FP16
                else None
            ),
        )
        table.host_params[local] = descriptor.params
        table.ref_params[local] = model.ref_params()
        table.strict_gates[local] = model.strict_gates
        table.env_index[local] = index
        if not stacked:
            governor.maybe_snapshot(0, model, force=True)
        return env
