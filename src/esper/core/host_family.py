"""Host families: which member each env trains in a round, and what a policy sees of it.

A family (``[[family.members]]``, :class:`esper.config.FamilyConfig`) makes the right
growth depend on the host: each env draws its host at every reset, and the observation
carries the host's :class:`HostDescriptor` so a policy can condition on it.

The draw is balanced and seeded: envs are taken in blocks of as many envs as there are
members, and each block is one permutation of the members, drawn from (run seed, round,
block). So with ``n_envs`` a multiple of the member count every member trains equally
often in every round, and the member of (seed, round, env) does not depend on the
policy, which keeps runs of different policies paired env by env. Torch-free: the
policy features and the analysis read it too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import msgspec
import numpy as np

#: Separates the family draw's random stream from every other seeded stream.
FAMILY_STREAM: Final = 3_141_592


class SlotDescriptor(msgspec.Struct, frozen=True, kw_only=True):
    """Where a slot sits in its host and what a seed there costs."""

    slot_id: str
    #: Channels a seed in this slot sees (and outputs).
    width: int
    #: The slot's place along the host: 0 after the first segment, 1 after the last.
    position: float


class HostDescriptor(msgspec.Struct, frozen=True, kw_only=True):
    """What a policy may know about the host it grows: its family member and shape."""

    #: Family member name ("" when the run has no family).
    name: str
    #: Trainable host parameters (seeds excluded).
    params: int
    #: Number of blocks (the host's depth).
    depth: int
    slots: tuple[SlotDescriptor, ...]


def member_index(run_seed: int, rnd: int, env: int, n_members: int) -> int:
    """The member env ``env`` (global index) trains in round ``rnd``: a balanced draw."""
    if n_members < 1:
        raise ValueError("a family needs at least one member")
    block, offset = divmod(env, n_members)
    rng = np.random.default_rng([run_seed, rnd, block, FAMILY_STREAM])
    return int(rng.permutation(n_members)[offset])


def slot_cost(width: int, host_params: int) -> float:
    """log10 of a 3x3 convolution's parameters at this width over the host's: how large
    a convolutional seed in this slot is next to the whole host (the accuracy reward
    charges exactly that ratio)."""
    conv = 9 * width * width
    return math.log10(conv / max(host_params, 1))


def positions(segments: int, slot_segments: Sequence[int]) -> list[float]:
    """Each slot's place along the host, from the segment it follows (0 first, 1 last)."""
    last = max(segments - 1, 1)
    return [segment / last for segment in slot_segments]
