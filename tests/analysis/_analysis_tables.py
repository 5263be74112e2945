"""Reading rich tables back from terminal text: titles, split parts and header names
(a header broken at its underscores over several lines is joined again)."""

from __future__ import annotations

import re

PART = re.compile(r"^(?P<title>.+?) \((?P<n>\d+)/(?P<of>\d+)\)\s*$")
#: Separates a title from the columns folded into it (``esper_analysis.tables.TITLE_SEP``).
TITLE_SEP = " · "


def header_names(lines: list[str], start: int) -> list[str]:
    """The column names of the table whose header begins at or after ``lines[start]``."""
    i = next(k for k in range(start, len(lines)) if lines[k].startswith("┃"))
    rows = []
    while lines[i].startswith("┃"):
        rows.append([c.strip() for c in lines[i].strip().strip("┃").split("┃")])
        i += 1
    names = ["" for _ in rows[0]]
    for row in rows:
        for k, piece in enumerate(row):
            names[k] += piece
    return names


def all_headers(text: str) -> set[str]:
    """Every column name of every table in ``text``."""
    lines = text.splitlines()
    return {
        name
        for i, line in enumerate(lines)
        if line.startswith("┏")
        for name in header_names(lines, i)
    }


def folded(text: str) -> set[str]:
    """Columns said once in a title (``Seeds · rank 0``): their names."""
    out = set()
    for line in text.splitlines():
        if TITLE_SEP in line:
            for said in line.split(TITLE_SEP)[1:]:
                out.add(said.split(" ", 1)[0])
    return out


def parts(text: str) -> dict[str, list[list[str]]]:
    """Every split table's parts: title -> the column names of each part, in order."""
    found: dict[str, list[list[str]]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = PART.match(line)
        if m is None:
            continue
        start = i  # a title wider than its table wraps: its lines up to a blank one
        while start > 0 and lines[start - 1].strip() and not lines[start - 1].startswith("└"):
            start -= 1
        title = " ".join(ln.strip() for ln in [*lines[start:i], m["title"]])
        found.setdefault(title, []).append(header_names(lines, i + 1))
    return found
