"""Blend operators that mix a seed's output ``s`` into the host activation ``h``.

``x`` is what the seed read (the host activation at the slot) and ``alpha`` a float or
a per-sample tensor broadcastable to ``h`` (the fused counterfactual forward gives every
sample its own alpha). At alpha 0 every operator returns ``h`` exactly.

- ADD: lerp(h, s, alpha)
- MULTIPLY: h * (1 + alpha * tanh(s - x)); seeds are residual (s = x + f(x), f zero at
  init) so the multiplicative factor starts at exactly 1.
- GATE: lerp(h, s, clamp(alpha * g(x), 0, 1)) with g a tiny learned gate.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from esper.core.enums import BlendOp, Topology

#: Gate hidden width = max(GATE_MIN_HIDDEN, width // GATE_REDUCTION).
GATE_REDUCTION = 4
GATE_MIN_HIDDEN = 4


class BlendGate(nn.Module):
    """g(x): pool -> Linear -> ReLU -> Linear -> sigmoid, one weight per sample.

    For images the pool is a global average over space. For causal sequences the
    "pool" is per position: pooling over time would leak future tokens into the past.
    """

    def __init__(self, width: int, topology: Topology) -> None:
        super().__init__()
        hidden = max(GATE_MIN_HIDDEN, width // GATE_REDUCTION)
        self.topology = topology
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, x: Tensor) -> Tensor:
        if self.topology == Topology.CNN:
            pooled = x.mean(dim=(2, 3))
            return torch.sigmoid(self.fc2(torch.relu(self.fc1(pooled)))).view(-1, 1, 1, 1)
        return torch.sigmoid(self.fc2(torch.relu(self.fc1(x))))


def _as_weight(alpha: float | Tensor, like: Tensor) -> float | Tensor:
    return alpha.to(like.dtype) if isinstance(alpha, Tensor) else alpha


def blend(
    op: BlendOp,
    h: Tensor,
    s: Tensor,
    x: Tensor,
    alpha: float | Tensor,
    gate: BlendGate | None = None,
) -> Tensor:
    """Mix ``s`` into ``h`` with operator ``op`` at strength ``alpha``.

    ``s`` is cast to ``h``'s dtype: under autocast a seed may return float32 (e.g. after
    a norm layer) while the host stream is float16, and the output keeps the host dtype.
    """
    s = s.to(h.dtype)
    if op == BlendOp.ADD:
        return torch.lerp(h, s, _as_weight(alpha, h))
    if op == BlendOp.MULTIPLY:
        return h * (1.0 + _as_weight(alpha, h) * torch.tanh(s - x))
    if op == BlendOp.GATE:
        if gate is None:
            raise ValueError("GATE blending needs a gate module")
        weight = torch.clamp(_as_weight(alpha, h) * gate(x).to(h.dtype), 0.0, 1.0)
        return torch.lerp(h, s, weight)
    raise ValueError(f"unknown blend operator {op!r}")


def straight_through(h: Tensor, s: Tensor) -> Tensor:
    """TRAINING: numerically ``h``, but ``s`` receives the gradient that ``h`` gets."""
    s = s.to(h.dtype)
    return h + (s - s.detach())
