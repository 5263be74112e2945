"""Rendering analysis results for people: rich tables in a terminal, HTML in the report.

Terminal tables never shrink a cell: a table wider than the console is split into
several tables of whole columns, each repeating the leading identifier columns
(:data:`KEY_COLUMNS`), and columns read together (:data:`COLUMN_GROUPS`: expected and
got, a mean and its standard error) stay in one part, so every number stays complete and
findable at 80 columns. The width is the terminal's, or ``COLUMNS`` when set (also for
a pipe or a file), else :data:`PIPE_WIDTH` when the output is not a terminal.
"""

from __future__ import annotations

import argparse
import html
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final, TextIO

import polars as pl
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from esper_analysis.errors import AnalysisError
from esper_analysis.result import AnalysisResult

DEFAULT_MAX_ROWS: Final = 40
#: Floats from this size on print whole (4 significant digits would need an exponent),
#: and from :data:`SCIENTIFIC_FROM` on in scientific notation.
WHOLE_FROM: Final = 1e4
SCIENTIFIC_FROM: Final = 1e6
#: Table width when the output is a pipe or a file and ``COLUMNS`` is not set.
PIPE_WIDTH: Final = 100
#: Identifier columns: when they lead a table that must be split, every part repeats them.
KEY_COLUMNS: Final = frozenset(
    {"run_id", "run", "id", "rank", "round", "env", "step", "type", "component", "op", "head"}
    | {"blueprint", "slot", "seed_id", "metric", "dimension", "key", "host", "phase"}
    | {"group", "seed"}
)
#: Columns read together: a split never separates those of a table (the group goes
#: where its first column is).
COLUMN_GROUPS: Final = (
    ("expected", "got", "delta", "status"),
    ("mean_diff", "ci_low", "ci_high", "std_err"),
    ("mean", "ci_low", "ci_high", "std_err"),
    ("rounds_ahead", "rounds"),
    ("total", "component_sum", "diff"),
    ("total", "episode_reward_reported"),
)
#: Headers longer than this may break at an underscore (into two lines at most) when a
#: table does not fit; shorter ones (``ci_low``) stay whole.
_WRAP_HEADERS_FROM: Final = 10
#: A header's last word this short is a unit (``_pp``, ``_ms``): never a line alone.
_UNIT_CHARS: Final = 3
#: Separates the title from the values of the columns folded into it.
TITLE_SEP: Final = " · "
#: What a column's missing values mean, printed under a table that shows them.
COLUMN_LEGENDS: Final = {
    "contribution_pp": "contribution_pp (accuracy points the seed adds): — the seed is still "
    "alive (no fossilize or prune event); nan: it ended before a counterfactual measured it",
    "mean_contribution_pp": "mean_contribution_pp: — no ended seed of this blueprint was measured",
    "mean_contribution_fossilized_pp": "mean_contribution_fossilized_pp: — none was fossilized",
}
#: Rich's box per column (a space each side and one rule), and the closing rule.
_COLUMN_CHROME: Final = 3
_TABLE_CHROME: Final = 1


def output_width(out: TextIO, environ: Mapping[str, str] | None = None) -> int | None:
    """Table width for ``out``: ``COLUMNS`` when set to a positive number, else the
    terminal's (None: rich measures it), else :data:`PIPE_WIDTH` for a pipe or file."""
    text = (os.environ if environ is None else environ).get("COLUMNS", "")
    if text.strip().isdigit() and int(text) > 0:
        return int(text)
    return None if out.isatty() else PIPE_WIDTH


def console_for(out: TextIO) -> Console:
    """A rich console writing to ``out`` at :func:`output_width`."""
    return Console(file=out, width=output_width(out))


#: How to get wider (or narrower) tables, for ``--help``.
WIDTH_HELP: Final = (
    "Tables fit the terminal's width, or COLUMNS when set (COLUMNS=200 for wide output), "
    f"{PIPE_WIDTH} columns in a pipe or file; a wider table is split into parts that "
    "repeat its key columns."
)


def add_max_rows(parser: argparse.ArgumentParser) -> None:
    """``--max-rows`` (validated by argparse before anything runs)."""
    parser.add_argument(
        "--max-rows",
        type=max_rows_arg,
        default=DEFAULT_MAX_ROWS,
        metavar="N",
        help=f"rows shown per table, >= 1 (default: {DEFAULT_MAX_ROWS})",
    )


