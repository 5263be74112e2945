"""The factored action space and the pure decoding of head indices into a lifecycle call.

A policy emits one index per head (``HEAD_NAMES`` order). Which heads matter depends on
the op (``RELEVANT_HEADS``); the others are pinned to ``CANONICAL_HEAD_VALUE`` so a
decoded action never carries a value the op does not use.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Final

import msgspec
import numpy as np

from esper.core.constants import (
    ALL_BLUEPRINTS,
    ALPHA_SPEEDS,
    ALPHA_TARGETS,
    CANONICAL_HEAD_VALUE,
    CNN_BLUEPRINTS,
    HEAD_NAMES,
    RELEVANT_HEADS,
    TEMPOS,
    TRANSFORMER_BLUEPRINTS,
)
from esper.core.enums import AlphaCurve, GerminationStyle, LifecycleOp, Topology

#: Sizes of the heads that do not depend on the host (every head except ``slot``).
HEAD_SIZES: Final[dict[str, int]] = {
    "op": len(LifecycleOp),
    "blueprint": len(ALL_BLUEPRINTS),
    "style": len(GerminationStyle),
    "tempo": len(TEMPOS),
    "alpha_target": len(ALPHA_TARGETS),
    "alpha_speed": len(ALPHA_SPEEDS),
    "alpha_curve": len(AlphaCurve),
}
N_OPS: Final = len(LifecycleOp)
N_HEADS: Final = len(HEAD_NAMES)
STYLES: Final = tuple(GerminationStyle)
#: Every head's size in head order, the slot head's (the host's) left 0.
_FIXED_SIZES: Final = tuple(HEAD_SIZES.get(name, 0) for name in HEAD_NAMES)
#: Per op, the canonical values of the heads it does not use.
_CANONICAL_FILL: Final = {
    op: {n: CANONICAL_HEAD_VALUE[n] for n in HEAD_NAMES if n not in RELEVANT_HEADS[op]}
    for op in LifecycleOp
}
HEAD_INDEX: Final[dict[str, int]] = {name: i for i, name in enumerate(HEAD_NAMES)}

TOPOLOGY_BLUEPRINTS: Final[dict[Topology, tuple[str, ...]]] = {
    Topology.CNN: CNN_BLUEPRINTS,
    Topology.TRANSFORMER: TRANSFORMER_BLUEPRINTS,
}


#: The values the value-indexing heads choose from, as arrays (for a column of envs).
HEAD_VALUES: Final[dict[str, np.ndarray]] = {
    "alpha_target": np.array(ALPHA_TARGETS),
    "alpha_speed": np.array(ALPHA_SPEEDS),
}


def head_column(heads: np.ndarray, name: str, *, n_slots: int = 0) -> np.ndarray:
    """Head ``name``'s indices in ``heads`` (one row of head indices per env), range
    checked as :func:`decode_action` checks one env's (``n_slots``: the slot head's
    size, the host's)."""
    column: np.ndarray = heads[:, HEAD_INDEX[name]]
    size = n_slots if name == "slot" else HEAD_SIZES[name]
    if not np.all((column >= 0) & (column < size)):
        raise ValueError(f"head {name!r} index out of range [0, {size}): {column.tolist()}")
    return column


def head_sizes(n_slots: int) -> dict[str, int]:
    """Every head's size, in ``HEAD_NAMES`` order, for a host with ``n_slots`` slots."""
    return {name: (n_slots if name == "slot" else HEAD_SIZES[name]) for name in HEAD_NAMES}


class ActionSpace(msgspec.Struct, frozen=True):
    """The slots a host offers (in head order), its topology (which blueprints exist),
    the blueprints the policy may germinate (``None``: all the topology offers) and the
    alpha targets, germination styles and tempos it may choose (``None``: all)."""

    slot_ids: tuple[str, ...]
    topology: Topology
    blueprints: tuple[str, ...] | None = None
    alpha_targets: tuple[float, ...] | None = None
    styles: tuple[GerminationStyle, ...] | None = None
    tempos: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.slot_ids:
            raise ValueError("an action space needs at least one slot")
        if len(set(self.slot_ids)) != len(self.slot_ids):
            raise ValueError(f"duplicate slot ids: {self.slot_ids}")
        if self.blueprints is not None and not any(self.blueprint_valid):
            offered = ", ".join(TOPOLOGY_BLUEPRINTS[self.topology])
            raise ValueError(
                f"none of the blueprints {list(self.blueprints)} is offered by a "
                f"{self.topology.value} host (it offers: {offered})"
            )
        menus = (
            ("alpha targets", self.alpha_targets, ALPHA_TARGETS, self.alpha_target_valid),
            ("styles", self.styles, STYLES, self.style_valid),
            ("tempos", self.tempos, TEMPOS, self.tempo_valid),
        )
        for what, menu, values, valid in menus:
            if menu is not None and not any(valid):
                raise ValueError(f"none of the {what} {list(menu)} is one of {list(values)}")

    @property
    def n_slots(self) -> int:
        return len(self.slot_ids)

    @property
    def head_sizes(self) -> dict[str, int]:
        return head_sizes(self.n_slots)

    @property
    def blueprint_valid(self) -> tuple[bool, ...]:
        """Per blueprint-head index: may this host's policy germinate this blueprint?"""
        return _blueprint_valid(self.topology, self.blueprints)

    @property
    def alpha_target_valid(self) -> tuple[bool, ...]:
        """Per alpha-target-head index: may the policy choose this target?"""
        return _in_menu(ALPHA_TARGETS, self.alpha_targets)

    @property
    def style_valid(self) -> tuple[bool, ...]:
        """Per style-head index: may the policy germinate with this style?"""
        return _in_menu(STYLES, self.styles)

    @property
    def tempo_valid(self) -> tuple[bool, ...]:
        """Per tempo-head index: may the policy germinate with this blend tempo?"""
        return _in_menu(TEMPOS, self.tempos)

    def slot_index(self, slot_id: str) -> int:
        return self.slot_ids.index(slot_id)


