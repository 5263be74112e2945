"""``esper runs [DIR ...]``: the run catalogue of one or more telemetry directories."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from esper_analysis.catalogue import RunEntry

HELP = "list the runs under telemetry directories (status, task, seed, rounds, accuracy)"
DEFAULT_DIR: Final = "runs"
#: Table columns for people (JSON has every field, including ``path`` and ``error``).
_TEXT_COLUMNS: Final = {
    "run_id": "id",
    "status": "status",
    "task": "task",
    "policy": "policy",
    "seed": "seed",
    "envs": "envs",
    "family": "host family",
    "rounds": "rounds",
    "env_steps": "env-steps",
    "eps": "EPS",
    "final_mean_reward": "final mean reward",
    "final_accuracy": "final acc %",
    "lineage": "lineage",
    "started": "started (UTC)",
}
#: Columns left out of the table when no run has a value there (no family, no resume).
_WHEN_USED: Final = ("host family", "lineage")
_NUMERIC: Final = {
    "seed": "Int64",
    "envs": "Int64",
    "env-steps": "Int64",
    "EPS": "Float64",
    "final mean reward": "Float64",
    "final acc %": "Float64",
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
        if e.rounds_planned is not None:  # through the lineage: a resumed run's parent too
            done = e.rounds_total if e.rounds_total is not None else e.rounds
            row["rounds"] = f"{format_value(done)}/{e.rounds_planned}"
        row["lineage"] = e.lineage or None
        rows.append(row)
    shown = [t for t in _TEXT_COLUMNS.values() if t not in _WHEN_USED or any(r[t] for r in rows)]
    schema = {t: getattr(pl, _NUMERIC[t]) if t in _NUMERIC else pl.String for t in shown}
    frame = pl.DataFrame(
        [{t: r[t] if t in _NUMERIC or r[t] is None else str(r[t]) for t in shown} for r in rows],
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
            console.print(f"{e.run_id}: {e.error}", style="yellow", markup=False)
