"""Stub of the optional native emit fast path (``_emit.c``)."""

from collections.abc import Callable
from typing import Any

class Emitter:
    level: int
    open: bool
    @property
    def seq(self) -> int: ...
    def __init__(
        self,
        base: type,
        descriptors: tuple[object, ...],
        levels: dict[type, int],
        buffer: list[Any],
        capacity: int,
        run_id: str,
        rank: int,
        seq: int,
        level: int,
        slow: Callable[[Any], None],
    ) -> None: ...
    def emit(self, event: Any) -> None: ...
    def push(self, event: Any) -> None: ...