def plural(n: int, word: str) -> str:
    """``1 env``, ``2 envs``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


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
        if abs(value) >= WHOLE_FROM and abs(value) < SCIENTIFIC_FROM:
            return f"{value:.0f}"  # 10270, not 1.027e+04: counts read as counts
        if abs(value) >= SCIENTIFIC_FROM or abs(value) < 1e-3:
            return f"{value:.3e}"
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(format_value(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {format_value(v)}" for k, v in value.items())
    return str(value)


def rich_table(title: str, frame: pl.DataFrame, max_rows: int = DEFAULT_MAX_ROWS) -> RenderableType:
    """One rich table of the whole frame (as wide as it needs; see :func:`rich_tables`)."""
    return rich_tables(title, frame, max_rows, width=None)[0]


def rich_tables(
    title: str,
    frame: pl.DataFrame,
    max_rows: int = DEFAULT_MAX_ROWS,
    *,
    width: int | None,
    keys: Sequence[str] | None = None,
) -> list[RenderableType]:
    """The frame as rich tables that each fit ``width`` cells (one table if None or if it fits).

    Cells are never cut: columns go whole into the part that has room for them, after
    the key columns (``keys``; default the fewest leading :data:`KEY_COLUMNS` that tell
    the shown rows apart, or the first column). With a ``width``, an identifier or text
    column holding one value in every row (``rank`` of a one-process run) is said once
    in the title instead, and a table that does not fit breaks long headers at their
    underscores; the title stands above the table (a line that wraps at the width).
    """
    said = ""
    if width is not None:
        frame, said = fold_constant_columns(frame)
        if frame.height == 1 and not fits(frame, width, max_rows) and keys is None:
            frame = _one_row_down(frame)  # one row too wide: a column per field is worse
    cells, widths = _cells(frame, max_rows)
    headers = list(frame.columns)
    if width is not None and _TABLE_CHROME + sum(w + _COLUMN_CHROME for w in widths) > width:
        widths = [_header_width(name, cells, i) for i, name in enumerate(headers)]
        headers = [_wrap_header(name, w) for name, w in zip(headers, widths, strict=True)]
    groups = (
        [list(range(frame.width))]
        if width is None
        else _column_groups(frame, widths, width, keys, cells)
    )
    tables: list[tuple[str, Table]] = []
    for number, group in enumerate(groups, start=1):
        part = f" ({number}/{len(groups)})" if len(groups) > 1 else ""
        full = title + part
        if said:  # on the title's line when it fits there, else on a line of its own
            one_line = f"{title}{TITLE_SEP}{said}{part}"
            fits_line = width is None or cell_len(one_line) <= width
            full = one_line if fits_line else f"{full}\n{said}"
        table = Table(
            title=full if width is None else None,
            title_justify="left",
            header_style="bold",
        )
        for i in group:
            whole = width is None or widths[i] + _COLUMN_CHROME + _TABLE_CHROME <= width
            table.add_column(
                headers[i],
                justify="right" if frame.dtypes[i].is_numeric() else "left",
                min_width=widths[i] if whole else None,
                no_wrap=whole,
                overflow="fold",  # only a text cell wider than the console: wrapped, not cut
            )
        for row in cells:
            table.add_row(*(row[i] for i in group))
        tables.append((full, table))
    if frame.height > max_rows:
        tables[-1][1].caption = f"{frame.height - max_rows} more rows (use --json for all)"
    if width is None:
        return [table for _, table in tables]
    # The title above the table, not in it: wrapped at the console's width (at spaces),
    # never at a narrow table's, and the table is not stretched to the title.
    return [Group(Text(full, style="table.title"), table) for full, table in tables]


def _one_row_down(frame: pl.DataFrame) -> pl.DataFrame:
    """A one-row table as two columns, ``field`` and ``value``, one line per field."""
    row = frame.row(0)
    return pl.DataFrame(
        {"field": frame.columns, "value": [format_value(v) for v in row]},
        schema={"field": pl.String, "value": pl.String},
    )


def fold_constant_columns(frame: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """Identifier and text columns with one value in every row (of several), said once
    (``rank 0``) instead: a column of the same value says nothing per row. Returns the
    frame without them and what to say in the title."""
    if frame.height < 2 or frame.width < 2:
        return frame, ""
    folded: list[str] = []
    for name, dtype in frame.schema.items():
        if name not in KEY_COLUMNS and dtype != pl.String:
            continue
        if frame[name].n_unique() == 1 and len(folded) < frame.width - 1:
            folded.append(name)
    said = TITLE_SEP.join(f"{name} {format_value(frame[name][0])}" for name in folded)
    return frame.drop(folded), said


def _header_pieces(name: str) -> list[str]:
    """Where a header may break: after each underscore, a short last word (a unit such
    as ``_pp`` or ``_ms``) kept with the word before it."""
    words = name.split("_")
    if len(words) > 2 and len(words[-1]) <= _UNIT_CHARS:
        words[-2:] = [f"{words[-2]}_{words[-1]}"]
    return [w + "_" for w in words[:-1]] + [words[-1]]


def _header_width(name: str, cells: list[list[str]], i: int) -> int:
    """A column's width when a long header may break at an underscore: its widest cell,
    or the wider line of the header's best break into two lines."""
    widest = max((cell_len(row[i]) for row in cells), default=0)
    if cell_len(name) <= _WRAP_HEADERS_FROM:
        return max(widest, cell_len(name))
    pieces = _header_pieces(name)
    best = min(
        max(cell_len("".join(pieces[:k])), cell_len("".join(pieces[k:])))
        for k in range(1, len(pieces) + 1)
    )
    return max(widest, best)


