"""``esper evaluate CHECKPOINT``: a trained policy, frozen, on the hosts a config names.

Deterministic (or, with ``--sample``, sampled) actions and no updates; the same loop,
telemetry and analysis as a training run. Torch is imported only inside ``run``.
"""

from __future__ import annotations

import argparse

from esper.commands.train import add_set_flag, build_config
from esper.errors import UserError

HELP = (
    "evaluate a trained policy, frozen (deterministic or, with --sample, sampled actions; "
    "no updates), with telemetry"
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{HELP}. The run is paired env by env with any run of the same --seed and config "
        "(esper analyze compare): e.g. train on part of a host family, evaluate on held-out "
        "members against esper train --policy eager|static on the same config."
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a PPO run's checkpoint.pt")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="the hosts to evaluate on, TOML or JSON (default: the checkpoint's own config)",
    )
    parser.add_argument("--rounds", type=int, metavar="N", help="rounds (episodes per env)")
    parser.add_argument("--seed", type=int, metavar="S", help="run seed: hosts and data order")
    parser.add_argument("--envs", type=int, metavar="N", help="parallel envs")
    parser.add_argument("--episode-length", type=int, metavar="T", help="steps per episode")
    parser.add_argument("--telemetry-dir", metavar="DIR", help="parent of the run directory")
    parser.add_argument(
        "--run-id",
        metavar="ID",
        help="run directory name (default: <trained run>-eval-s<S>-<time>)",
    )
    parser.add_argument(
        "--telemetry-level", choices=["off", "lifecycle", "normal", "debug"], help="events written"
    )
    parser.add_argument("--device", help="cpu | cuda | cuda:K")
    parser.add_argument(
        "--sample",
        action="store_true",
        help="draw each action from the policy (seeded by --seed) instead of its most likely "
        "valid one: how the policy behaved in training",
    )
    add_set_flag(parser)
    parser.add_argument(
        "--report",
        nargs="?",
        const="",
        metavar="PATH",
        help="after the run, write the HTML report (default PATH: <run dir>/report.html)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    import os

    if not os.path.isfile(args.checkpoint):
        raise UserError(f"checkpoint not found: {args.checkpoint}")
    if args.rounds is not None and args.rounds < 1:
        raise UserError(f"--rounds must be >= 1, got {args.rounds}")
    base = None
    if not args.config:
        from esper.config import with_overrides
        from esper.training.loop.checkpoint import checkpoint_config  # imports torch

        # the trained run's id is taken: the evaluation is a run of its own
        base = with_overrides(checkpoint_config(args.checkpoint), {"run.run_id": ""})
    cfg = build_config(args, None, base)
    if cfg.run.run_id:
        from esper.telemetry.paths import validate_run_id

        validate_run_id(cfg.run.run_id)
    from esper.commands.train_ui import run_evaluation  # imports torch

    return run_evaluation(cfg, args)
