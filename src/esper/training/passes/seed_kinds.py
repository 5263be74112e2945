"""Which seed kinds run where in a batched pass, and the indices that move their rows
and tensors (the pass's :class:`SeedPlan`).

Why: a seed kind (blueprint, stage class, blend operator where the forward reads it,
trainability) is one vmapped call per slot, and the kinds change at nearly every step (any env
that acts changes them). So the grouping is made for every pass from the slot table's
columns for all (row, slot) cells at once, with a few array operations; Python runs once
per kind only to name its template module. A batch then gathers every kind's seed
tensors with one index, scatters their gradients back with one, and regroups each
slot's rows with one (``slot_groups.HostBatch``), however many kinds there are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from esper.core.enums import BlendOp, SeedStage
from esper.model.lifecycle import BLENDED_CODES
from esper.model.slot import SeedSlot
from esper.model.slot_table import BLEND_CODE, STAGE_CODE
from esper.training.passes.flat_layout import FlatLayout
from esper.training.passes.host_store import HostStore

_TRAINING = STAGE_CODE[SeedStage.TRAINING]
_GATE = BLEND_CODE[BlendOp.GATE]
_N_BLEND = len(BLEND_CODE)


@dataclass(frozen=True, eq=False)
class SeedKind:
    """The rows of one seed kind at one slot, and where their tensors live."""

    slot_id: str
    rows: np.ndarray  # positions in the batch
    store_rows: np.ndarray  # their envs' rows of the store
    module: SeedSlot  # the forward code (a member's slot)
    layout: FlatLayout  # the kind's tensors, relative to ``offset`` in the seed store
    offset: int
    trainable: bool


#: Kinds by signature (key, batch rows, their envs): a pass reuses the last such pass's
#: kind while its signature holds (its template slot, layout and trainability do).
Seen = dict[tuple[object, ...], SeedKind]


@dataclass(frozen=True)
class _Cells:
    """The (row, slot) cells whose seed runs in the pass, kind after kind: kinds slot
    after slot, each in order of its first row, rows in order within a kind."""

    rows: np.ndarray  # batch rows
    cols: np.ndarray  # slot columns
    offsets: np.ndarray  # each cell's seed: its first column of the seed store
    widths: np.ndarray  # and its number of columns
    stepping: np.ndarray  # trains and has an optimizer (its SGD steps)
    counts: list[int]  # cells per kind
    trains: bool  # some cell's seed trains


def group_seeds(
    store: HostStore, members: np.ndarray, *, train: bool, previous: Seen
) -> tuple[dict[str, list[SeedKind]], SeedPlan, Seen]:
    """The seed kinds at each slot for batch rows ``members`` (store rows), the plan
    of their indices, and the kinds by signature (the next pass's ``previous``)."""
    t, slot_ids = store.table.slots, store.envs[0].model.slot_ids
    rows = store.rows[members]  # the batch rows' table rows
    stage = t.stage[rows]
    training = stage == _TRAINING
    cols, pos = np.nonzero((BLENDED_CODES[stage] | (train & training)).T)  # slot after slot
    at = rows[pos]
    training = training[pos, cols]
    blueprint, blend = t.blueprint_id[at, cols], t.blend_op[at, cols]
    trainable = ~t.scheduled_prune[at, cols]
    stepping = trainable & store.table.seed_sgd[at, cols]
    # The kind's key (slot, blueprint, stage class, blend operator, trainability) as
    # one integer per cell: a 1-d unique, not one over rows. What the forward does not
    # read stays out: a TRAINING seed's blend operator (its output is the host's, its
    # layout has no gate) and whether the seed steps (the SGD step picks its cells).
    blend_key = np.where(training, 0, blend)
    key = (((blueprint * 2 + training) * _N_BLEND + blend_key) * 2 + trainable) * len(slot_ids)
    key += cols
    first, inverse, counts = np.unique(
        key, return_index=True, return_inverse=True, return_counts=True
    )[1:]
    order = np.argsort(first, kind="stable")  # kinds in order of their first cell
    by_kind = np.argsort(np.argsort(order)[inverse], kind="stable")
    gated = (blend == _GATE) & ~training
    seeds = store.seeds
    widths = seeds.seed_width_of[cols, blueprint] + seeds.gate_width[cols] * gated
    cells = _Cells(
        rows=pos[by_kind],
        cols=cols[by_kind],
        offsets=seeds.offset_of[cols, blueprint][by_kind],
        widths=widths[by_kind],
        stepping=stepping[by_kind],
        counts=counts[order].tolist(),
        trains=bool(trainable.any()),
    )
    kinds: dict[str, list[SeedKind]] = {s: [] for s in slot_ids}
    seen: Seen = {}
    start = 0
    for k, count in zip(order, cells.counts, strict=True):
        batch_rows = cells.rows[start : start + count]
        env_rows = members[batch_rows]
        col = cols[first[k]]
        start += count
        signature = (int(key[first[k]]), batch_rows.tobytes(), env_rows.tobytes())
        kind = previous.get(signature)
        if kind is None:
            kind = _kind(store, env_rows, batch_rows, col, train=train)
        seen[signature] = kind
        kinds[slot_ids[col]].append(kind)
    return kinds, SeedPlan(store, members, cells, train=train), seen


def _kind(
    store: HostStore, env_rows: np.ndarray, batch_rows: np.ndarray, col: int, *, train: bool
) -> SeedKind:
    t = store.table.slots
    # Its code runs on the first member's slot in training, the last's in evaluation,
    # so each keeps its mode across passes (``HostBatch.set_modes``).
    lead = int(env_rows[0 if train else -1])
    row = int(store.rows[lead])
    slot = store.envs[lead].model.slots_in_order[col]
    seg = store.segment(slot.slot_id, str(t.blueprint[row, col]))
    with_gate = t.blend_op[row, col] == _GATE and t.stage[row, col] != _TRAINING
    return SeedKind(
        slot_id=slot.slot_id,
        rows=batch_rows,
        store_rows=env_rows,
        module=slot,
        layout=seg.layout(bool(with_gate)),
        offset=seg.offset,
        trainable=not t.scheduled_prune[row, col],
    )


class SeedPlan:
    """Where a pass's seed kinds read and write (module docstring).

    ``gather``: the flat positions in the seed store of every kind's [rows, columns],
    kind after kind (``sizes`` each); ``first``: each slot's first kind; ``order``: per
    slot with several kinds or rows passing through, the kinds' batch rows, kind after
    kind, and the kinds' sizes; ``stepping``: the flat positions of the seeds whose SGD
    steps (training only)."""

    def __init__(
        self, store: HostStore, members: np.ndarray, cells: _Cells, *, train: bool
    ) -> None:
        counts = np.asarray(cells.counts, dtype=np.int64)
        kind_starts = np.cumsum(counts) - counts
        sizes = np.add.reduceat(cells.widths, kind_starts) if len(counts) else counts
        self.sizes: list[int] = sizes.tolist()
        self.trained = train and cells.trains
        # Each cell's seed: columns ``offsets .. + widths`` of its env's store row.
        starts = members[cells.rows] * store.seeds.width + cells.offsets
        steps = cells.stepping if train else np.zeros(len(starts), dtype=bool)
        # Each slot's first kind and first cell (kinds and cells run slot after slot).
        slot_ids = store.envs[0].model.slot_ids
        slot_kinds = np.searchsorted(cells.cols[kind_starts], np.arange(len(slot_ids) + 1))
        slot_cells = np.append(kind_starts, len(cells.rows))[slot_kinds]
        # Every index the pass needs goes to the device at once (per cell, not per
        # tensor element: the element positions are made there), then split.
        indices = [starts, cells.widths, starts[steps], cells.widths[steps]]
        regroup = {}
        self.first: dict[str, int] = {}
        n_rows = len(members)
        for col in np.flatnonzero(np.diff(slot_kinds)):  # the slots with seeds to run
            slot_id, (a, b) = slot_ids[col], slot_kinds[col : col + 2]
            self.first[slot_id] = int(a)
            slot_rows = cells.rows[slot_cells[col] : slot_cells[col + 1]]
            if b - a == 1 and len(slot_rows) == n_rows:
                continue  # one kind for every row: no regrouping
            indices.append(slot_rows)
            regroup[slot_id] = cells.counts[a:b]
        moved = torch.split(_on(store.device, np.concatenate(indices)), [len(i) for i in indices])
        self.gather = _ragged_range(moved[0], moved[1], int(cells.widths.sum()))
        n_stepping = int(cells.widths[steps].sum())
        self.stepping = _ragged_range(moved[2], moved[3], n_stepping) if n_stepping else None
        self.order: dict[str, tuple[Tensor, list[int]]] = {
            slot_id: (moved[4 + i], sizes) for i, (slot_id, sizes) in enumerate(regroup.items())
        }


def _ragged_range(starts: Tensor, widths: Tensor, total: int) -> Tensor:
    """``starts[i] .. starts[i] + widths[i]`` for every i, end to end (``total``
    elements, known on the host: no sync), made where the tensors are."""
    ends = widths.cumsum(0)
    shift = torch.repeat_interleave(starts - ends + widths, widths, output_size=total)
    return torch.arange(total, device=starts.device) + shift


def _on(device: torch.device, index: np.ndarray) -> Tensor:
    """An index array as a long tensor on the device (not cached: a plan keeps it)."""
    return torch.from_numpy(index.astype(np.int64)).to(device, non_blocking=True)
