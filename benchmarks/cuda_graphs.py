"""The batched step's passes on a GPU: train eager against graph replay; validation
stacked against per env.

Issue 37 asks whether the batched step should be captured as a CUDA graph with a
fixed-shape seed layout ("sleeper seeds"). Before building that layout, this script
measures the headroom on the step as it is today: one
:class:`~esper.training.passes.slot_groups.HostBatch` train step (forward, backward, per-env
clip, SGD for every env) on ``synthetic_ref`` hosts, for four seed layouts held fixed:

- ``host``: no seeds (the start of every episode);
- ``one_kind``: every env blends a ``conv_heavy`` seed in its first slot;
- ``mixed``: two seed kinds per slot, as in a PPO run's early rounds: env i grows a
  seed in slot i mod n_slots (one of three blueprints per slot), training in half the
  envs and blending in the other half (ten kinds on ``synthetic_ref``'s five slots);
- ``late``: late in an episode, env i blends 1 + i mod 3 seeds in the first slots (with
  the default full factorial the validation pass has 2, 4 or 8 configurations per env).

For each it times, per step of all envs: the per-env loop (``batch_ops.train_batch`` env
by env, torch's own optimizers), the batched step run eagerly, the batched step replayed
from a captured ``torch.cuda.CUDAGraph``, and how long ``HostBatch`` takes to build (the
trainer builds one per epoch). It checks that replay gives the eager step's parameters,
and counts the eager step's kernel launches (the graph is one launch). Capture needs
CUDA; on a CPU only the eager figures are taken (``--device cpu --quick``: the plumbing).

Validation, same layouts: the trainer's fused counterfactual pass over the run's
validation set, each env with the configurations the trainer would evaluate (the
real one and its measurable seeds' ablations: every subset, up to three seeds), stacked
(``host_batching.validate_batched``: one row per (env, configuration), no padding) and
per env (``batch_ops.validate_fused``, what the per-env trainer runs), timed by turns on
the same state; on CUDA the stacked pass is also captured and replayed.

    python benchmarks/cuda_graphs.py --device cuda --n-envs 16,64 --out benchmarks/results/gpu_h200
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _trainer as T
import numpy as np
import torch

from esper.core.enums import GerminationStyle, Initiator, SeedStage
from esper.data.iterator import SharedBatchIterator, val_batches
from esper.data.tasks import load_task
from esper.model.lifecycle import effective_alphas
from esper.training.envs.action_execution import sync_seed_optimizers
from esper.training.envs.counterfactual import Ablations, ablations, unavailable_reasons
from esper.training.envs.env_factory import EnvFactory
from esper.training.envs.env_state import EnvState
from esper.training.envs.host_envs import VAL_BATCH_FACTOR
from esper.training.launch_count import LaunchCounter
from esper.training.passes.batch_ops import PassOptions, train_batch, validate_fused
from esper.training.passes.host_batching import (
    _validate_rows,
    round_stores,
    validate_batched,
)
from esper.training.passes.slot_groups import HostBatch

LAYOUTS = ("host", "one_kind", "mixed", "late")
#: Most seeds an env of the ``late`` layout blends at once.
LATE_MAX_SEEDS = 3
MIXED_BLUEPRINTS = ("conv_heavy", "attention", "bottleneck")
#: Steps before timing (and the side-stream warm-up before capture, as torch asks).
WARMUP = 3
DEFAULT_STEPS = 30
#: Steps compared between eager and replay from the same state.
CHECK_STEPS = 3
#: A healthy [seed, host] gradient norm per slot, so the G2 gate passes.
HEALTHY_NORM = 0.5
COLUMNS = (
    "layout",
    "n_envs",
    "kinds",
    "per-env loop ms",
    "batched eager ms",
    "graph replay ms",
    "build ms",
    "eager launches",
    "eager / replay",
    "per-env / replay",
    "max |diff|",
)
VAL_COLUMNS = (
    "layout",
    "n_envs",
    "configs / env",
    "per-env ms",
    "stacked ms",
    "replay ms",
    "stacked / per-env",
    "max |diff|",
)


def parse_args(argv: list[str] | None) -> Any:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n-envs", type=C.csv_list(int), default=[16, 64])
    p.add_argument("--layouts", type=C.csv_list(str), default=list(LAYOUTS))
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = p.parse_args(argv)
    if args.quick:
        args.n_envs, args.steps = [4], 2
    return args


def _germinate(env: EnvState, slot: str, blueprint: str, stage: SeedStage) -> None:
    model = env.model
    assert model.germinate(
        slot, blueprint, GerminationStyle.LINEAR_ADD, 2, 1.0,
        seed_id=env.next_seed_id(), current_acc=50.0, initiator=Initiator.POLICY,
    )  # fmt: skip
    for step in range(50):
        if model.slot(slot).stage == stage:
            break
        if not model.advance(slot, initiator=Initiator.POLICY):
            model.apply_grad_norms([HEALTHY_NORM] * (2 * len(model.slot_ids)))
            model.tick(50.0 + step)
    assert model.slot(slot).stage == stage, f"{slot} did not reach {stage}"
    if stage == SeedStage.BLENDING:
        model.tick(60.0)  # alpha above 0: measurable by a counterfactual
    sync_seed_optimizers(env)


def grow(envs: Sequence[EnvState], layout: str) -> None:
    """Put the layout's seeds into the envs (see the module docstring)."""
    for i, env in enumerate(envs):
        slots = env.model.slot_ids
        if layout == "one_kind":
            _germinate(env, slots[0], "conv_heavy", SeedStage.BLENDING)
        elif layout == "mixed":
            at = i % len(slots)
            stage = SeedStage.TRAINING if i % (2 * len(slots)) < len(slots) else SeedStage.BLENDING
            _germinate(env, slots[at], MIXED_BLUEPRINTS[at % len(MIXED_BLUEPRINTS)], stage)
        elif layout == "late":
            for at in range(1 + i % LATE_MAX_SEEDS):
                blueprint = MIXED_BLUEPRINTS[at % len(MIXED_BLUEPRINTS)]
                _germinate(env, slots[at], blueprint, SeedStage.BLENDING)


