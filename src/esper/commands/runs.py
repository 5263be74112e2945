"""``esper runs [DIR ...]``: the run catalogue of one or more telemetry directories."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from esper_analysis.catalogue import RunEntry

HELP = "list the runs under telemetry directories (status, task, rounds, EPS, reward)"
DEFAULT_DIR: Final = "runs"
#: Table columns for people (JSON has every field, including ``path`` and ``error``).
_TEXT_COLUMNS: Final = {
    "run_id": "id",
    "status": "status",
    "task": "task",
    "policy": "policy",
    "rounds": "rounds",
    "env_steps": "env-steps",
    "eps": "EPS",
    "final_mean_reward": "final mean reward",
    "parent_run_id": "parent run",
    "started": "started (UTC)",
}
_PIPE_WIDTH: Final = 160


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dirs",
        nargs="*",
        metavar="DIR",
        default=[DEFAULT_DIR],
        help=f"telemetry directory or run directory, several allowed (default: {DEFAULT_DIR})",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON list instead of a table (default: off)"
    )


def run(args: argparse.Namespace) -> int:
    from esper_analysis.catalogue import catalogue
    from esper_analysis.result import jsonable

    entries = catalogue(args.dirs)
    if args.json:
        import dataclasses

        rows = [dataclasses.asdict(e) for e in entries]
        sys.stdout.write(json.dumps(jsonable(rows), indent=2, allow_nan=False) + "\n")
        return 0
    _print_table(entries, args.dirs)
    return 0


def _print_table(entries: list[RunEntry], dirs: list[str]) -> None:
    from esper_analysis.tables import format_value
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else _PIPE_WIDTH)
    if not entries:
        console.print(f"no runs under {', '.join(dirs)}")
        return
    table = Table(header_style="bold", title=f"{len(entries)} run(s) under {', '.join(dirs)}")
    for key, title in _TEXT_COLUMNS.items():
        numeric = key in {"rounds", "env_steps", "eps", "final_mean_reward"}
        table.add_column(title, justify="right" if numeric else "left")
    for e in entries:
        cells = []
        for key in _TEXT_COLUMNS:
            value = getattr(e, key)
            if key == "rounds" and e.rounds_planned is not None:
                value = f"{format_value(e.rounds)}/{e.rounds_planned}"
            cells.append(format_value(value))
        table.add_row(*cells)
    console.print(table)
    for e in entries:
        if e.error:
            console.print(f"[yellow]{e.run_id}: {e.error}[/yellow]")
