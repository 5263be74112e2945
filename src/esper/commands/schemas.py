"""``esper schemas``: regenerate ``schemas/`` from the event Structs, or check it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure_parser(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the files")
    mode.add_argument(
        "--check", action="store_true", help="exit 1 listing files that differ from the code"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="schemas directory (default: schemas/ of this checkout)",
    )


def run(args: argparse.Namespace) -> int:
    from esper.telemetry import schemas

    root: Path = args.dir or schemas.default_schemas_dir()
    if args.write:
        changed = schemas.write(root)
        for name in changed:
            print(f"updated {root / name}")
        print(f"{root}: {len(changed)} file(s) changed")
        return 0
    problems = schemas.check(root)
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        print(
            f"{root} is out of date ({len(problems)} difference(s)); "
            "run `esper schemas --write` and review the diff",
            file=sys.stderr,
        )
        return 1
    print(f"{root}: up to date")
    return 0