def _envs(cfg: Any, spec: Any, layout: str) -> list[EnvState]:
    envs = EnvFactory(cfg, spec).create_round(0)
    grow(envs, layout)
    for env in envs:
        env.model.train()
        assert env.train_accum is not None
        env.train_accum = torch.zeros_like(env.train_accum)
    return envs


def _timed(fn: Callable[[], None], steps: int, device: torch.device) -> float:
    """Milliseconds per call, the device drained before and after."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync(device)
    return (time.perf_counter() - start) * 1e3 / steps


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _state(batch: HostBatch) -> list[torch.Tensor]:
    s = batch.store
    return [s.params, s.momentum, s.seed_params, s.seed_momentum]


def capture(step: Callable[[], None], device: torch.device) -> torch.cuda.CUDAGraph:
    """``step`` captured as one graph: warmed up on a side stream first, as torch asks."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def _configs(cfg: Any, envs: Sequence[EnvState]) -> Ablations:
    """The envs' alpha configurations as the trainer builds them (``HostEnvs.advance``)."""
    slots = envs[0].table.slots
    alphas = effective_alphas(slots)
    measurable = unavailable_reasons(slots.stage, alphas) == 0
    return ablations(alphas, measurable, factorial=cfg.run.counterfactual_factorial)


def _stacked_batch(envs: Sequence[EnvState], plan: Ablations) -> HostBatch:
    """The stacked validation batch of one store's envs (what ``validate_batched`` builds)."""
    stores = round_stores(envs)
    assert stores is not None and len(stores) == 1, "one host shape: one store"
    batch = HostBatch(stores[0], train=False, members=plan.env, alphas=plan.alphas)
    batch.set_modes()
    return batch


