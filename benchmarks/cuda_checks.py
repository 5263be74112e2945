"""Checks that only a GPU can answer: syncs CUDA itself reports, AMP, a kernel profile.

- ``syncs``: short training runs (per-env and batched) under
  ``torch.cuda.set_sync_debug_mode("warn")``: every synchronising CUDA call warns, and
  the warnings per env-step are counted by where they came from. The one sanctioned
  transfer per phase (``host_copy``) lifts the mode for itself, so the goal is 0.
- ``amp``: a short run with ``--amp bf16`` and one with ``--amp fp16`` (GradScaler).
- ``profile``: ``torch.profiler`` over a few batched steps: the top CUDA kernels and CPU
  ops by time, and how much of the wall time the GPU was idle between kernels.

    python benchmarks/cuda_checks.py syncs amp profile --device cuda
    python benchmarks/cuda_checks.py syncs amp --device cpu --quick   # the plumbing only
"""

from __future__ import annotations

import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _trainer as T
import torch

from esper.config import with_overrides
from esper.training.run import train

CHECKS = ("syncs", "amp", "profile")
#: Kernels and CPU ops kept in the profile summary.
TOP = 20


def _config(args: Any, **overrides: Any) -> Any:
    cfg = T.bench_config(
        "synthetic_ref", n_envs=args.n_envs, level="off", threads=1, device=args.device,
        quick=args.quick,
    )  # fmt: skip
    return with_overrides(cfg, {"run.episode_length": args.steps, "run.rounds": 1, **overrides})


def check_syncs(args: Any) -> dict[str, Any]:
    """Synchronising CUDA calls per env-step, by source line (after a warm-up round)."""
    out: dict[str, Any] = {}
    for batched in (False, True):
        cfg = _config(args, **{"run.batch_envs": batched})
        data = T.load_data(cfg)
        train(with_overrides(cfg, {"run.episode_length": 2}), data=data)  # warm-up
        where: Counter[str] = Counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if args.device.startswith("cuda"):
                torch.cuda.set_sync_debug_mode("warn")
            try:
                result = train(cfg, data=data)
            finally:
                if args.device.startswith("cuda"):
                    torch.cuda.set_sync_debug_mode(0)
        for w in caught:
            if "synchroniz" in str(w.message):
                where[f"{Path(w.filename).name}:{w.lineno}"] += 1
        steps = result.env_steps
        out["batched" if batched else "trainer"] = {
            "env_steps": steps,
            "syncs": sum(where.values()),
            "syncs_per_env_step": sum(where.values()) / steps,
            "where": dict(where.most_common()),
        }
    return out


def check_amp(args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for amp in ("bf16", "fp16"):
        cfg = _config(args, **{"run.amp": amp, "run.episode_length": 3})
        t0 = time.perf_counter()
        try:
            result = train(cfg, data=T.load_data(cfg))
            out[amp] = {"ok": True, "eps": result.eps, "seconds": time.perf_counter() - t0}
        except Exception as exc:  # the point is to see it fail, not to stop the script
            out[amp] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return out


def check_profile(args: Any) -> dict[str, Any]:
    """A few batched steps under torch.profiler (after a warm-up round)."""
    from torch.profiler import ProfilerActivity, profile

    cfg = _config(args, **{"run.batch_envs": True})
    data = T.load_data(cfg)
    train(with_overrides(cfg, {"run.episode_length": 2}), data=data)  # warm-up
    activities = [ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        train(cfg, data=data)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
    wall_us = (time.perf_counter() - t0) * 1e6
    events = prof.key_averages()
    kernels = [e for e in events if getattr(e, "device_time_total", 0) > 0]
    kernels.sort(key=lambda e: e.device_time_total, reverse=True)
    cpu_ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    busy_us = _busy_us(prof)
    return {
        "wall_us": wall_us,
        "gpu_busy_us": busy_us,
        "gpu_idle_fraction": 1.0 - busy_us / wall_us if wall_us > 0 else None,
        "kernel_launches": sum(e.count for e in kernels),
        "top_kernels": [
            {"name": e.key[:80], "count": e.count, "device_us": e.device_time_total}
            for e in kernels[:TOP]
        ],
        "top_cpu_ops": [
            {"name": e.key[:80], "count": e.count, "self_cpu_us": e.self_cpu_time_total}
            for e in cpu_ops[:TOP]
        ],
    }


def _busy_us(prof: Any) -> float:
    """Union of the device kernels' intervals (the GPU's busy time)."""
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if getattr(e, "device_type", None) is not None
        and str(e.device_type).endswith("CUDA")
        and e.time_range.end > e.time_range.start
    )
    busy, cur_start, cur_end = 0.0, None, None
    for start, end in spans:
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        busy += cur_end - cur_start
    return busy


def main(argv: list[str] | None = None) -> int:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("checks", nargs="+", choices=CHECKS)
    p.add_argument("--device", default="cuda")
    p.add_argument("--n-envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=5, help="episode length of the checked runs")
    args = p.parse_args(argv)
    info = C.machine_info(threads=1)
    payload: dict[str, Any] = {"benchmark": "cuda_checks", "machine": info, "device": args.device}
    payload["torch_cuda"] = torch.version.cuda
    runners = {"syncs": check_syncs, "amp": check_amp, "profile": check_profile}
    for name in args.checks:
        t0 = time.perf_counter()
        payload[name] = runners[name](args)
        print(f"{name} ({time.perf_counter() - t0:.0f} s): {payload[name]}", flush=True)
        C.write_results(args.out, "cuda_checks", payload)  # keep what is done so far
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