# The menus' validity is asked every step (the masks) and a config's menus never change:
# computed once per menus.
@functools.cache
def _in_menu(values: Sequence[object], menu: Sequence[object] | None) -> tuple[bool, ...]:
    return tuple(menu is None or value in menu for value in values)


@functools.cache
def _blueprint_valid(topology: Topology, blueprints: tuple[str, ...] | None) -> tuple[bool, ...]:
    allowed = set(TOPOLOGY_BLUEPRINTS[topology])
    if blueprints is not None:
        allowed &= set(blueprints)
    return tuple(name in allowed for name in ALL_BLUEPRINTS)


class DecodedAction(msgspec.Struct, frozen=True, kw_only=True):
    """One env's action as lifecycle arguments; unused fields hold canonical values."""

    op: LifecycleOp
    slot_id: str | None = None
    blueprint: str | None = None
    style: GerminationStyle = GerminationStyle(CANONICAL_HEAD_VALUE["style"])
    tempo: int = TEMPOS[CANONICAL_HEAD_VALUE["tempo"]]
    alpha_target: float = ALPHA_TARGETS[CANONICAL_HEAD_VALUE["alpha_target"]]
    alpha_speed: int = ALPHA_SPEEDS[CANONICAL_HEAD_VALUE["alpha_speed"]]
    alpha_curve: AlphaCurve = AlphaCurve(CANONICAL_HEAD_VALUE["alpha_curve"])

    @property
    def relevant_heads(self) -> frozenset[str]:
        return RELEVANT_HEADS[self.op]


def decode_action(indices: Sequence[int], space: ActionSpace) -> DecodedAction:
    """Turn per-head indices into a typed action (pure; irrelevant heads -> canonical)."""
    if len(indices) != N_HEADS:
        raise ValueError(f"expected {N_HEADS} head indices, got {len(indices)}")
    values = list(map(int, indices))
    sizes = list(_FIXED_SIZES)
    sizes[HEAD_INDEX["slot"]] = space.n_slots
    for name, idx, size in zip(HEAD_NAMES, values, sizes, strict=True):
        if not 0 <= idx < size:
            raise ValueError(f"head {name!r} index {idx} out of range [0, {size})")
    op = LifecycleOp(values[0])
    rel = RELEVANT_HEADS[op]
    # Heads the op does not use take their canonical values.
    v = dict(zip(HEAD_NAMES, values, strict=True)) | _CANONICAL_FILL[op]
    return DecodedAction(
        op=op,
        slot_id=space.slot_ids[v["slot"]] if "slot" in rel else None,
        blueprint=ALL_BLUEPRINTS[v["blueprint"]] if "blueprint" in rel else None,
        style=GerminationStyle(v["style"]),
        tempo=TEMPOS[v["tempo"]],
        alpha_target=ALPHA_TARGETS[v["alpha_target"]],
        alpha_speed=ALPHA_SPEEDS[v["alpha_speed"]],
        alpha_curve=AlphaCurve(v["alpha_curve"]),
    )


def encode_action(action: DecodedAction, space: ActionSpace) -> tuple[int, ...]:
    """Inverse of :func:`decode_action`: head indices for a typed action."""
    rel = action.relevant_heads
    values: dict[str, int] = {
        "op": int(action.op),
        "slot": space.slot_index(action.slot_id) if action.slot_id is not None else 0,
        "blueprint": ALL_BLUEPRINTS.index(action.blueprint) if action.blueprint else 0,
        "style": int(action.style),
        "tempo": TEMPOS.index(action.tempo),
        "alpha_target": ALPHA_TARGETS.index(action.alpha_target),
        "alpha_speed": ALPHA_SPEEDS.index(action.alpha_speed),
        "alpha_curve": int(action.alpha_curve),
    }
    for name in ("slot", "blueprint"):
        if name in rel and {"slot": action.slot_id, "blueprint": action.blueprint}[name] is None:
            raise ValueError(f"{action.op.name} needs a {name}")
    return tuple(values[n] if n in rel else CANONICAL_HEAD_VALUE[n] for n in HEAD_NAMES)
