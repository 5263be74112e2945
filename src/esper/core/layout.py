"""Named layouts of packed rows: one declaration, used by the packer and the unpacker.

The hot path packs many small numbers into one tensor so that a step costs one
device-to-host transfer. A layout names the column range of each field once, next to
the packing, so neither side computes an offset by hand (``row[n_heads + 2 + 6:]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


class Layout:
    """Ordered fields of a packed row, each a name and a width (field name -> slice)."""

    __slots__ = ("_slices", "names", "width")

    def __init__(self, *fields: tuple[str, int]) -> None:
        slices: dict[str, slice] = {}
        start = 0
        for name, width in fields:
            if name in slices:
                raise ValueError(f"layout field {name!r} declared twice")
            if width < 0:
                raise ValueError(f"layout field {name!r} has negative width {width}")
            slices[name] = slice(start, start + width)
            start += width
        self._slices = slices
        self.names: tuple[str, ...] = tuple(slices)
        self.width: int = start

    def __getitem__(self, name: str) -> slice:
        """The field's column range (works on lists and on tensors' last dimension)."""
        try:
            return self._slices[name]
        except KeyError:
            raise KeyError(
                f"layout has no field {name!r}; fields: {', '.join(self.names)}"
            ) from None

    def get(self, row: Sequence[T], name: str) -> list[T]:
        """The field's values in ``row``."""
        return list(row[self[name]])

    def index(self, name: str) -> int:
        """The column of a width-1 field."""
        sl = self[name]
        if sl.stop - sl.start != 1:
            raise ValueError(f"layout field {name!r} has width {sl.stop - sl.start}, not 1")
        return int(sl.start)

    def one(self, row: Sequence[T], name: str) -> T:
        """The value of a width-1 field."""
        return row[self.index(name)]

    def check(self, row: Sequence[object]) -> None:
        """Fail loudly when a packed row does not have the declared width."""
        if len(row) != self.width:
            raise ValueError(f"packed row has {len(row)} values, layout declares {self.width}")

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={s.start}:{s.stop}" for n, s in self._slices.items())
        return f"Layout({fields})"
