"""``esper export tensorboard RUN [RUN ...] -o DIR``: runs as TensorBoard event files."""

from __future__ import annotations

import argparse
import sys

HELP = "export runs to other tools (tensorboard)"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    tb = sub.add_parser(
        "tensorboard",
        help="per-round and per-update scalars as TensorBoard event files",
        description="Write each run's scalars (round/*: reward, accuracy, EPS; ppo/*; "
        "reward/* components; seeds/* by final stage) to DIR/<run id>/, step = round. "
        "Needs the optional extra; from the Esper checkout: "
        'python -m pip install -c constraints.txt -e ".[tensorboard]".',
    )
    tb.add_argument("runs", nargs="+", metavar="RUN", help="run directory, several allowed")
    tb.add_argument(
        "-o", "--output", required=True, metavar="DIR", help="TensorBoard log directory (required)"
    )
    tb.add_argument(
        "--force",
        action="store_true",
        help="replace event files an earlier export left there (default: refuse)",
    )


def run(args: argparse.Namespace) -> int:
    import warnings

    from esper_analysis.export_tb import export_tensorboard
    from esper_analysis.loader import load_run

    runs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = [load_run(path) for path in args.runs]
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    for run_ in runs:
        target = export_tensorboard(run_, args.output, force=args.force)
        print(f"run {run_.run_id} ({run_.status.value}) exported to {target}")
    print(f"view with: tensorboard --logdir {args.output}")
    return 0
