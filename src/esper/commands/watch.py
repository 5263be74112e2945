"""``esper watch RUN``: live terminal view of a run, from its directory alone."""

from __future__ import annotations

import argparse
import sys

HELP = "live terminal view of a run (progress, EPS, reward, seeds, rollbacks, writer)"
#: Refresh bounds: at most 1 s (the view's promise); at least 0.1 s (no busy reading).
MIN_REFRESH_S = 0.1
#: How long ``watch`` waits for a run that has not started yet.
DEFAULT_WAIT_S = 60.0


def _interval(text: str) -> float:
    from esper_analysis.watch import MAX_REFRESH_S

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not MIN_REFRESH_S <= value <= MAX_REFRESH_S:
        raise argparse.ArgumentTypeError(
            f"{value} is outside {MIN_REFRESH_S}..{MAX_REFRESH_S} seconds"
        )
    return value


def _wait(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text}")
    return value


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Live view of a run read from its directory (manifest and closed Parquet parts; "
        "never the trainer). Exits when the run is no longer running; a finished, failed "
        "or crashed run is shown once."
    )
    parser.add_argument("run", metavar="RUN", help="run directory (<telemetry_dir>/<run_id>)")
    parser.add_argument(
        "--once", action="store_true", help="print the current state once and exit (default: live)"
    )
    parser.add_argument(
        "--wait",
        type=_wait,
        default=DEFAULT_WAIT_S,
        metavar="S",
        help="seconds to wait for a run directory that does not exist yet, e.g. a watcher "
        f"started just before the training (default: {DEFAULT_WAIT_S:g}; 0: do not wait)",
    )
    parser.add_argument(
        "--interval",
        type=_interval,
        default=1.0,
        metavar="S",
        help=f"refresh interval in seconds, {MIN_REFRESH_S}..1 (default: 1.0)",
    )


def run(args: argparse.Namespace) -> int:
    from esper_analysis.tables import console_for
    from esper_analysis.watch import watch

    console = console_for(sys.stdout)
    watch(args.run, console, once=args.once, refresh_s=args.interval, wait_s=args.wait)
    return 0
