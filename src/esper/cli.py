"""The ``esper`` command line (also ``python -m esper``).

Building the parser imports only the command modules, which are torch-free at import
time; torch is imported by the commands that train, when they run. Errors meant for
the user (:class:`esper.errors.UserError`) print one ``error:`` line and exit with their
code; Ctrl-C exits 130. ``esper analyze ...`` forwards its arguments unchanged to the
analysis layer's CLI.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Final

from esper import __version__
from esper.commands import (
    ANALYZE,
    COMMANDS,
    CommandUnavailable,
    command_functions,
    import_command_module,
)
from esper.errors import EsperError, UserError
from esper.suggest import did_you_mean, parse_args_suggesting

PROG: Final = "esper"
EXIT_INTERRUPTED: Final = 130
EXIT_FAILURE: Final = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Morphogenetic networks steered by vectorized PPO, with Parquet telemetry.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for spec in COMMANDS:
        try:
            configure, run = command_functions(spec, import_command_module(spec))
        except CommandUnavailable as exc:
            print(f"warning: command {spec.name!r} unavailable: {exc}", file=sys.stderr)
            continue
        command_parser = sub.add_parser(spec.name, help=spec.help, description=spec.help)
        configure(command_parser)
        command_parser.set_defaults(func=run)
    sub.add_parser(
        ANALYZE.name,
        help=ANALYZE.help,
        description=f"{ANALYZE.help}; see `{PROG} {ANALYZE.name} --help`",
        add_help=False,
    )
    return parser


def _run_analyze(argv: list[str]) -> int:
    try:
        module = import_command_module(ANALYZE)
    except CommandUnavailable as exc:
        raise UserError(f"`{PROG} {ANALYZE.name}` is unavailable: {exc}") from None
    return int(module.main(argv, prog=f"{PROG} {ANALYZE.name}"))


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == ANALYZE.name:
        return _run_analyze(argv[1:])
    parser = build_parser()
    names = [spec.name for spec in COMMANDS] + [ANALYZE.name]
    if argv and not argv[0].startswith("-") and argv[0] not in names:
        parser.error(
            f"unknown command {argv[0]!r} (choose from {', '.join(names)})"
            + did_you_mean(argv[0], names)
        )
    args = parse_args_suggesting(parser, argv)
    return int(args.func(args))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (the console script passes it to exit)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except EsperError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return EXIT_FAILURE
