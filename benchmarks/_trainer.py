"""Workloads shared by ``eps.py`` and ``telemetry_overhead.py``: the real trainer, and the floor.

The **trainer** measurement is ``esper.training.run.train`` exactly as a user calls it
(PPO policy, counterfactual validation, governor, checkpoint every round, telemetry to a
real run directory), on a stated configuration. Its EPS is the trainer's own
``TrainResult.eps``: env-steps over the wall time of the rounds (setup excluded).

The **floor** is the same host work done by the plainest PyTorch loop: the same N hosts
(``build_model`` with the trainer's per-round, per-env seeds, rebuilt each round like the
trainer does), the same host optimizer, the same samples per env per epoch as the
trainer's :class:`~esper.data.iterator.SharedBatchIterator` split (same seeded
permutation), the same batch size, the same validation samples and validation batch
size, the same ``channels_last`` setting, ``episode_length`` epochs per round, one
validation pass per epoch, envs one after another. No policy, no counterfactual, no
gradient clipping or gradient metrics, no telemetry. Its metrics stay on the device and
are read once per epoch (one sync, as any loop that looks at its validation accuracy).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from esper.config import Config, load_config, with_overrides
from esper.data.iterator import SharedBatchIterator
from esper.data.tasks import TaskData, load_task
from esper.model import build_model
from esper.telemetry.paths import type_rank_dir
from esper.training.envs.env_factory import env_seed
from esper.training.envs.env_state import make_host_optimizer
from esper.training.run import train

#: Validation batches are this many training batches (what the trainer uses).
VAL_BATCH_FACTOR = 4
IMAGE_DIMS = 4

#: The base of every workload: the whole action space and the spec's reward on the
#: 16-channel host (the defaults when the stored figures were measured), so the same
#: preset is the same work on every tree a comparison runs.
BASE_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "full_action_space.toml"
#: Benchmark workloads: config overrides on top of :data:`BASE_CONFIG`. Sizes are
#: chosen so the whole default ``eps.py`` run (3 repeats, n_envs 1/4/8, both tasks,
#: trainer + floor) stays under about 10 minutes on the 2-core development machine.
PRESETS: dict[str, dict[str, Any]] = {
    # 8x8 digits: every env gets its full share of the 1,438 training images and the
    # whole 359-image validation split; 10 epochs per round, 2 rounds (2 PPO updates).
    "digits": {
        "task.name": "digits",
        "run.episode_length": 10,
        "run.rounds": 2,
    },
    # 32x32 synthetic: 512 training images per env per epoch (the full 4,096 at 8
    # envs), 256 validation images per env per epoch; 6 epochs, 1 round.
    "synthetic": {
        "task.name": "synthetic",
        "task.train_samples_per_env": 512,
        "task.val_samples": 256,
        "run.episode_length": 6,
        "run.rounds": 1,
    },
    # The CIFAR-sized reference of docs (spec performance.md): hosts of 8/16/32
    # channels, 4,096 training images split across the envs, batch 512 per env,
    # validation over 1,000 images. Not in the default set (use --tasks).
    "synthetic_ref": {
        "task.name": "synthetic",
        "host.base_channels": 8,
        "task.batch_size": 512,
        "task.val_samples": 1000,
        "run.episode_length": 5,
        "run.rounds": 1,
    },
    # Next to no arithmetic (2-channel hosts, 8 images per env): what remains of a
    # step is the per-env Python and op dispatch a GPU waits on, measured on any CPU.
    # Not in the default set (use --tasks).
    "digits_tiny": {
        "task.name": "digits",
        "host.base_channels": 2,
        "task.train_samples_per_env": 8,
        "task.batch_size": 8,
        "task.val_samples": 8,
        "run.episode_length": 20,
        "run.rounds": 2,
    },
}
#: --quick: seconds, for the smoke tests (the numbers mean nothing).
QUICK: dict[str, Any] = {
    "task.name": "digits",
    "task.train_samples_per_env": 64,
    "task.val_samples": 64,
    "run.episode_length": 2,
    "run.rounds": 1,
    "policy.feature_dim": 32,
    "policy.lstm_hidden": 32,
}


@dataclasses.dataclass
class Measurement:
    """One timed run: EPS plus where the time went (milliseconds per phase)."""

    eps: float
    wall_s: float
    env_steps: int
    phases_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    #: Events the run wrote and the bytes of its run directory (trainer with telemetry).
    events: int = 0
    bytes_on_disk: int = 0
    #: CPU seconds of the whole process (every thread, the telemetry writer included)
    #: over the call, setup included. Unlike wall time it hardly moves when other
    #: processes compete for the cores, so cpu_eps is the steadier figure on a loaded
    #: machine; it overstates the cost of work that runs in parallel on an idle core.
    cpu_s: float = math.nan
    #: CPU seconds the telemetry writer spent writing (its manifest's ``cpu_ns``): part
    #: of ``cpu_s``, measured per thread, so its share is exact even on a loaded machine.
    writer_cpu_s: float = 0.0
    #: Batches the writer wrote (one part per event type each; its manifest's
    #: ``flushes``).
    writer_flushes: int = 0

    @property
    def cpu_eps(self) -> float:
        return self.env_steps / self.cpu_s if self.cpu_s > 0 else math.nan


def bench_config(
    preset: str,
    *,
    n_envs: int,
    level: str,
    threads: int,
    device: str = "cpu",
    quick: bool = False,
    overrides: dict[str, Any] | None = None,
) -> Config:
    """The stated configuration of one measurement."""
    values: dict[str, Any] = dict(QUICK if quick else PRESETS[preset])
    values.update(
        {
            "run.n_envs": n_envs,
            "run.torch_threads": threads,
            "run.device": device,
            "telemetry.level": level,
            "run.seed": 0,
        }
    )
    values.update(overrides or {})
    return with_overrides(load_config(BASE_CONFIG), values)


def describe(cfg: Config) -> dict[str, Any]:
    """The parts of a config that define the workload (for the JSON results)."""
    return {
        "task": cfg.task.name.value,
        "n_envs": cfg.run.n_envs,
        "episode_length": cfg.run.episode_length,
        "rounds": cfg.run.rounds,
        "batch_size": cfg.task.batch_size,
        "train_samples_per_env": cfg.task.train_samples_per_env,
        "val_samples": cfg.task.val_samples,
        "base_channels": cfg.host.base_channels,
        "n_blocks": cfg.host.n_blocks,
        "channels_last": cfg.task.channels_last,
        "telemetry_level": cfg.telemetry.level,
        "policy": cfg.policy.kind.value,
        "device": cfg.run.device,
        "amp": cfg.run.amp.value,
        "torch_threads": cfg.run.torch_threads,
        "checkpoint_every": cfg.run.checkpoint_every,
    }


def load_data(cfg: Config) -> TaskData:
    return load_task(cfg.task, seed=cfg.run.seed)


def _round_phases(run_dir: Path | None) -> dict[str, float]:
    """Phase totals (ms) from the run's ``round_finished`` events, when there are any."""
    if run_dir is None:
        return {}
    type_dir = type_rank_dir(run_dir, "round_finished", 0).parent
    if not type_dir.exists():
        return {}
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq  # not polars: a GPU machine runs this without it

    files = sorted(type_dir.rglob("*.parquet"))
    cols = ["train_ms", "val_ms", "policy_ms", "action_ms", "ppo_ms"]
    table = pa.concat_tables([pq.read_table(f, columns=cols) for f in files])
    return {c.removesuffix("_ms"): float(pc.sum(table[c]).as_py() or 0.0) for c in cols}