def measure_validation(args: Any, work: Workload, layout: str) -> dict[str, Any]:
    """Stacked against per-env validation of the same envs, timed by turns."""
    cfg, task, opts = work.cfg, work.task, work.opts
    n_envs = cfg.run.n_envs
    device = torch.device(args.device)
    envs = _envs(cfg, task.spec, layout)
    val = val_batches(
        task.val_x, task.val_y, cfg.task.batch_size * VAL_BATCH_FACTOR,
        limit=cfg.task.val_samples, device=device, channels_last=cfg.task.channels_last,
    )  # fmt: skip
    plan = _configs(cfg, envs)
    row: dict[str, Any] = {"layout": layout, "n_envs": n_envs}
    row["configs_per_env"] = len(plan.alphas) / n_envs

    def stacked() -> None:
        validate_batched(envs, val, plan.alphas, plan.first, opts)

    def per_env() -> None:
        validate_fused(envs, val, plan.alphas, plan.first, opts)

    stacked()
    per_env()
    times: dict[str, list[float]] = {"stacked": [], "per_env": []}
    for rep in range(args.steps):
        order = [("stacked", stacked), ("per_env", per_env)]
        for name, fn in order if rep % 2 == 0 else order[::-1]:
            times[name].append(_timed(fn, 1, device))
    row["val_stacked_ms"] = C.median(times["stacked"])
    row["val_per_env_ms"] = C.median(times["per_env"])
    a = validate_batched(envs, val, plan.alphas, plan.first, opts)
    b = validate_fused(envs, val, plan.alphas, plan.first, opts)
    row["val_max_abs_diff"] = max(
        (x.float() - y.float()).abs().max().item() for x, y in zip(a, b, strict=True)
    )
    if device.type == "cuda":
        _replay_validation(row, args, envs, plan, val, opts, device)
    return row


def _replay_validation(
    row: dict[str, Any], args: Any, envs: Sequence[EnvState], plan: Ablations, val: Any,
    opts: PassOptions, device: torch.device,
) -> None:  # fmt: skip
    """The stacked pass of one layout captured as a CUDA graph: replay time and its
    correct counts against the eager pass's."""
    batch = _stacked_batch(envs, plan)
    real = np.isin(np.arange(len(plan.alphas)), plan.first)
    out: list[Any] = []

    def step() -> None:
        out[:] = _validate_rows(batch, val, real, opts)

    try:
        with torch.no_grad():
            graph = capture(step, device)
    except Exception as exc:  # keep the eager figures: say why capture failed
        row["val_capture_error"] = f"{type(exc).__name__}: {exc}"
        return
    row["val_replay_ms"] = _timed(graph.replay, args.steps, device)
    graph.replay()
    replayed = [t.clone() for t in out]
    step()
    row["val_replay_max_abs_diff"] = max(
        (x - y).abs().max().item() for x, y in zip(replayed, out, strict=True)
    )


@dataclass(frozen=True)
class Workload:
    """The config, data and pass options of one env count (built once, used by every
    layout's train and validation measurements)."""

    cfg: Any
    task: Any
    opts: PassOptions

    @classmethod
    def of(cls, args: Any, n_envs: int) -> Workload:
        cfg = T.bench_config("synthetic_ref", n_envs=n_envs, level="off", threads=1,
                             device=args.device, quick=args.quick)  # fmt: skip
        opts = PassOptions(amp=cfg.run.amp, channels_last=cfg.task.channels_last,
                           grad_clip=cfg.host.grad_clip)  # fmt: skip
        return cls(cfg, load_task(cfg.task, seed=0), opts)


