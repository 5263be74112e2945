"""The CLI's subcommand registry.

Each command lives in a module that is cheap to import (no torch at import time) and
exposes ``configure_parser(parser) -> None`` and ``run(args) -> int``. A module serving
several commands may instead expose ``configure_<name>_parser`` and ``run_<name>``
(``<name>`` with dashes as underscores); the parsed namespace always carries
``args.command``. Modules are imported lazily when the parser is built, so a missing
optional command module only disables that command (with a warning).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Final, NamedTuple

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


class CommandSpec(NamedTuple):
    name: str
    module: str
    help: str


COMMANDS: Final = (
    CommandSpec(
        "train",
        "esper.commands.train",
        "train with vectorized PPO, or run a baseline policy (--policy)",
    ),
    CommandSpec(
        "heuristic", "esper.commands.heuristic", "the same as: esper train --policy heuristic"
    ),
    CommandSpec(
        "evaluate",
        "esper.commands.evaluate",
        "evaluate a trained policy, frozen (deterministic actions, no updates), with telemetry",
    ),
    CommandSpec(
        "telemetry-demo",
        "esper.commands.demo",
        "write a synthetic run through the real telemetry pipeline",
    ),
    CommandSpec("schemas", "esper.commands.schemas", "regenerate or check schemas/"),
    CommandSpec(
        "runs", "esper.commands.runs", "list the runs under telemetry directories (--json)"
    ),
    CommandSpec(
        "watch",
        "esper.commands.watch",
        "live terminal view of a run (progress, EPS, reward, seeds, rollbacks)",
    ),
    CommandSpec(
        "serve",
        "esper.commands.serve",
        "serve the runs' catalogue and reports in a browser on localhost (live runs reload)",
    ),
    CommandSpec(
        "export",
        "esper.commands.export",
        "export runs as TensorBoard event files (optional extra: tensorboard)",
    ),
)

#: ``esper analyze ...`` hands every remaining argument to this module's ``main``.
ANALYZE: Final = CommandSpec(
    "analyze", "esper_analysis.cli", "analyse telemetry runs (counts, baselines, reports)"
)


class CommandUnavailable(Exception):
    """The command's own module is not installed/written (not an import error inside it)."""


def import_command_module(spec: CommandSpec) -> ModuleType:
    try:
        return importlib.import_module(spec.module)
    except ModuleNotFoundError as exc:
        if exc.name == spec.module:
            raise CommandUnavailable(f"module {spec.module} not found") from None
        raise


def command_functions(spec: CommandSpec, module: ModuleType) -> tuple[Configure, Run]:
    """The (configure, run) pair of ``spec``, preferring command-specific names."""
    suffix = spec.name.replace("-", "_")
    configure = getattr(module, f"configure_{suffix}_parser", None) or getattr(
        module, "configure_parser", None
    )
    run = getattr(module, f"run_{suffix}", None) or getattr(module, "run", None)
    if configure is None or run is None:
        raise CommandUnavailable(
            f"module {spec.module} defines no configure_parser/run for {spec.name!r}"
        )
    return configure, run
