"""A minimal PNG decoder (zlib + numpy) to inspect browser screenshots without PIL.

Supports what Chromium writes: 8-bit RGB or RGBA, non-interlaced. Filters None, Sub
and Up are vectorised per row; Average and Paeth need the reconstructed left byte, so
they run byte by byte in plain Python.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {2: 3, 6: 4}


def _chunks(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    pos = len(_SIGNATURE)
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        yield kind, data[pos + 8 : pos + 8 + length]
        pos += 12 + length


def _unfilter_row(kind: int, row: np.ndarray, prev: np.ndarray, bpp: int) -> np.ndarray:
    if kind == 0:
        return row
    if kind == 2:
        return np.asarray((row + prev) % 256)
    if kind == 1:
        return np.asarray(np.cumsum(row.reshape(-1, bpp), axis=0) % 256).reshape(-1)
    return np.array(_sequential(kind, row.tolist(), prev.tolist(), bpp), np.int64)


def _sequential(kind: int, out: list[int], up: list[int], bpp: int) -> list[int]:
    """Average (3) and Paeth (4) depend on the reconstructed left byte: one pass in Python."""
    for i in range(len(out)):
        a = out[i - bpp] if i >= bpp else 0
        b = up[i]
        if kind == 3:
            out[i] = (out[i] + (a + b) // 2) & 0xFF
            continue
        c = up[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        out[i] = (out[i] + pred) & 0xFF
    return out


def read_png(path: Path) -> np.ndarray:
    """Pixels as an ``(height, width, channels)`` uint8 array."""
    data = path.read_bytes()
    if not data.startswith(_SIGNATURE):
        raise ValueError(f"{path} is not a PNG file")
    header, idat = b"", []
    for kind, body in _chunks(data):
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat.append(body)
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    if depth != 8 or color not in _CHANNELS or interlace:
        raise ValueError(
            f"unsupported PNG (depth {depth}, colour type {color}, interlace {interlace})"
        )
    bpp = _CHANNELS[color]
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).astype(np.int64)
    stride = width * bpp + 1
    rows = raw.reshape(height, stride)
    out = np.zeros((height, width * bpp), np.int64)
    prev = np.zeros(width * bpp, np.int64)
    for y in range(height):
        prev = _unfilter_row(int(rows[y, 0]), rows[y, 1:], prev, bpp)
        out[y] = prev
    return out.reshape(height, width, bpp).astype(np.uint8)
