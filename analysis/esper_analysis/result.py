"""The shape every analysis returns: named polars tables plus a small summary.

One shape lets the CLI print any analysis as rich tables or JSON, and lets the HTML
report embed any of them, without per-analysis glue.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import PurePath
from typing import Any, ClassVar

import polars as pl


@dataclasses.dataclass(frozen=True)
class AnalysisResult:
    """Base of analysis results: DataFrame fields are tables, ``summary`` is scalars."""

    #: Human titles of the table fields, in display order.
    TITLES: ClassVar[dict[str, str]] = {}
    #: Columns shown in terminal tables, per table (all when absent; JSON has all).
    TEXT_COLUMNS: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: Tables left out of terminal output (too long to read there; JSON has them).
    TEXT_SKIP: ClassVar[frozenset[str]] = frozenset()

    def tables(self) -> list[tuple[str, str, pl.DataFrame]]:
        """``(key, title, frame)`` for every table field, in declaration order."""
        out = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, pl.DataFrame):
                out.append((f.name, self.TITLES.get(f.name, f.name), value))
        return out

    def summary(self) -> dict[str, Any]:
        """Scalar fields (everything that is not a table)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if not isinstance(getattr(self, f.name), pl.DataFrame)
        }

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict: tables as lists of row dicts, NaN/inf as null."""
        data: dict[str, Any] = {"summary": jsonable(self.summary())}
        for key, _, frame in self.tables():
            data[key] = jsonable(frame.to_dicts())
        return data


def jsonable(value: Any) -> Any:
    """Recursively replace non-finite floats by None (strict JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, PurePath):
        return str(value)
    return value