def _wrap_header(name: str, width: int) -> str:
    """``epochs_germinated`` as ``epochs_`` / ``germinated`` when wider than its column."""
    if cell_len(name) <= width:
        return name
    lines, line = [], ""
    for piece in _header_pieces(name):
        if line and cell_len(line + piece) > width:
            lines.append(line)
            line = ""
        line += piece
    lines.append(line)
    return "\n".join(lines)


def _cells(frame: pl.DataFrame, max_rows: int) -> tuple[list[list[str]], list[int]]:
    """The shown rows as text, and each column's width (its header included)."""
    cells = [[format_value(v) for v in row] for row in frame.head(max_rows).iter_rows()]
    widths = [
        max([cell_len(name)] + [cell_len(row[i]) for row in cells])
        for i, name in enumerate(frame.columns)
    ]
    return cells, widths


def fits(frame: pl.DataFrame, width: int | None, max_rows: int = DEFAULT_MAX_ROWS) -> bool:
    """Does the whole frame fit ``width`` cells as one table (None: any width)?"""
    if width is None:
        return True
    _, widths = _cells(frame, max_rows)
    return _TABLE_CHROME + sum(w + _COLUMN_CHROME for w in widths) <= width


def _leading_keys(
    frame: pl.DataFrame, keys: Sequence[str] | None, cells: list[list[str]]
) -> list[int]:
    """The key columns every part repeats: ``keys``, else the fewest leading
    :data:`KEY_COLUMNS` whose values tell the shown rows apart (all of them if none do)."""
    if keys is not None:
        return [frame.columns.index(k) for k in keys if k in frame.columns]
    leading: list[int] = []
    for i, name in enumerate(frame.columns):
        if name not in KEY_COLUMNS:
            break
        leading.append(i)
    if not leading and frame.width > 1:
        leading = [0]  # no known key: the first column still says which row is which
    for n in range(1, len(leading)):
        if len({tuple(row[i] for i in leading[:n]) for row in cells}) == len(cells):
            return leading[:n]
    return leading


def _units(frame: pl.DataFrame, rest: list[int], together: bool) -> list[list[int]]:
    """The non-key columns as units a split keeps whole (a :data:`COLUMN_GROUPS` group,
    at its first column's place, or one column)."""
    names = frame.columns
    placed: set[int] = set()
    units: list[list[int]] = []
    for i in rest:
        if i in placed:
            continue
        unit = [i]
        if together:
            for group in COLUMN_GROUPS:
                if names[i] in group:
                    unit = [j for j in rest if names[j] in group and j not in placed]
                    break
        placed.update(unit)
        units.append(unit)
    return units


def _column_groups(
    frame: pl.DataFrame,
    widths: list[int],
    width: int,
    keys: Sequence[str] | None,
    cells: list[list[str]],
) -> list[list[int]]:
    """Pack the columns into parts no wider than ``width``, each led by the key columns.

    The keys are repeated whole while the widest column still fits beside them (else
    the trailing keys are dropped); groups stay whole where they fit beside the keys.
    """

    def need(cols: list[int]) -> int:
        return sum(widths[i] + _COLUMN_CHROME for i in cols)

    if _TABLE_CHROME + need(list(range(frame.width))) <= width:
        return [list(range(frame.width))]
    lead = _leading_keys(frame, keys, cells)
    while lead:  # the keys, then room for the widest other column beside them
        widest = max((need([i]) for i in range(frame.width) if i not in lead), default=0)
        if _TABLE_CHROME + need(lead) + widest <= width:
            break
        lead = lead[:-1]
    rest = [i for i in range(frame.width) if i not in lead]
    units = _units(frame, rest, together=True)
    if any(_TABLE_CHROME + need(lead) + need(u) > width for u in units):
        units = _units(frame, rest, together=False)
    key_width = _TABLE_CHROME + need(lead)
    parts: list[list[int]] = []
    current, used = list(lead), key_width
    for unit in units:
        if used + need(unit) > width and len(current) > len(lead):
            parts.append(current)
            current, used = list(lead), key_width
        current += unit
        used += need(unit)
    parts.append(current)
    return parts


def legends(frame: pl.DataFrame) -> list[str]:
    """:data:`COLUMN_LEGENDS` of the columns of ``frame`` that hold a missing value."""
    out = []
    for name, text in COLUMN_LEGENDS.items():
        if name not in frame.columns:
            continue
        column = frame[name]
        nan = column.dtype.is_float() and bool(column.is_nan().any())
        if column.null_count() or nan:
            out.append(text)
    return out


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
        shown = frame.select(columns)
        for number, table in enumerate(rich_tables(title, shown, max_rows, width=console.width)):
            if number:
                console.print()
            console.print(table)
        for text in legends(shown.head(max_rows)):
            console.print(text, markup=False)


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
