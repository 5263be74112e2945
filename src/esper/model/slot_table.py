"""Struct-of-arrays state of seed slots: one row per env, one column per slot.

Why: with hosts this small a step's time is the Python around the arithmetic, and a
per-slot object graph costs Python per env. So the state of every slot of a round
(stage, identity, alpha ramp, measurements) lives in one :class:`SlotTable` of numpy
arrays ``[n_envs, n_slots]``: the step's ticks, alpha ramps, features, masks and rewards
are array expressions over all envs at once, whatever their number.

The per-slot objects (:class:`~esper.model.lifecycle.SeedLifecycle`,
:class:`~esper.model.alpha.AlphaController`, :class:`~esper.model.metrics.SeedMetrics`)
are :class:`Cell` views of one (env, slot) cell, for the code that needs an object:
lifecycle operations on the few envs that act in a step, reports, snapshots, tests. A
view made on its own (``SeedLifecycle(stage=...)``) owns a private 1 x 1 table, so the
classes keep working as plain values.

The table lives on the host: every decision the lifecycle makes is needed on the host
anyway (a germination builds storage, every change is an event), and the numbers it is
fed (accuracies, gradient norms) arrive there in the step's one transfer. The device
gets the slots' alphas with each host pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Final, Generic, TypeVar, overload

import numpy as np

from esper.core.constants import ALL_BLUEPRINTS
from esper.core.enums import (
    AlphaCurve,
    AlphaMode,
    BlendOp,
    GerminationStyle,
    Initiator,
    SeedStage,
)

STAGES: Final = tuple(SeedStage)
STAGE_CODE: Final = {s: i for i, s in enumerate(STAGES)}
MODES: Final = tuple(AlphaMode)
MODE_CODE: Final = {m: i for i, m in enumerate(MODES)}
BLEND_OPS: Final = tuple(BlendOp)
BLEND_CODE: Final = {b: i for i, b in enumerate(BLEND_OPS)}
INITIATORS: Final = tuple(Initiator)
INITIATOR_CODE: Final = {x: i for i, x in enumerate(INITIATORS)}

#: Blueprint ids: 0 is "no seed", 1 + i is ``ALL_BLUEPRINTS[i]``; a name outside the
#: built-in set (a custom registry's) is given the next free id when first seen.
_BLUEPRINT_IDS: dict[str, int] = {"": 0, **{n: i + 1 for i, n in enumerate(ALL_BLUEPRINTS)}}


def blueprint_id(name: str) -> int:
    """The interned id of a blueprint name (stable for the process)."""
    found = _BLUEPRINT_IDS.get(name)
    if found is None:
        found = _BLUEPRINT_IDS[name] = len(_BLUEPRINT_IDS)
    return found


def code_set(values: Iterable[Any], code: dict[Any, int]) -> np.ndarray:
    """A set of enum members (e.g. of stages) as a lookup table over their codes:
    ``table[column]`` says which cells hold a member. An index, not ``np.isin``, which
    sorts: about 0.1 us against 10 on a round's cells, some 40 times a step."""
    table = np.zeros(max(code.values()) + 1, dtype=bool)
    table[[code[v] for v in values]] = True
    return table


NAN = math.nan
_I: Final = np.int64
_F: Final = np.float64

#: Every column: (dtype, default). Lifecycle, alpha and metrics columns are reset as
#: groups (a new seed, a freed slot), so each group is listed apart.
LIFECYCLE_COLUMNS: Final[dict[str, tuple[Any, Any]]] = {
    "stage": (_I, STAGE_CODE[SeedStage.DORMANT]),
    "seed_id": (object, ""),
    "blueprint": (object, ""),
    "blueprint_id": (_I, 0),
    "style": (_I, int(GerminationStyle.LINEAR_ADD)),
    "blend_op": (_I, BLEND_CODE[BlendOp.ADD]),
    "tempo": (_I, 0),
    "planned_target": (_F, 0.0),
    "age_epochs": (_I, 0),
    "epochs_in_stage": (_I, 0),
    "cooldown_remaining": (_I, 0),
    "scheduled_prune": (np.bool_, False),
}
ALPHA_COLUMNS: Final[dict[str, tuple[Any, Any]]] = {
    "alpha": (_F, 0.0),
    "alpha_start": (_F, 0.0),
    "alpha_target": (_F, 0.0),
    "alpha_mode": (_I, MODE_CODE[AlphaMode.HOLD]),
    "alpha_curve": (_I, int(AlphaCurve.LINEAR)),
    "alpha_steps_total": (_I, 0),
    "alpha_steps_done": (_I, 0),
    "alpha_last_delta": (_F, 0.0),
}
METRICS_COLUMNS: Final[dict[str, tuple[Any, Any]]] = {
    "acc_at_germination": (_F, NAN),
    "acc_at_stage_start": (_F, NAN),
    "last_acc": (_F, NAN),
    "contribution": (_F, NAN),
    "contribution_velocity": (_F, 0.0),
    "epochs_since_contribution": (_I, -1),
    "seed_grad_norm": (_F, NAN),
    "grad_norm_ratio": (_F, NAN),
    "grad_health": (_F, NAN),
}
SLOT_COLUMNS: Final[dict[str, tuple[Any, Any]]] = {
    "n_params": (_I, 0),
    "prune_initiator": (_I, INITIATOR_CODE[Initiator.SYSTEM]),
}
COLUMNS: Final = {**LIFECYCLE_COLUMNS, **ALPHA_COLUMNS, **METRICS_COLUMNS, **SLOT_COLUMNS}


