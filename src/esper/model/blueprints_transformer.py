"""Seed blueprints for transformer hosts: shape-preserving residual modules on [B, T, D].

As for the CNN seeds, each computes ``x + f(x)`` with the last layer zero-initialised,
so germination is an exact identity. Attention seeds are causal: a seed must never let
a position see the future, or the language-model task would leak its targets.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from esper.core.constants import LORA_LARGE_RANK, LORA_RANK
from esper.model.initialization import zero_init

MLP_SMALL_EXPANSION = 1
MLP_EXPANSION = 4
#: Heads of the attention seed (reduced to a divisor of the width when needed).
ATTENTION_SEED_HEADS = 2


def _heads_for(width: int, wanted: int) -> int:
    return max(h for h in range(1, wanted + 1) if width % h == 0)


class TokenNormSeed(nn.Module):
    """x + LayerNorm(x) with zero affine: a learned per-feature re-normalisation."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = zero_init(nn.LayerNorm(width))

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.norm(x)
        return out


class LoRASeed(nn.Module):
    """Low-rank residual update x + B(A(x)), B zero-initialised (rank capped at width)."""

    def __init__(self, width: int, rank: int) -> None:
        super().__init__()
        r = min(rank, width)
        self.down = nn.Linear(width, r, bias=False)
        self.up = zero_init(nn.Linear(r, width, bias=False))

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.up(self.down(x))
        return out


class LoRASmallSeed(LoRASeed):
    """LoRA update of rank LORA_RANK."""

    def __init__(self, width: int) -> None:
        super().__init__(width, LORA_RANK)


class LoRALargeSeed(LoRASeed):
    """LoRA update of rank LORA_LARGE_RANK."""

    def __init__(self, width: int) -> None:
        super().__init__(width, LORA_LARGE_RANK)


class CausalAttentionSeed(nn.Module):
    """Pre-norm causal self-attention with a zero-initialised output projection."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.n_heads = _heads_for(width, ATTENTION_SEED_HEADS)
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = zero_init(nn.Linear(width, width))

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=-1)
        shape = (b, t, self.n_heads, d // self.n_heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: Tensor = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        return out


class MLPSeed(nn.Module):
    """Pre-norm position-wise MLP with a zero-initialised output layer."""

    def __init__(self, width: int, expansion: int) -> None:
        super().__init__()
        hidden = width * expansion
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = zero_init(nn.Linear(hidden, width))

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.fc2(F.gelu(self.fc1(self.norm(x))))
        return out


class MLPSmallSeed(MLPSeed):
    """Position-wise MLP with hidden width = model width."""

    def __init__(self, width: int) -> None:
        super().__init__(width, MLP_SMALL_EXPANSION)


class MLPLargeSeed(MLPSeed):
    """Position-wise MLP with a 4x hidden expansion."""

    def __init__(self, width: int) -> None:
        super().__init__(width, MLP_EXPANSION)


TRANSFORMER_BLUEPRINT_CLASSES: dict[str, type[nn.Module]] = {
    "norm": TokenNormSeed,
    "lora": LoRASmallSeed,
    "lora_large": LoRALargeSeed,
    "attention": CausalAttentionSeed,
    "mlp_small": MLPSmallSeed,
    "mlp": MLPLargeSeed,
}
