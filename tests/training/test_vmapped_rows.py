"""The batched passes' module call: parameters enter ``vmap`` as flat rows and are
unpacked inside it (``slot_groups._vmapped``); a module's columns come from the host
layout (``FlatLayout.under``, ``HostStore.host_parts``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from esper.training.passes.flat_layout import FlatLayout
from esper.training.passes.slot_groups import _vmapped


class _Tied(nn.Module):
    """Two names for one weight: functional_call must untie them."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3, bias=False)
        self.b = nn.Linear(3, 3, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(torch.relu(self.a(x)))
        return out


def _rows(module: nn.Module, layout: FlatLayout, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, layout.width, generator=g, requires_grad=True)


def _per_row(
    module: nn.Module, layout: FlatLayout, flat: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    outs = []
    for r in range(flat.shape[0]):
        params = dict(zip(layout.names, layout.row_views(flat[r]), strict=True))
        outs.append(torch.func.functional_call(module, params, (x[r],)))
    return torch.stack(outs)


@pytest.mark.parametrize("channels_last", [False, True])
def test_flat_rows_give_each_row_its_own_parameters_and_gradients(channels_last: bool) -> None:
    conv = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU())
    if channels_last:
        conv = conv.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    layout = FlatLayout.of_module(conv)
    assert any(e.channels_last for e in layout.entries) == channels_last
    flat = _rows(conv, layout, 3)
    x = torch.randn(3, 5, 2, 6, 6, generator=torch.Generator().manual_seed(1))
    got = _vmapped([(conv, layout)], [layout.width], flat, [{}], x)
    (grad,) = torch.autograd.grad(got.square().sum(), flat)
    want = _per_row(conv, layout, flat, x)
    (want_grad,) = torch.autograd.grad(want.square().sum(), flat)
    # Up to summation order (a row's mix-up with another's would be off by O(1)).
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-4)


def test_a_module_with_tied_weights_is_untied_per_row() -> None:
    tied = _Tied()
    layout = FlatLayout.of_module(tied)  # the tied weight once, as "a.weight"
    assert layout.names == ("a.weight",) and layout.tied
    assert not FlatLayout.of_module(nn.Linear(2, 2)).tied
    flat = _rows(tied, layout, 2)
    x = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(1))
    got = _vmapped([(tied, layout)], [layout.width], flat, [{}], x)
    for r in range(2):
        w = flat[r].view(3, 3)
        torch.testing.assert_close(got[r], torch.relu(x[r] @ w.T) @ w.T)


def test_a_modules_columns_are_relative_to_where_they_start() -> None:
    net = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    layout = FlatLayout.of(net.named_parameters())
    lo, part = layout.under("1.")
    assert lo == 9 and part.names == ("weight", "bias") and part.width == 4 and not part.tied
    assert [e.offset for e in part.entries] == [0, 3]
    # Names under a prefix that are not side by side cannot be one module's columns.
    mixed = FlatLayout.of(
        [("a.x", torch.zeros(2)), ("b.y", torch.zeros(1)), ("a.z", torch.zeros(1))]
    )
    with pytest.raises(ValueError, match=r"'a\.' are not contiguous"):
        mixed.under("a.")


def test_a_run_of_modules_is_one_call_equal_to_one_call_each() -> None:
    """Host modules with no seed between them run in one vmapped call, each unpacking
    its own columns and buffers (here a BatchNorm's running statistics, in eval mode)."""
    first = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3)).eval()
    second = nn.Sequential(nn.Conv2d(3, 2, 1), nn.BatchNorm2d(2)).eval()
    layouts = [FlatLayout.of_module(m) for m in (first, second)]
    g = torch.Generator().manual_seed(2)
    flats = [torch.randn(4, lay.width, generator=g) for lay in layouts]
    bufs = [
        {k: torch.rand(4, *b.shape, generator=g) + 0.5 for k, b in m.named_buffers() if b.dim()}
        for m in (first, second)
    ]
    x = torch.randn(4, 5, 2, 6, 6, generator=g)
    calls = list(zip((first, second), layouts, strict=True))
    widths = [lay.width for lay in layouts]
    together = _vmapped(calls, widths, torch.cat(flats, dim=1), bufs, x)
    h = x
    for call, flat, b in zip(calls, flats, bufs, strict=True):
        h = _vmapped([call], [call[1].width], flat, [b], h)
    torch.testing.assert_close(together, h)
    # The stacked running statistics are used, not the modules' own.
    plain = _vmapped(calls, widths, torch.cat(flats, dim=1), [{}, {}], x)
    assert not torch.allclose(together, plain)
