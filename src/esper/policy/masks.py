"""Action masks for all envs at once: only actions that cannot succeed are masked.

An action cannot succeed when the lifecycle forbids it (no seed to prune, a slot taken)
or when its gate is certain to refuse it by the gate's timing rules: ADVANCE of a
TRAINING seed before G2's minimum epochs, or of a resting blend whose target is not
alpha 1 (G3). Such an ADVANCE only ever earns the invalid-action penalty, and learning
that from the reward cost PPO several refusals per episode (docs/training.md). With a
``steps_left`` deadline, GERMINATE is also masked once too few steps remain for the seed
to blend before the episode's last validation: under the true-terminal episode end such
a seed can only cost parameters.

The slots' state already lives on the host (the round's slot table), so the rules
(:mod:`esper.policy.mask_rules`, torch-free: the telemetry demo uses them too) are
evaluated there as numpy arrays over [N envs, S slots], for all envs at once, and moved
to the policy device in a single transfer. The slot mask is per op ([N, ops, S])
because which slots are legal depends on the op; an op is valid exactly when at least
one slot is legal for it (WAIT is always valid).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor

from esper.core.constants import HEAD_NAMES
from esper.core.records import SlotReport
from esper.model.slot_table import SlotTable
from esper.policy.actions import N_OPS, ActionSpace
from esper.policy.features import SlotSource, slot_columns
from esper.policy.mask_rules import op_mask, slot_op_mask


@dataclass(frozen=True)
class ActionMasks:
    """Bool masks per head; leading dims are [N] for one step or [N, T] once stacked.

    ``slot`` carries an extra ops axis ([..., ops, S]); every other head is [..., size].
    Field names equal the head names so ``getattr(masks, head)`` works.
    """

    op: Tensor
    slot: Tensor
    blueprint: Tensor
    style: Tensor
    tempo: Tensor
    alpha_target: Tensor
    alpha_speed: Tensor
    alpha_curve: Tensor

    @property
    def batch_shape(self) -> torch.Size:
        return self.op.shape[:-1]

    def head(self, name: str) -> Tensor:
        mask: Tensor = getattr(self, name)
        return mask

    def _map(self, fn: Callable[[Tensor], Tensor]) -> ActionMasks:
        return ActionMasks(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})

    def __getitem__(self, idx: Any) -> ActionMasks:
        """Index the leading (env, time) dims of every head."""
        return self._map(lambda t: t[idx])

    def to(self, device: torch.device | str) -> ActionMasks:
        return self._map(lambda t: t.to(device))

    def flatten_batch(self) -> ActionMasks:
        """[N, T, ...] -> [N*T, ...] (a no-op for unstacked masks)."""
        nb = len(self.batch_shape)
        return self._map(lambda t: t.flatten(0, nb - 1)) if nb > 1 else self

    def slot_for_op(self, op: Tensor) -> Tensor:
        """Slot mask of the chosen op: [M, S] for flat masks and ``op`` of shape [M]."""
        idx = op.view(-1, 1, 1).expand(-1, 1, self.slot.shape[-1])
        return self.slot.gather(1, idx).squeeze(1)

    def packed(self) -> Tensor:
        """Every head flattened side by side: [M, total] for flat masks (see unpack)."""
        flat = self.flatten_batch()
        return torch.cat([getattr(flat, n).reshape(flat.op.shape[0], -1) for n in HEAD_NAMES], 1)

    def unpack(self, packed: np.ndarray) -> dict[str, np.ndarray]:
        """Split a host copy of :meth:`packed` back into per-head arrays."""
        flat_shapes = {n: getattr(self, n).shape[len(self.batch_shape) :] for n in HEAD_NAMES}
        out: dict[str, np.ndarray] = {}
        start = 0
        for name in HEAD_NAMES:
            width = int(np.prod(flat_shapes[name]))
            block = packed[:, start : start + width]
            out[name] = block.reshape((packed.shape[0], *flat_shapes[name])).astype(bool)
            start += width
        return out

    def to_host(self) -> dict[str, np.ndarray]:
        """All heads as numpy [M, ...], fetched from the device in one transfer."""
        return self.unpack(self.packed().cpu().numpy())


def stack_masks(masks: Sequence[ActionMasks]) -> ActionMasks:
    """Stack per-step masks [N, ...] over time into [N, T, ...] for the PPO update."""
    if not masks:
        raise ValueError("stack_masks needs at least one step")
    names = [f.name for f in fields(ActionMasks)]
    return ActionMasks(**{n: torch.stack([getattr(m, n) for m in masks], dim=1) for n in names})


def order_reports(env_reports: Sequence[SlotReport], space: ActionSpace) -> Sequence[SlotReport]:
    """The env's reports in the action space's slot order (raises on a mismatch)."""
    if tuple(r.slot_id for r in env_reports) == space.slot_ids:
        return env_reports
    by_id = {r.slot_id: r for r in env_reports}
    missing = [s for s in space.slot_ids if s not in by_id]
    if missing or len(by_id) != space.n_slots:
        raise ValueError(
            f"slot reports {sorted(by_id)} do not match the action space slots {space.slot_ids}"
        )
    return [by_id[s] for s in space.slot_ids]


def build_mask_arrays(
    reports: SlotSource,
    space: ActionSpace,
    *,
    max_seeds: int,
    steps_left: int | None = None,
    prune_after_blending: bool = False,
) -> dict[str, np.ndarray]:
    """Host-side masks for op [N, ops], slot [N, ops, S] and blueprint [N, B].

    ``reports``: a round's slot table (columns in the action space's slot order), or per
    env its reports (any order; matched to the space's slots by id). ``steps_left``:
    steps of the episode still to play, this one included (``None``: no germination
    deadline). ``prune_after_blending``: PRUNE only seeds that have started blending
    (see :data:`esper.core.constants.PRUNABLE_AFTER_BLENDING`)."""
    if not isinstance(reports, SlotTable):
        reports = [order_reports(env, space) for env in reports]
    slot = slot_op_mask(
        slot_columns(reports),
        max_seeds=max_seeds,
        steps_left=steps_left,
        prune_after_blending=prune_after_blending,
    )
    op = op_mask(slot)
    n = slot.shape[0]
    return {"op": op, "slot": slot, **menu_masks(space, n)}


def menu_masks(space: ActionSpace, n: int) -> dict[str, np.ndarray]:
    """The heads whose valid values are the config's menus, the same for every env."""
    return {
        head: np.tile(np.array(valid, dtype=bool), (n, 1))
        for head, valid in (
            ("blueprint", space.blueprint_valid),
            ("alpha_target", space.alpha_target_valid),
            ("style", space.style_valid),
            ("tempo", space.tempo_valid),
        )
    }


def compute_masks(
    reports: SlotSource,
    space: ActionSpace,
    *,
    max_seeds: int,
    device: torch.device | str,
    steps_left: int | None = None,
    prune_after_blending: bool = False,
) -> ActionMasks:
    """Masks for all envs: rules evaluated on the host, one host-to-device transfer."""
    arrays = build_mask_arrays(
        reports,
        space,
        max_seeds=max_seeds,
        steps_left=steps_left,
        prune_after_blending=prune_after_blending,
    )
    n, sizes = arrays["op"].shape[0], space.head_sizes
    menus = ("blueprint", "alpha_target", "style", "tempo")
    parts = [arrays["op"], arrays["slot"].reshape(n, -1), *[arrays[h] for h in menus]]
    packed = torch.from_numpy(np.concatenate(parts, axis=1)).to(device, non_blocking=True)
    widths = [N_OPS, N_OPS * space.n_slots, *[sizes[h] for h in menus]]
    op, slot_flat, *menu_masks = torch.split(packed, widths, dim=1)
    free = {
        name: torch.ones((n, sizes[name]), dtype=torch.bool, device=packed.device)
        for name in ("alpha_speed", "alpha_curve")
    }
    return ActionMasks(
        op=op,
        slot=slot_flat.reshape(n, N_OPS, space.n_slots),
        **dict(zip(menus, menu_masks, strict=True)),
        **free,
    )
