"""EPS of one process vs K ranks (torchrun, gloo) at the same total env count.

Variants, alternated per repeat: ``1 x (K*N)`` (one process, ``esper train --envs
K*N``) and ``K x N`` (``torchrun --standalone --nproc_per_node=K -m esper train --envs
N``). EPS is the run's env-steps over its training wall time, read from the
``run_finished`` event (rank 0 reports all ranks' env-steps). Each process runs one
intra-op thread (torchrun's default), so the comparison is processes, not threads.
On a machine with fewer free cores than ranks, the ranks only compete for the same
cores: read the load average in the machine block.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import polars as pl
from _common import (
    alternate,
    base_parser,
    machine_info,
    median,
    print_machine,
    print_table,
    ratio,
    write_results,
)

#: A launch that takes longer than this is a hang, not a measurement.
LAUNCH_TIMEOUT_S = 1800


def _command(ranks: int, envs_per_rank: int, args: Any, run_id: str, root: Path) -> list[str]:
    train = [
        "-m", "esper", "train", "--task", args.task, "--envs", str(envs_per_rank),
        "--rounds", str(args.rounds), "--episode-length", str(args.episode_length),
        "--telemetry-dir", str(root), "--run-id", run_id, "--no-progress",
    ]  # fmt: skip
    if ranks == 1:
        return [sys.executable, *train]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*launcher, f"--nproc_per_node={ranks}", *train]


def _measure(ranks: int, args: Any, repeat: int, root: Path) -> dict[str, Any]:
    run_id = f"r{ranks}-{repeat}"
    envs = args.total_envs // ranks
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        _command(ranks, envs, args, run_id, root),
        capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=env, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{run_id} failed:\n{proc.stderr[-3000:]}")
    finished = pl.read_parquet(root / run_id / "events" / "type=run_finished" / "*" / "*.parquet")
    row = finished.row(0, named=True)
    return {"ranks": ranks, "envs_per_rank": envs, "eps": row["eps"], "wall_s": row["wall_s"],
            "env_steps": row["env_steps"]}  # fmt: skip


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--task", default="digits")
    parser.add_argument("--ranks", type=int, default=2, help="K (default 2)")
    parser.add_argument("--total-envs", type=int, default=4, help="K*N (default 4)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--episode-length", type=int, default=10)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.episode_length, args.total_envs = 1, 3, 2
    repeats = args.repeats or (1 if args.quick else 3)
    if args.total_envs % args.ranks:
        raise SystemExit(f"--total-envs {args.total_envs} is not a multiple of --ranks")
    samples: dict[int, list[dict[str, Any]]] = {1: [], args.ranks: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            for ranks in alternate([1, args.ranks], repeat):
                samples[ranks].append(_measure(ranks, args, repeat, Path(tmp)))
    eps = {r: median([s["eps"] for s in v]) for r, v in samples.items()}
    info = machine_info(threads=1)
    rows = [[f"{r} x {args.total_envs // r}", eps[r], len(samples[r])] for r in samples]
    print_table("EPS, same total envs", ["ranks x envs", "median EPS", "repeats"], rows)
    print(f"speed-up {args.ranks} ranks / 1 process: {ratio(eps[args.ranks], eps[1]):.2f}")
    print_machine(info)
    write_results(
        args.out,
        "distributed",
        {
            "config": {k: v for k, v in vars(args).items() if k != "out"},
            "eps": {str(r): v for r, v in eps.items()},
            "speedup": ratio(eps[args.ranks], eps[1]),
            "samples": samples,
            "machine": info,
        },
    )


if __name__ == "__main__":
    main()
