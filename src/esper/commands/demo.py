"""``esper telemetry-demo``: a synthetic run through the real hub and writer."""

from __future__ import annotations

import argparse
from pathlib import Path

from esper.core.enums import TelemetryLevel


def _level(value: str) -> TelemetryLevel:
    try:
        return TelemetryLevel.parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a synthetic run of every event type through the real hub and Parquet "
        "writer (no torch, no training): a quick way to see the telemetry layout and try "
        "the analyses."
    )
    parser.add_argument(
        "--telemetry-dir",
        type=Path,
        required=True,
        metavar="DIR",
        help="parent of the run directory <DIR>/<run id> (required)",
    )
    parser.add_argument(
        "--run-id", default=None, metavar="ID", help="run id (default: demo-<timestamp>)"
    )
    parser.add_argument(
        "--envs", type=int, default=4, metavar="N", help="environments (default: 4)"
    )
    parser.add_argument("--rounds", type=int, default=3, metavar="R", help="rounds (default: 3)")
    parser.add_argument(
        "--steps", type=int, default=10, metavar="T", help="steps per episode (default: 10)"
    )
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default: 0)")
    parser.add_argument(
        "--level",
        type=_level,
        default=TelemetryLevel.NORMAL,
        metavar="LEVEL",
        help="events written: off | lifecycle | normal | debug (default: normal)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing run with the same id (default: refuse)",
    )


def run(args: argparse.Namespace) -> int:
    import time

    from esper.telemetry.demo import DemoSettings, run_demo

    run_id = args.run_id or time.strftime("demo-%Y%m%d-%H%M%S")
    settings = DemoSettings(
        envs=args.envs, rounds=args.rounds, steps=args.steps, seed=args.seed, level=args.level
    )
    result = run_demo(args.telemetry_dir, run_id, settings, force=args.force)
    if args.level == TelemetryLevel.OFF:
        print(f"telemetry level off: nothing written ({result.events_emitted} events built)")
        return 0
    print(f"run directory: {result.run_dir}")
    width = max(len(tag) for tag in result.counts)
    for tag, count in result.counts.items():
        print(f"  {tag:<{width}}  {count:>7}")
    print(f"  {'total':<{width}}  {sum(result.counts.values()):>7}")
    return 0
