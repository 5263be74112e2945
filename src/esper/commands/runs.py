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
    import polars as pl
    from esper_analysis.tables import console_for, format_value, rich_tables

    console = console_for(sys.stdout)
    if not entries:
        console.print(f"no runs under {', '.join(dirs)}")
        return
    rows = []
    for e in entries:
        row = {title: getattr(e, key) for key, title in _TEXT_COLUMNS.items()}
        if e.rounds_planned is not None:
            row["rounds"] = f"{format_value(e.rounds)}/{e.rounds_planned}"
        rows.append(row)
    numeric = {"env-steps": pl.Int64, "EPS": pl.Float64, "final mean reward": pl.Float64}
    schema = {title: numeric.get(title, pl.String) for title in _TEXT_COLUMNS.values()}
    frame = pl.DataFrame(
        [{k: v if k in numeric or v is None else str(v) for k, v in r.items()} for r in rows],
        schema=schema,
    )
    title = f"{len(entries)} run(s) under {', '.join(dirs)}"
    for number, table in enumerate(
        rich_tables(title, frame, len(entries), width=console.width, keys=["id"])
    ):
        if number:
            console.print()
        console.print(table)
    for e in entries:
        if e.error:
            console.print(f"[yellow]{e.run_id}: {e.error}[/yellow]")
