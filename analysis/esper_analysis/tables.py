"""Rendering analysis results for people: rich tables in a terminal, HTML in the report.

Terminal tables never shrink a cell: a table wider than the console is split into
several tables of whole columns, each repeating the leading identifier columns
(:data:`KEY_COLUMNS`), so every number stays complete at 80 columns.
"""

from __future__ import annotations

import argparse
import html
import math
from typing import Any, Final

import polars as pl
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from esper_analysis.errors import AnalysisError
from esper_analysis.result import AnalysisResult

DEFAULT_MAX_ROWS: Final = 40
#: Identifier columns: when they lead a table that must be split, every part repeats them.
KEY_COLUMNS: Final = frozenset(
    {"run_id", "rank", "round", "env", "step", "type", "component", "op", "head", "blueprint"}
    | {"slot", "seed_id"}
)
#: Rich's box per column (a space each side and one rule), and the closing rule.
_COLUMN_CHROME: Final = 3
_TABLE_CHROME: Final = 1


def max_rows_arg(text: str) -> int:
    """``--max-rows`` as argparse parses it: a whole number >= 1 (argparse exits 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def format_value(value: Any) -> str:
    """Compact, readable cell text: 4 significant digits, booleans as yes/no."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if value == 0:  # also -0.0, which "g" formatting prints as "-0"
            return "0"
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(format_value(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {format_value(v)}" for k, v in value.items())
    return str(value)


def rich_table(title: str, frame: pl.DataFrame, max_rows: int = DEFAULT_MAX_ROWS) -> Table:
    """One rich table of the whole frame (as wide as it needs; see :func:`rich_tables`)."""
    return rich_tables(title, frame, max_rows, width=None)[0]


def rich_tables(
    title: str, frame: pl.DataFrame, max_rows: int = DEFAULT_MAX_ROWS, *, width: int | None
) -> list[Table]:
    """The frame as rich tables that each fit ``width`` cells (one table if None or if it fits).

    Cells are never cut: columns go whole into the part that has room for them.
    """
    shown = frame.head(max_rows)
    cells = [[format_value(v) for v in row] for row in shown.iter_rows()]
    widths = [
        max([cell_len(name)] + [cell_len(row[i]) for row in cells])
        for i, name in enumerate(frame.columns)
    ]
    groups = [list(range(frame.width))] if width is None else _column_groups(frame, widths, width)
    tables = []
    for number, group in enumerate(groups, start=1):
        part = f" ({number}/{len(groups)})" if len(groups) > 1 else ""
        table = Table(title=title + part, title_justify="left", header_style="bold")
        for i in group:
            fits = width is None or widths[i] + _COLUMN_CHROME + _TABLE_CHROME <= width
            table.add_column(
                frame.columns[i],
                justify="right" if frame.dtypes[i].is_numeric() else "left",
                min_width=widths[i] if fits else None,
                no_wrap=fits,
                overflow="fold",  # only a text cell wider than the console: wrapped, not cut
            )
        for row in cells:
            table.add_row(*(row[i] for i in group))
        tables.append(table)
    if frame.height > max_rows:
        tables[-1].caption = f"{frame.height - max_rows} more rows (use --json for all)"
    return tables


def _column_groups(frame: pl.DataFrame, widths: list[int], width: int) -> list[list[int]]:
    """Pack the columns into parts no wider than ``width``, each led by the key columns."""
    keys: list[int] = []
    for i, name in enumerate(frame.columns):
        if name not in KEY_COLUMNS:
            break
        keys.append(i)
    key_width = _TABLE_CHROME + sum(widths[i] + _COLUMN_CHROME for i in keys)
    if key_width > width // 2:  # keys too wide to repeat: plain column packing
        keys, key_width = [], _TABLE_CHROME
    rest = [i for i in range(frame.width) if i not in keys]
    groups: list[list[int]] = []
    current, used = list(keys), key_width
    for i in rest:
        need = widths[i] + _COLUMN_CHROME
        if used + need > width and len(current) > len(keys):
            groups.append(current)
            current, used = list(keys), key_width
        current.append(i)
        used += need
    groups.append(current)
    return groups


def print_result(
    result: AnalysisResult,
    console: Console,
    *,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> None:
    """Summary lines, then every table as rich tables (its terminal columns only)."""
    if max_rows < 1:  # callers that parse --max-rows themselves
        raise AnalysisError(f"--max-rows must be >= 1, got {max_rows}")
    for key, value in result.summary().items():
        console.print(f"[bold]{key}[/bold]: {format_value(value)}")
    for key, title, frame in result.tables():
        if key in result.TEXT_SKIP:
            continue
        console.print()
        if frame.height == 0:
            console.print(f"[bold]{title}[/bold]: none")
            continue
        columns = [c for c in result.TEXT_COLUMNS.get(key, frame.columns) if c in frame.columns]
        for number, table in enumerate(
            rich_tables(title, frame.select(columns), max_rows, width=console.width)
        ):
            if number:
                console.print()
            console.print(table)


def html_table(frame: pl.DataFrame, *, max_rows: int = DEFAULT_MAX_ROWS, css: str = "") -> str:
    """An HTML table (escaped), truncated to ``max_rows`` with a note."""
    if frame.height == 0:
        return '<p class="none">none</p>'
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    rows = []
    for row in frame.head(max_rows).iter_rows():
        cells = "".join(f"<td>{html.escape(format_value(v))}</td>" for v in row)
        rows.append(f"<tr>{cells}</tr>")
    note = ""
    if frame.height > max_rows:
        note = f'<p class="note">{frame.height - max_rows} more rows not shown.</p>'
    klass = f' class="{css}"' if css else ""
    return (
        f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{note}"
    )
