"""An attribute of a per-env view that lives in a column of a table of envs.

Why: a round's envs keep their numbers as arrays (one row per env, updated for all envs
at once); the per-env objects that read one env are views of their row, and this
descriptor is how a view's attribute reads and writes it, converted to a plain Python
value on the way out (numpy scalars never leak into events or configs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class RowField(Generic[T]):
    """``obj.<name>`` is ``obj.table.<column>[obj.row]``, converted by ``kind``."""

    def __init__(self, column: str, kind: Callable[[Any], T]) -> None:
        self.column = column
        self.kind = kind

    @overload
    def __get__(self, obj: None, owner: type) -> RowField[T]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> T: ...

    def __get__(self, obj: Any, owner: type) -> RowField[T] | T:
        if obj is None:
            return self
        return self.kind(getattr(obj.table, self.column)[obj.row])

    def __set__(self, obj: Any, value: T) -> None:
        getattr(obj.table, self.column)[obj.row] = value
