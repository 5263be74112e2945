"""``esper heuristic``: ``esper train --policy heuristic`` under its historical name."""

from __future__ import annotations

import argparse

from esper.commands.train import configure_parser as _configure
from esper.commands.train import run_with_kind
from esper.core.enums import PolicyKind

HELP = "run the heuristic baseline policy: the same as esper train --policy heuristic"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    _configure(parser)


def run(args: argparse.Namespace) -> int:
    return run_with_kind(args, PolicyKind.HEURISTIC)
