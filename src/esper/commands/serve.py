"""``esper serve [DIR]``: the run catalogue and each run's report in a browser, on
localhost only, reloading while a run is live (:mod:`esper_analysis.serve`)."""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path

from esper.commands.serve_defaults import DEFAULT_PORT, DEFAULT_REFRESH_S, HOST
from esper.errors import UserError

HELP = "serve the runs' catalogue and reports in a browser on localhost (live runs reload)"
DEFAULT_DIR = "runs"
#: What a port argument may be (0: any free port).
MAX_PORT = 65535


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be 0..{MAX_PORT}, got {value}")
    return value


def _seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 second, got {value}")
    return value


def configure_parser(parser: argparse.ArgumentParser) -> None:

    parser.description = (
        f"{HELP}. Binds {HOST} only: other machines cannot connect (use an SSH tunnel, "
        f"ssh -L {DEFAULT_PORT}:localhost:{DEFAULT_PORT} HOST, to look from elsewhere)."
    )
    parser.add_argument(
        "dir",
        nargs="?",
        default=DEFAULT_DIR,
        metavar="DIR",
        help=f"telemetry directory holding the runs (default: {DEFAULT_DIR})",
    )
    parser.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        metavar="N",
        help=f"port on {HOST} (default: {DEFAULT_PORT}; 0: any free port)",
    )
    parser.add_argument(
        "--refresh",
        type=_seconds,
        default=DEFAULT_REFRESH_S,
        metavar="S",
        help=f"seconds between reloads of a live run's page (default: {DEFAULT_REFRESH_S})",
    )


def run(args: argparse.Namespace) -> int:
    from esper_analysis.loader import is_run_dir
    from esper_analysis.serve import make_server

    root = Path(args.dir)
    if not root.is_dir():
        raise UserError(f"directory {root} does not exist")
    if is_run_dir(root):
        raise UserError(f"{root} is a run directory: serve the directory that holds it")
    try:
        server = make_server(root, port=args.port, refresh_s=args.refresh)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UserError(
                f"port {args.port} is in use: pass --port N (or --port 0 for any free port)"
            ) from None
        raise UserError(f"cannot serve on port {args.port}: {exc}") from None
    host, port = server.server_address[:2]
    print(f"serving {root} at http://{host!s}:{port}/ (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0