def _telemetry_size(run_dir: Path | None) -> tuple[int, int, float, int]:
    """(events written, bytes of Parquet + manifests, writer CPU seconds, flushes) of a
    closed run."""
    if run_dir is None or not (run_dir / "manifest.json").exists():
        return 0, 0, 0.0, 0
    writer = json.loads((run_dir / "manifest.json").read_text()).get("writer", {})
    files = [*run_dir.rglob("*.parquet"), *run_dir.glob("manifest*.json")]
    size = sum(f.stat().st_size for f in files)
    cpu_s = int(writer.get("cpu_ns", 0)) / 1e9
    return int(writer.get("events_written", 0)), size, cpu_s, int(writer.get("flushes", 0))


def run_trainer(cfg: Config, data: TaskData, *, scratch: Path | None = None) -> Measurement:
    """One ``train()`` run into a throw-away telemetry directory."""
    tmp = Path(tempfile.mkdtemp(prefix="esper-bench-", dir=scratch))
    try:
        run_cfg = with_overrides(cfg, {"telemetry.dir": str(tmp), "run.run_id": "bench"})
        cpu0 = time.process_time()
        result = train(run_cfg, data=data)
        cpu_s = time.process_time() - cpu0
        phases = _round_phases(result.run_dir)
        if phases:
            phases["other"] = max(0.0, result.wall_s * 1e3 - sum(phases.values()))
        events, size, writer_cpu_s, flushes = _telemetry_size(result.run_dir)
        return Measurement(
            result.eps,
            result.wall_s,
            result.env_steps,
            phases,
            events,
            size,
            cpu_s,
            writer_cpu_s,
            flushes,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclasses.dataclass
class _FloorData:
    train_x: torch.Tensor
    train_y: torch.Tensor
    val: list[tuple[torch.Tensor, torch.Tensor]]
    per_env: int
    channels_last: bool


def _floor_data(cfg: Config, data: TaskData, device: torch.device) -> _FloorData:
    """Data laid out once, split exactly like the trainer's iterator."""
    sizing = SharedBatchIterator(  # only for its split sizes (CPU tensors, no copy)
        data.train_x,
        data.train_y,
        n_envs=cfg.run.n_envs,
        batch_size=cfg.task.batch_size,
        seed=cfg.run.seed,
        samples_per_env=cfg.task.train_samples_per_env,
    )
    channels_last = cfg.task.channels_last and data.train_x.dim() == IMAGE_DIMS
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    n_val = data.val_y.shape[0]
    if cfg.task.val_samples is not None:
        n_val = min(n_val, cfg.task.val_samples)
    val_x = data.val_x[:n_val].to(device).contiguous(memory_format=fmt)
    val_y = data.val_y[:n_val].to(device)
    vb = cfg.task.batch_size * VAL_BATCH_FACTOR
    return _FloorData(
        train_x=data.train_x.to(device).contiguous(memory_format=fmt),
        train_y=data.train_y.to(device),
        val=[(val_x[i : i + vb], val_y[i : i + vb]) for i in range(0, n_val, vb)],
        per_env=sizing.per_env,
        channels_last=channels_last,
    )


def _floor_models(
    cfg: Config, data: TaskData, rnd: int, device: torch.device, channels_last: bool
) -> list[tuple[torch.nn.Module, torch.optim.Optimizer]]:
    out = []
    for i in range(cfg.run.n_envs):
        model = build_model(cfg.host, data.spec, seed=env_seed(cfg.run.seed, rnd, i)).to(device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        out.append((model, make_host_optimizer(model, cfg.host)))
    return out


def _train_env(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
) -> None:
    model.train()
    for start in range(0, y.shape[0], batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        logits = model(xb)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()


def _validate_env(
    model: torch.nn.Module, val: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    model.eval()
    acc = torch.zeros(2, device=val[0][0].device)
    with torch.inference_mode():
        for xb, yb in val:
            logits = model(xb)
            flat = logits.reshape(-1, logits.shape[-1])
            target = yb.reshape(-1)
            acc[0] += F.cross_entropy(flat, target, reduction="sum")
            acc[1] += (flat.argmax(dim=-1) == target).sum()
    return acc


def floor_epoch_indices(seed: int, epoch: int, n_train: int, used: int) -> torch.Tensor:
    """The samples of one epoch: the same seeded permutation as the trainer's iterator
    (env i trains on the i-th contiguous share of the first ``used`` indices)."""
    gen = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(n_train, generator=gen)[:used]


def run_floor(cfg: Config, data: TaskData) -> Measurement:
    """The plainest loop over the same host work (see the module docstring)."""
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)
    device = torch.device(cfg.run.device)
    cpu0 = time.process_time()
    fd = _floor_data(cfg, data, device)
    n, per_env, bs = cfg.run.n_envs, fd.per_env, cfg.task.batch_size
    n_train = fd.train_y.shape[0]
    train_s = val_s = 0.0
    t0 = time.perf_counter()
    for rnd in range(cfg.run.rounds):
        envs = _floor_models(cfg, data, rnd, device, fd.channels_last)
        for step in range(cfg.run.episode_length):
            t_epoch = time.perf_counter()
            epoch = rnd * cfg.run.episode_length + step
            idx = floor_epoch_indices(cfg.run.seed, epoch, n_train, n * per_env).to(device)
            x, y = fd.train_x.index_select(0, idx), fd.train_y.index_select(0, idx)
            if fd.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            for i, (model, opt) in enumerate(envs):
                lo, hi = i * per_env, (i + 1) * per_env
                _train_env(model, opt, x[lo:hi], y[lo:hi], bs)
            t_val = time.perf_counter()
            stats = torch.stack([_validate_env(model, fd.val) for model, _ in envs])
            stats.cpu()  # the epoch's one device-to-host read of the metrics
            train_s += t_val - t_epoch
            val_s += time.perf_counter() - t_val
    wall = time.perf_counter() - t0
    steps = cfg.run.rounds * cfg.run.episode_length * n
    other = max(0.0, wall - train_s - val_s)
    phases = {"train": train_s * 1e3, "val": val_s * 1e3, "other": other * 1e3}
    cpu_s = time.process_time() - cpu0
    eps = steps / wall if wall > 0 else math.nan
    return Measurement(eps, wall, steps, phases, cpu_s=cpu_s)
