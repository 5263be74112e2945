"""Stub of the optional native column converter (``_columns.c``)."""

from typing import Any

#: One column's buffers (objects of the buffer protocol that own their memory): the
#: values; (offsets, data) of strings; (offsets, items) of lists.
Column = Any

def convert(
    cls: type,
    events: list[Any],
    descriptors: tuple[object, ...],
    kinds: bytes,
    start: int,
    stop: int,
) -> list[Column] | None: ...
def convert_many(
    jobs: list[tuple[type, list[Any], tuple[object, ...], bytes, int, int]],
    release_gil: bool,
) -> list[list[Column] | None]: ...
def group(events: list[Any]) -> dict[type, list[Any]]: ...
