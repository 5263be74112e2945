"""Flat rows of named tensors: where each of a module's tensors lives in one row.

Why: the batched passes keep every env's tensors of one kind in the rows of one stacked
tensor (:mod:`host_store`) and hand a module its columns as one tensor per call
(:mod:`slot_groups`), which it unpacks into views shaped like its own tensors. A
layout says where each tensor's values lie (channels-last tensors keep their memory
order), so flattening, unpacking and the stacked views agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor, nn

from esper.model.memory_format import is_channels_last

#: 4-d tensors kept channels-last are laid out (O, H, W, I) in their row.
CHANNELS_LAST_ORDER = (0, 2, 3, 1)
CHANNELS_LAST_INVERSE = (0, 3, 1, 2)
_STACKED_INVERSE = tuple(1 + i for i in CHANNELS_LAST_INVERSE)


@dataclass(frozen=True)
class Entry:
    """One tensor's columns in a flat row."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int
    channels_last: bool

    @cached_property
    def stored(self) -> tuple[int, ...]:
        """The shape its values have in the row (channels-last tensors: (O, H, W, I))."""
        if not self.channels_last:
            return self.shape
        return tuple([self.shape[i] for i in CHANNELS_LAST_ORDER])


class FlatLayout:
    """Where each named tensor lives in a flat row (in order, no gaps)."""

    def __init__(self, entries: Sequence[Entry], *, tied: bool = False) -> None:
        self.entries = tuple(entries)
        self.sizes = [e.numel for e in self.entries]
        self.width = sum(self.sizes)
        self.names = tuple([e.name for e in self.entries])
        #: Whether the module laid out shares a tensor between two names (the layout
        #: holds it once): a functional call must then untie them (a walk over all the
        #: module's tensors per call, so it is asked here, once).
        self.tied = tied

    @classmethod
    def of(
        cls, named: Iterable[tuple[str, Tensor]], *, channels_last: bool | None = None,
        tied: bool = False,
    ) -> FlatLayout:  # fmt: skip
        """The layout of these tensors; ``channels_last``: lay every 4-d tensor out so
        (default: as each tensor is laid out now)."""
        entries, offset = [], 0
        for name, t in named:
            cl = is_channels_last(t) if channels_last is None else channels_last and t.dim() == 4
            entries.append(Entry(name, tuple(t.shape), offset, t.numel(), cl))
            offset += t.numel()
        return cls(entries, tied=tied)

    @classmethod
    def of_module(
        cls, module: nn.Module, *, prefix: str = "", channels_last: bool | None = None
    ) -> FlatLayout:
        """The layout of a module's parameters (named ``prefix`` + their name)."""
        named = [*module.named_parameters(remove_duplicate=False),
                 *module.named_buffers(remove_duplicate=False)]  # fmt: skip
        tied = len({id(t) for _, t in named}) != len(named)
        params = ((prefix + n, p) for n, p in module.named_parameters())
        return cls.of(params, channels_last=channels_last, tied=tied)

    def flatten(self, tensors: Sequence[Tensor]) -> Tensor:
        """The tensors (in layout order) as one row (one ``cat``)."""
        parts = [
            (t.permute(*CHANNELS_LAST_ORDER) if e.channels_last else t).reshape(-1)
            for e, t in zip(self.entries, tensors, strict=True)
        ]
        return torch.cat(parts) if parts else torch.zeros(0)

    def row_views(self, row: Tensor) -> list[Tensor]:
        """Views of one row ``[width]`` shaped (and strided) like the original tensors
        (one ``split``; also inside ``vmap``, where ``row`` is one row of a batch)."""
        if not self.entries:
            return []
        out = []
        for e, piece in zip(self.entries, torch.split(row, self.sizes), strict=True):
            view = piece.view(e.stored)
            out.append(view.permute(*CHANNELS_LAST_INVERSE) if e.channels_last else view)
        return out

    def under(self, prefix: str) -> tuple[int, FlatLayout]:
        """The columns of the tensors named under ``prefix`` (one module's, which lie
        together): where they start, and their layout from there, names relative."""
        inside = [e for e in self.entries if e.name.startswith(prefix)]
        lo = inside[0].offset if inside else 0
        layout = FlatLayout(
            [Entry(e.name[len(prefix) :], e.shape, e.offset - lo, e.numel, e.channels_last)
             for e in inside], tied=self.tied,
        )  # fmt: skip
        if inside and inside[-1].offset + inside[-1].numel - lo != layout.width:
            raise ValueError(f"the tensors under {prefix!r} are not contiguous in the layout")
        return lo, layout

    def stack_views(self, flat: Tensor) -> dict[str, Tensor]:
        """``[n, width]`` as ``{name: [n, *shape]}``. One ``split``, so a gradient of
        ``flat`` flows back through one ``cat`` rather than one copy per tensor."""
        n = flat.shape[0]
        out: dict[str, Tensor] = {}
        pieces = torch.split(flat, self.sizes, dim=1)
        for e, piece in zip(self.entries, pieces, strict=True):
            view = piece.view(n, *e.stored)
            if e.channels_last:
                view = view.permute(0, *_STACKED_INVERSE)
            out[e.name] = view
        return out


@dataclass(frozen=True)
class HostPart:
    """One host module's share of the host rows: what one vmapped call of it takes."""

    layout: FlatLayout  # its tensors' columns, named inside the module
    buffers: dict[str, str]  # its buffers: name inside the module -> full name


def names_under(prefix: str, names: Iterable[str]) -> dict[str, str]:
    """The names under ``prefix`` (one module's): name inside the module -> full name."""
    return {k[len(prefix) :]: k for k in names if k.startswith(prefix)}
