"""Where the trainer's train phase loses time against the floor (no seeds, no policy).

Variants of the floor's train loop, each adding one thing the trainer's
``batch_ops.train_epoch`` does, and that function itself on freshly built envs (no seed
germinated, so the difference is the loop, not the hosts growing): env order
(env after env vs batch-major interleaving), ``clip_grad_norm_`` per batch,
``model.grad_norms()`` per batch. Repeats alternate the variants; medians of the time
per env-epoch are reported, with the ratio to the plain floor loop.

    python benchmarks/train_phase.py                # digits, 4 envs
    python benchmarks/train_phase.py --task synthetic --n-envs 8
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _trainer as T
import torch
import torch.nn.functional as F

from esper.core.constants import HOST_GRAD_CLIP
from esper.core.enums import AmpMode
from esper.data.iterator import SharedBatchIterator
from esper.training.envs.env_factory import EnvFactory
from esper.training.passes.batch_ops import PassOptions, train_epoch

DEFAULT_REPEATS = 3
DEFAULT_EPOCHS = 10


def _loop(cfg: Any, data: Any, epochs: int, *, batch_major: bool, clip: bool, norms: bool) -> float:
    """Seconds for ``epochs`` floor epochs of all envs with the given additions."""
    fd = T._floor_data(cfg, data, torch.device(cfg.run.device))
    envs = T._floor_models(cfg, data, 0, torch.device(cfg.run.device), fd.channels_last)
    n, per_env, bs = cfg.run.n_envs, fd.per_env, cfg.task.batch_size
    starts = range(0, per_env, bs)
    order = (
        [(i, s) for s in starts for i in range(n)]
        if batch_major
        else [(i, s) for i in range(n) for s in starts]
    )
    for model, _ in envs:
        model.train()
    t0 = time.perf_counter()
    for epoch in range(epochs):
        idx = T.floor_epoch_indices(cfg.run.seed, epoch, fd.train_y.shape[0], n * per_env)
        x, y = fd.train_x.index_select(0, idx), fd.train_y.index_select(0, idx)
        if fd.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        for i, s in order:
            model, opt = envs[i]
            lo, hi = i * per_env + s, i * per_env + min(s + bs, per_env)
            loss = F.cross_entropy(model(x[lo:hi]), y[lo:hi])
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), HOST_GRAD_CLIP, foreach=True)
            if norms:
                model.grad_norms()  # type: ignore[operator]
            opt.step()
    return time.perf_counter() - t0


def _trainer_epochs(cfg: Any, data: Any, epochs: int) -> float:
    """The trainer's own ``train_epoch`` on fresh envs (no seeds germinated)."""
    envs = EnvFactory(cfg, data.spec).create_round(0)
    it = SharedBatchIterator(
        data.train_x,
        data.train_y,
        n_envs=cfg.run.n_envs,
        batch_size=cfg.task.batch_size,
        seed=cfg.run.seed,
        samples_per_env=cfg.task.train_samples_per_env,
        channels_last=cfg.task.channels_last,
    )
    opts = PassOptions(amp=AmpMode.OFF, channels_last=cfg.task.channels_last)
    t0 = time.perf_counter()
    for epoch in range(epochs):
        train_epoch(envs, it.epoch(epoch), opts)
    return time.perf_counter() - t0


def variants(cfg: Any, data: Any, epochs: int) -> dict[str, Callable[[], float]]:
    def loop(**kw: bool) -> Callable[[], float]:
        return lambda: _loop(cfg, data, epochs, **kw)

    return {
        "floor (env after env)": loop(batch_major=False, clip=False, norms=False),
        "floor, batch-major": loop(batch_major=True, clip=False, norms=False),
        "floor + clip_grad_norm_": loop(batch_major=False, clip=True, norms=False),
        "floor + clip + grad_norms": loop(batch_major=False, clip=True, norms=True),
        "batch-major + clip + grad_norms": loop(batch_major=True, clip=True, norms=True),
        "trainer train_epoch (no seeds)": lambda: _trainer_epochs(cfg, data, epochs),
    }


def main(argv: list[str] | None = None) -> int:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--task", default="digits", choices=sorted(T.PRESETS))
    p.add_argument("--n-envs", type=int, default=4)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)
    epochs = args.epochs or (1 if args.quick else DEFAULT_EPOCHS)
    torch.set_num_threads(args.threads)
    info = C.machine_info(threads=args.threads)
    C.print_machine(info)
    cfg = T.bench_config(
        args.task, n_envs=args.n_envs, level="off", threads=args.threads, quick=args.quick
    )
    data = T.load_data(cfg)
    fns = variants(cfg, data, epochs)
    names = list(fns)
    samples: dict[str, list[float]] = {k: [] for k in names}
    if not args.quick:
        fns[names[0]]()  # unmeasured: first-call kernel setup
    for rep in range(repeats):
        for name in C.alternate(names, rep):
            samples[name].append(fns[name]())
    per_env_epoch = {k: C.median(v) * 1e3 / (epochs * args.n_envs) for k, v in samples.items()}
    base = per_env_epoch[names[0]]
    C.print_table(
        f"Train phase, {args.task}, {args.n_envs} envs, {epochs} epochs, median of {repeats}",
        ["variant", "ms per env-epoch", "vs floor"],
        [[k, v, C.ratio(v, base)] for k, v in per_env_epoch.items()],
    )
    C.write_results(
        args.out,
        "train_phase",
        {
            "benchmark": "train_phase",
            "machine": info,
            "quick": args.quick,
            "config": T.describe(cfg),
            "epochs": epochs,
            "repeats": repeats,
            "ms_per_env_epoch": per_env_epoch,
            "ratio_to_floor": {k: C.ratio(v, base) for k, v in per_env_epoch.items()},
            "samples_s": samples,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