class SlotTable:
    """The columns of :data:`COLUMNS`, each an array ``[n_envs, n_slots]``."""

    stage: np.ndarray
    seed_id: np.ndarray
    blueprint: np.ndarray
    blueprint_id: np.ndarray
    style: np.ndarray
    blend_op: np.ndarray
    tempo: np.ndarray
    planned_target: np.ndarray
    age_epochs: np.ndarray
    epochs_in_stage: np.ndarray
    cooldown_remaining: np.ndarray
    scheduled_prune: np.ndarray
    alpha: np.ndarray
    alpha_start: np.ndarray
    alpha_target: np.ndarray
    alpha_mode: np.ndarray
    alpha_curve: np.ndarray
    alpha_steps_total: np.ndarray
    alpha_steps_done: np.ndarray
    alpha_last_delta: np.ndarray
    acc_at_germination: np.ndarray
    acc_at_stage_start: np.ndarray
    last_acc: np.ndarray
    contribution: np.ndarray
    contribution_velocity: np.ndarray
    epochs_since_contribution: np.ndarray
    seed_grad_norm: np.ndarray
    grad_norm_ratio: np.ndarray
    grad_health: np.ndarray
    n_params: np.ndarray
    prune_initiator: np.ndarray

    def __init__(self, n_envs: int, n_slots: int) -> None:
        self.shape = (n_envs, n_slots)
        for name, (dtype, default) in COLUMNS.items():
            setattr(self, name, np.full(self.shape, default, dtype=dtype))

    def reset(self, group: dict[str, tuple[Any, Any]], row: Any, col: Any) -> None:
        """Put a group of columns back to their defaults at ``[row, col]`` (any index)."""
        for name, (_, default) in group.items():
            getattr(self, name)[row, col] = default

    def copy_row(self, other: SlotTable, src: int, dst: int) -> None:
        """Row ``src`` of ``other`` into row ``dst`` of this table (same slots)."""
        for name in COLUMNS:
            getattr(self, name)[dst] = getattr(other, name)[src]


T = TypeVar("T")


class Column(Generic[T]):
    """A :class:`Cell` attribute stored in a table column, converted to a Python value
    on the way out (numpy scalars never leak into events) and to a code on the way in."""

    def __init__(
        self, column: str, out: Callable[[Any], T], into: Callable[[T], Any] | None = None
    ) -> None:
        self.column = column
        self.out = out
        self.into = into

    @overload
    def __get__(self, obj: None, owner: type) -> Column[T]: ...

    @overload
    def __get__(self, obj: Cell, owner: type) -> T: ...

    def __get__(self, obj: Cell | None, owner: type) -> Column[T] | T:
        if obj is None:
            return self
        return self.out(getattr(obj.table, self.column)[obj.row, obj.col])

    def __set__(self, obj: Cell, value: T) -> None:
        stored = value if self.into is None else self.into(value)
        getattr(obj.table, self.column)[obj.row, obj.col] = stored


class BlueprintColumn(Column[str]):
    """The blueprint name, kept with its id (:func:`blueprint_id`: what the grouping of
    seed kinds and the policy's embedding read)."""

    def __init__(self) -> None:
        super().__init__("blueprint", str)

    def __set__(self, obj: Cell, value: str) -> None:
        obj.table.blueprint[obj.row, obj.col] = value
        obj.table.blueprint_id[obj.row, obj.col] = blueprint_id(value)


def int_column(name: str) -> Column[int]:
    return Column(name, int)


def float_column(name: str) -> Column[float]:
    return Column(name, float)


def bool_column(name: str) -> Column[bool]:
    return Column(name, bool)


def str_column(name: str) -> Column[str]:
    return Column(name, str)


class Cell:
    """A view of one (env, slot) cell of a :class:`SlotTable`.

    ``Cell(table, row, col)`` views an existing cell; ``Cell(**values)`` (no table) owns
    a fresh 1 x 1 table, then sets ``values`` through the view's own attributes. Setting
    ``table``, ``row`` and ``col`` makes it view another cell.
    """

    __slots__ = ("col", "row", "table")

    def __init__(
        self, table: SlotTable | None = None, row: int = 0, col: int = 0, **values: Any
    ) -> None:
        self.table = SlotTable(1, 1) if table is None else table
        self.row = row
        self.col = col
        for name, value in values.items():
            if not hasattr(type(self), name):
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
            setattr(self, name, value)

    def cells(self) -> tuple[np.ndarray, np.ndarray]:
        """This cell as the table operations take cells: ``([row], [col])``."""
        return np.array([self.row]), np.array([self.col])
