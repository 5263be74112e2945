"""Host networks, cut into segments with a seed slot after each one.

A host is ``stem -> (segment -> slot)* -> head``; the morphogenetic model runs the
segments in order and lets each slot transform the activation in between. Hosts know
their slot geometry (id, width) and, for gradient metrics, which segment's parameters
a slot's seed should be compared with.

CNN: conv-norm-ReLU blocks with base * 2**i channels (or the widths given per block); a
max-pool follows every block but the last while the spatial size allows, with a slot
before each pool (``r0c<i>``) and after it (``r1c<i>``). Transformer: pre-norm causal
blocks, weight-tied head, a slot after every block (``r0c<i>``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from esper.core.enums import Topology

POOL = 2
#: A pool is added only if the pooled map is at least this many pixels wide.
MIN_POOLED_SPATIAL = 2
CONV_KERNEL = 3
CONV_PADDING = 1
MLP_EXPANSION = 4
PRE_POOL_ROW = 0
POST_POOL_ROW = 1


def slot_name(row: int, col: int) -> str:
    return f"r{row}c{col}"


class SlotPosition(msgspec.Struct, frozen=True):
    """A slot sits after ``segment`` and sees activations of ``width`` channels/features."""

    slot_id: str
    width: int
    segment: int
    #: Index of the nearest segment at or before ``segment`` that has parameters.
    ref_segment: int


class HostNetwork(nn.Module):
    """Common shape of every host: stem, segments (one slot after each), head."""

    topology: Topology
    stem: nn.Module
    segments: nn.ModuleList
    head: nn.Module
    positions: tuple[SlotPosition, ...]

    def finalize(self) -> None:
        """Called after parameters are initialised (e.g. to tie weights)."""

    def _positions(self, ids_widths: list[tuple[str, int]]) -> tuple[SlotPosition, ...]:
        out = []
        ref = 0
        for i, (slot_id, width) in enumerate(ids_widths):
            if any(True for _ in self.segments[i].parameters()):
                ref = i
            out.append(SlotPosition(slot_id, width, i, ref))
        return tuple(out)


class ConvBlock(nn.Sequential):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__(
            nn.Conv2d(c_in, c_out, CONV_KERNEL, padding=CONV_PADDING, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(),
        )


class GlobalAvgPool(nn.Module):
    """Mean over the spatial dims, keeping them (bitwise ``AdaptiveAvgPool2d(1)``, which
    reduces to this mean, but without its layout fix-up that ``vmap`` can only run as a
    per-env loop: the batched host path needs every op to have a batching rule)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.mean(dim=(2, 3), keepdim=True)


class CNNHost(HostNetwork):
    """Convolutional host for C x H x W images (works from 8x8 digits to 32x32 colour)."""

    def __init__(
        self,
        *,
        in_channels: int,
        spatial: int,
        num_classes: int,
        base_channels: int,
        n_blocks: int,
        block_channels: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        self.topology = Topology.CNN
        self.stem = nn.Identity()
        self.segments = nn.ModuleList()
        ids_widths: list[tuple[str, int]] = []
        c_in, size = in_channels, spatial
        widths = block_channels or tuple(base_channels * 2**i for i in range(n_blocks))
        n_blocks = len(widths)
        for i, c_out in enumerate(widths):
            self.segments.append(ConvBlock(c_in, c_out))
            ids_widths.append((slot_name(PRE_POOL_ROW, i), c_out))
            if i < n_blocks - 1 and size // POOL >= MIN_POOLED_SPATIAL:
                self.segments.append(nn.MaxPool2d(POOL))
                ids_widths.append((slot_name(POST_POOL_ROW, i), c_out))
                size //= POOL
            c_in = c_out
        self.head = nn.Sequential(GlobalAvgPool(), nn.Flatten(), nn.Linear(c_in, num_classes))
        self.positions = self._positions(ids_widths)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        shape = (b, t, self.n_heads, d // self.n_heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: Tensor = self.out(y.transpose(1, 2).reshape(b, t, d))
        return out


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(ln(x)); x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, MLP_EXPANSION * d_model)
        self.fc2 = nn.Linear(MLP_EXPANSION * d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        out: Tensor = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return out


class TokenStem(nn.Module):
    def __init__(self, vocab: int, d_model: int, max_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)

    def forward(self, x: Tensor) -> Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        out: Tensor = self.tok(x) + self.pos(positions)
        return out


class TiedHead(nn.Module):
    """Final LayerNorm and a projection that shares the token embedding's weight."""

    def __init__(self, vocab: int, d_model: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.proj = nn.Linear(d_model, vocab, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.proj(self.norm(x))
        return out


class TransformerHost(HostNetwork):
    """Small causal language model over a byte vocabulary, weight-tied."""

    def __init__(
        self, *, vocab: int, max_len: int, d_model: int, n_heads: int, n_layers: int
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.topology = Topology.TRANSFORMER
        self.stem = TokenStem(vocab, d_model, max_len)
        self.segments = nn.ModuleList(TransformerBlock(d_model, n_heads) for _ in range(n_layers))
        self.head = TiedHead(vocab, d_model)
        self.positions = self._positions(
            [(slot_name(PRE_POOL_ROW, i), d_model) for i in range(n_layers)]
        )

    def finalize(self) -> None:
        assert isinstance(self.head, TiedHead) and isinstance(self.stem, TokenStem)
        self.head.proj.weight = self.stem.tok.weight

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Any:
        # Device/dtype moves may replace Parameter objects; re-tie so they stay shared.
        out = super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        self.finalize()
        return out
