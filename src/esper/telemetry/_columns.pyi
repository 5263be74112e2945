"""Stub of the optional native column converter (``_columns.c``)."""

from typing import Any

def convert(
    cls: type,
    events: list[Any],
    descriptors: tuple[object, ...],
    kinds: bytes,
    start: int,
    stop: int,
) -> list[bytes | tuple[Any, Any]] | None: ...
def group(events: list[Any]) -> dict[type, list[Any]]: ...