def measure(args: Any, work: Workload, layout: str) -> dict[str, Any]:
    cfg, task, opts = work.cfg, work.task, work.opts
    n_envs = cfg.run.n_envs
    device = torch.device(args.device)
    it = SharedBatchIterator(
        task.train_x, task.train_y, n_envs=n_envs, batch_size=cfg.task.batch_size, seed=0,
        samples_per_env=cfg.task.train_samples_per_env, device=device,
        channels_last=cfg.task.channels_last,
    )  # fmt: skip
    x, y = (t.clone() for t in next(iter(it.epoch_stacked(0))))
    row: dict[str, Any] = {"layout": layout, "n_envs": n_envs, "batch": list(x.shape[1:])}

    per_env = _envs(cfg, task.spec, layout)

    def loop() -> None:
        for i, env in enumerate(per_env):
            train_batch(env, x[i], y[i], opts, inject_nan=False)

    loop()
    row["per_env_ms"] = _timed(loop, args.steps, device)

    envs = _envs(cfg, task.spec, layout)
    stores = round_stores(envs)
    assert stores is not None and len(stores) == 1, "one host shape: one store"
    start = time.perf_counter()
    batch = HostBatch(stores[0])
    batch.set_modes()
    _sync(device)
    row["build_ms"] = (time.perf_counter() - start) * 1e3
    row["kinds"] = sum(len(k) for k in batch.kinds.values())

    def step() -> None:
        batch.train_batch(x, y, opts, None, last=True)

    step()
    with LaunchCounter(device=device.type) as counter:
        step()
    row["eager_launches"] = counter.tally.total()
    row["eager_ms"] = _timed(step, args.steps, device)
    if device.type != "cuda":
        return row

    try:
        graph = capture(step, device)
    except Exception as exc:  # keep the eager figures: say why capture failed
        row["capture_error"] = f"{type(exc).__name__}: {exc}"
        return row
    row["replay_ms"] = _timed(graph.replay, args.steps, device)
    saved = [t.clone() for t in _state(batch)]
    for _ in range(CHECK_STEPS):
        step()
    eager = [t.clone() for t in _state(batch)]
    for t, s in zip(_state(batch), saved, strict=True):
        t.copy_(s)
    for _ in range(CHECK_STEPS):
        graph.replay()
    _sync(device)
    row["max_abs_diff"] = max(
        (a - b).abs().max().item() if a.numel() else 0.0
        for a, b in zip(_state(batch), eager, strict=True)
    )
    return row


def table_row(r: dict[str, Any]) -> list[Any]:
    replay = r.get("replay_ms")
    return [
        r["layout"], r["n_envs"], r.get("kinds"), r["per_env_ms"], r.get("eager_ms"), replay,
        r.get("build_ms"), r.get("eager_launches"),
        C.ratio(r["eager_ms"], replay) if replay else None,
        C.ratio(r["per_env_ms"], replay) if replay else None,
        r.get("max_abs_diff"),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    info = C.machine_info(threads=1)
    C.print_machine(info)
    rows: list[dict[str, Any]] = []
    val_rows: list[dict[str, Any]] = []
    for n_envs in args.n_envs:
        work = Workload.of(args, n_envs)
        for layout in args.layouts:
            try:
                rows.append(measure(args, work, layout))
            except Exception as exc:  # one layout's failure must not cost the others
                rows.append({"layout": layout, "n_envs": n_envs, "per_env_ms": None,
                             "error": f"{type(exc).__name__}: {exc}"})  # fmt: skip
            print(rows[-1], flush=True)
            try:
                val_rows.append(measure_validation(args, work, layout))
            except Exception as exc:
                val_rows.append({"layout": layout, "n_envs": n_envs,
                                 "error": f"{type(exc).__name__}: {exc}"})  # fmt: skip
            print(val_rows[-1], flush=True)
    good = [r for r in rows if "error" not in r]
    C.print_table(
        f"Batched train step, eager against CUDA graph replay ({args.device}, ms per step "
        "of all envs)",
        COLUMNS,
        [table_row(r) for r in good],
    )
    good_val = [r for r in val_rows if "error" not in r]
    C.print_table(
        f"Validation, stacked against per env ({args.device}, ms per pass of all envs)",
        VAL_COLUMNS,
        [
            [r["layout"], r["n_envs"], r["configs_per_env"], r["val_per_env_ms"],
             r["val_stacked_ms"], r.get("val_replay_ms"),
             C.ratio(r["val_stacked_ms"], r["val_per_env_ms"]), r["val_max_abs_diff"]]
            for r in good_val
        ],
    )  # fmt: skip
    payload = {"benchmark": "cuda_graphs", "machine": info, "device": args.device,
               "steps": args.steps, "quick": args.quick, "rows": rows,
               "validation": val_rows}  # fmt: skip
    C.write_results(args.out, "cuda_graphs", payload)
    return 0 if len(good) == len(rows) and len(good_val) == len(val_rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
