"""Multi-process training: one :class:`Collective` injected into the trainer and learner.

``torchrun --nproc_per_node=K -m esper train ...`` starts K ranks; each steps its own
``run.n_envs`` envs (``--envs`` is *per rank*) and holds a replica of the policy. The
ranks run in lockstep: every step merges the reward-normaliser statistics, every PPO
minibatch averages the gradients (and the loss and KL that gate the update), the value
and observation normalisers merge their moments, and each round ends with a hash check
that every replica holds the same weights. Env ``i`` of rank ``r`` is global env
``r * n_envs + i``: its host seed, data shard and the ``env`` column of its events are
those of env ``r * n_envs + i`` in a one-process run with ``K * n_envs`` envs.

Single-process training never builds a :class:`Collective` (the learner and trainer get
``None``), so its path is unchanged and bit-identical. Collectives time out
(``timeout_s``), so a rank that dies or hangs ends the others with an error instead of
a hang.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec
import torch
import torch.distributed as dist
from torch import Tensor

from esper.config import RunConfig
from esper.data.iterator import SharedBatchIterator
from esper.errors import CheckpointError, UserError
from esper.telemetry import events as ev
from esper.telemetry.event_columns import EventColumns
from esper.telemetry.events import Event
from esper.telemetry.hub import DelegatingHub, Hub
from esper.training.learning.learner import POLICY_SEED_OFFSET, Learner

#: Default seconds a collective waits for the other ranks before failing the run.
DEFAULT_TIMEOUT_S: Final = 300.0
#: The policy-sampling stream of rank r is offset by r * this (rank 0 keeps the
#: single-process stream).
RANK_SEED_STRIDE: Final = 104_729
#: Bytes of the weights digest compared across ranks.
DIGEST_BYTES: Final = 8
#: Longest run id broadcast from rank 0 (run ids are short names).
MAX_RUN_ID_BYTES: Final = 256
#: Events that describe the run rather than a rank's envs: written by rank 0 only.
RUN_LEVEL_EVENTS: Final = (
    ev.RunStarted,
    ev.RunFinished,
    ev.RoundStarted,
    ev.RoundFinished,
    ev.PpoUpdate,
    ev.AnomalyDetected,
    ev.CheckpointSaved,
    ev.CheckpointLoaded,
)


class RankLostError(RuntimeError):
    """A collective failed: another rank died, failed or did not answer in time."""


class ReplicaDivergenceError(RuntimeError):
    """The policy replicas no longer hold identical weights (a bug, never expected)."""


class Collective:
    """The process group of a multi-rank run and the few reductions training needs."""

    def __init__(self, *, rank: int, world_size: int, local_rank: int, device: torch.device):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        #: Where collective tensors live (CUDA for NCCL, CPU for gloo).
        self.device = device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def env_offset(self, n_envs: int) -> int:
        """Global index of this rank's first env."""
        return self.rank * n_envs

    def attach(self, learner: Learner) -> None:
        """Merge the learner's normalisers over the ranks; give this rank its own
        policy-sampling stream (rank 0 keeps the single-process one)."""
        learner.obs_norm.merge = self.merge_moments
        learner.reward_norm.rms.merge = self.merge_moments
        learner.value_norm.merge = self.merge_mean
        if self.rank:
            seed = learner.cfg.run.seed + POLICY_SEED_OFFSET + self.rank * RANK_SEED_STRIDE
            learner.generator.manual_seed(seed)

    def _lost(self, exc: BaseException) -> RankLostError:
        return RankLostError(
            f"rank {self.rank} of {self.world_size}: the other ranks stopped answering "
            f"(one died, failed or exceeded the --dist-timeout): {exc}"
        )

    def _sum_(self, t: Tensor) -> Tensor:
        """All-reduce (sum) ``t`` in place on the collective device; returns it there."""
        moved = t.to(self.device)
        try:
            dist.all_reduce(moved, op=dist.ReduceOp.SUM)
        except RuntimeError as exc:  # DistBackendError: peer gone, or timeout
            raise self._lost(exc) from exc
        return moved.to(t.device)

    def average_grads(self, params: Iterable[Tensor], scalars: Tensor) -> Tensor:
        """Average every parameter's gradient and ``scalars`` over the ranks, in ONE
        all-reduce; returns the averaged scalars. A missing gradient counts as zeros."""
        plist = [p for p in params if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in plist]
        flat = torch.cat([*(g.reshape(-1).float() for g in grads), scalars.float().reshape(-1)])
        flat = self._sum_(flat) / self.world_size
        offset = 0
        for p, g in zip(plist, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(g).to(g.dtype)
            offset += n
        return flat[offset:]

    def all_true(self, flag: Tensor) -> Tensor:
        """True on every rank only if ``flag`` is true on every rank."""
        return self._sum_(flag.to(torch.float32).reshape(1))[0] == self.world_size

    def merge_moments(
        self, count: int | Tensor, mean: Tensor, var: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(count, mean, population var) of the union of every rank's batch (Chan)."""
        c = torch.as_tensor(count, dtype=mean.dtype, device=mean.device).reshape(1)
        packed = self._sum_(torch.cat([c, (mean * c).reshape(-1)]))
        total = packed[0]
        g_mean = (packed[1:] / total).view_as(mean)
        m2 = self._sum_((c * (var + (mean - g_mean).square())).reshape(-1)).view_as(var)
        return total, g_mean, m2 / total

    def merge_mean(self, count: int | Tensor, mean: Tensor) -> tuple[Tensor, Tensor]:
        """(count, mean) of the union of every rank's batch (scalar ``mean``)."""
        c = torch.as_tensor(count, dtype=mean.dtype, device=mean.device).reshape(1)
        packed = self._sum_(torch.cat([c, (mean * c).reshape(1)]))
        return packed[0], packed[1] / packed[0]

    def sum_floats(self, values: list[float]) -> list[float]:
        """Sum a few host numbers over the ranks (end-of-round summaries)."""
        out = self._sum_(torch.tensor(values, dtype=torch.float64))
        return [float(v) for v in out.tolist()]

    def check_replicas(self, module: torch.nn.Module) -> None:
        """Raise :class:`ReplicaDivergenceError` naming the ranks whose weights differ."""
        h = hashlib.sha256()
        for name, tensor in sorted(module.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        digest = torch.tensor(
            list(h.digest()[:DIGEST_BYTES]), dtype=torch.int64, device=self.device
        )
        gathered = [torch.empty_like(digest) for _ in range(self.world_size)]
        try:
            dist.all_gather(gathered, digest)
        except RuntimeError as exc:
            raise self._lost(exc) from exc
        ref = gathered[0].cpu()
        bad = [r for r, d in enumerate(gathered) if not torch.equal(d.cpu(), ref)]
        if bad:
            raise ReplicaDivergenceError(
                f"policy weights differ from rank 0's on rank(s) {bad} (world size "
                f"{self.world_size}); the replicas must stay identical"
            )

    def broadcast_str(self, value: str) -> str:
        """Rank 0's ``value`` on every rank (the run id, whose default has a timestamp)."""
        buf = torch.zeros(MAX_RUN_ID_BYTES + 1, dtype=torch.int64, device=self.device)
        if self.is_main:
            raw = value.encode()[:MAX_RUN_ID_BYTES]
            buf[0] = len(raw)
            buf[1 : 1 + len(raw)] = torch.tensor(list(raw), dtype=torch.int64)
        try:
            dist.broadcast(buf, src=0)
        except RuntimeError as exc:
            raise self._lost(exc) from exc
        host = buf.cpu().tolist()
        return bytes(host[1 : 1 + host[0]]).decode()

    def barrier(self) -> None:
        try:
            dist.barrier()
        except RuntimeError as exc:
            raise self._lost(exc) from exc

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def launched_world_size(environ: Mapping[str, str] | None = None) -> int:
    """``WORLD_SIZE`` as torchrun (or Slurm via torchrun) sets it; 1 without a launcher."""
    env = os.environ if environ is None else environ
    raw = env.get("WORLD_SIZE", "1")
    try:
        size = int(raw)
    except ValueError:
        raise UserError(f"WORLD_SIZE={raw!r} is not an integer") from None
    if size < 1:
        raise UserError(f"WORLD_SIZE={raw!r} must be >= 1")
    return size


def init_collective(
    device: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, environ: Mapping[str, str] | None = None
) -> Collective | None:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``/``MASTER_PORT``); ``None`` when the world is one process.

    gloo on CPU, NCCL on CUDA (each rank on ``cuda:LOCAL_RANK``).
    """
    env = os.environ if environ is None else environ
    world = launched_world_size(env)
    if world == 1:
        return None
    missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise UserError(
            f"WORLD_SIZE={world} but {', '.join(missing)} not set: launch with torchrun "
            "(see README, 'More than one process')"
        )
    rank, local_rank = int(env["RANK"]), int(env["LOCAL_RANK"])
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend="nccl" if cuda else "gloo",
        timeout=datetime.timedelta(seconds=timeout_s),
        rank=rank,
        world_size=world,
    )
    coll_device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    return Collective(rank=rank, world_size=world, local_rank=local_rank, device=coll_device)


def check_world_size(
    state: dict[str, Any], path: str | os.PathLike[str] | None, collective: Collective | None
) -> None:
    """A checkpoint resumes only with the world size (ranks) that wrote it.

    Each rank's file holds that rank's sampling stream and telemetry position, and the
    envs it stepped: another world size would not replay the same run.
    """
    theirs = int(state.get("world_size", 1))
    ours = collective.world_size if collective is not None else 1
    if theirs != ours:
        raise CheckpointError(
            f"{path}: the checkpoint was written by a run with {theirs} rank(s) (world size); "
            f"this run has {ours}: resume it with the same number of processes "
            f"(torchrun --nproc_per_node={theirs} ..., or no torchrun for 1)"
        )
    rank = collective.rank if collective is not None else 0
    if int(state.get("rank", 0)) != rank:
        raise CheckpointError(
            f"{path}: the checkpoint belongs to rank {state.get('rank')}, not rank {rank}"
        )


def rank_checkpoint(path: Path, collective: Collective) -> Path:
    """This rank's file of the checkpoint ``path`` names (rank 0's file).

    A checkpoint written by fewer ranks has no file for this rank: refused with the
    world size that wrote it, not a bare "missing file".
    """
    mine = rank_path(path, collective.rank)
    if mine.exists() or not path.exists():
        return mine  # a missing rank 0 file is reported by the loader
    from esper.training.loop.checkpoint import read_checkpoint

    theirs = int(read_checkpoint(path).get("world_size", 1))
    raise CheckpointError(
        f"{path}: the checkpoint was written by a run with {theirs} rank(s) (world size), "
        f"so there is no {mine.name} for rank {collective.rank} of this run's "
        f"{collective.world_size}: resume it with the same number of processes"
    )


def global_run(run: RunConfig, collective: Collective | None) -> RunConfig:
    """``run`` as one process with every rank's envs (fault specs name global envs)."""
    world = collective.world_size if collective is not None else launched_world_size()
    return run if world == 1 else msgspec.structs.replace(run, n_envs=run.n_envs * world)


def rank_device(device: str, collective: Collective | None) -> str:
    """``cuda``/``cuda:K`` becomes ``cuda:LOCAL_RANK`` on a multi-rank run; CPU stays."""
    if collective is None or torch.device(device).type != "cuda":
        return device
    return f"cuda:{collective.local_rank}"


def rank_path(path: Path, rank: int) -> Path:
    """Rank 0 keeps ``path``; rank r uses ``<stem>-rank<r><suffix>`` beside it."""
    return path if rank == 0 else path.with_name(f"{path.stem}-rank{rank}{path.suffix}")


class RankShardIterator(SharedBatchIterator):
    """The shard of a ``world * n_envs``-env epoch that belongs to this rank's envs.

    Built for the global env count (same per-env share and same permutation as a
    one-process run with all the envs), it hands out rows ``offset .. offset+n_envs-1``.
    """

    def __init__(
        self, train_x: Tensor, train_y: Tensor, *, n_envs: int, env_offset: int, n_global: int,
        batch_size: int, seed: int, samples_per_env: int | None, device: torch.device,
        channels_last: bool, split: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(
            train_x, train_y, n_envs=n_global, batch_size=batch_size, seed=seed,
            samples_per_env=samples_per_env, device=device, channels_last=channels_last,
            split=split,
        )  # fmt: skip
        self.n_global, self.env_offset, self.n_envs = n_global, env_offset, n_envs

    def epoch_indices(self, epoch_index: int) -> Tensor:
        rows = self.epoch_rows(epoch_index, self.n_global)
        return rows[self.env_offset : self.env_offset + self.n_envs]


class RankHub(DelegatingHub):
    """A rank's hub: run-level events (:data:`RUN_LEVEL_EVENTS`) only on rank 0.

    Every rank writes its own ``rank=<r>`` partitions with its own contiguous ``seq``;
    the events of the run as a whole (start, rounds, PPO updates, checkpoints, finish)
    are written once, so counts over all ranks are the run's counts.
    """

    def __init__(self, inner: Hub, *, rank: int) -> None:
        super().__init__(inner, rank=rank)
        self._drop_run_level = rank != 0

    def emit(self, event: Event) -> None:
        if self._drop_run_level and isinstance(event, RUN_LEVEL_EVENTS):
            return
        self._inner.emit(event)

    def emit_batch(self, events: Sequence[Event]) -> None:
        if self._drop_run_level:
            events = [e for e in events if not isinstance(e, RUN_LEVEL_EVENTS)]
        self._inner.emit_batch(events)

    def emit_columns(self, batch: EventColumns) -> None:
        if self._drop_run_level and issubclass(batch.cls, RUN_LEVEL_EVENTS):
            return
        self._inner.emit_columns(batch)
