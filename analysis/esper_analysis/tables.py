"""Rendering analysis results for people: rich tables in a terminal, HTML in the report."""

from __future__ import annotations

import html
import math
from typing import Any, Final

import polars as pl
from rich.console import Console
from rich.table import Table

from esper_analysis.result import AnalysisResult

DEFAULT_MAX_ROWS: Final = 40


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
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(format_value(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {format_value(v)}" for k, v in value.items())
    return str(value)


def rich_table(title: str, frame: pl.DataFrame, max_rows: int = DEFAULT_MAX_ROWS) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for name, dtype in frame.schema.items():
        table.add_column(name, justify="right" if dtype.is_numeric() else "left")
    for row in frame.head(max_rows).iter_rows():
        table.add_row(*(format_value(v) for v in row))
    if frame.height > max_rows:
        table.caption = f"{frame.height - max_rows} more rows (use --json for all)"
    return table


def print_result(
    result: AnalysisResult,
    console: Console,
    *,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> None:
    """Summary lines, then every table as a rich table (its terminal columns only)."""
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
        console.print(rich_table(title, frame.select(columns), max_rows))


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
