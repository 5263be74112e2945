"""Shared builders and hypothesis strategies for the policy tests."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from esper.core.constants import ALL_BLUEPRINTS, HEAD_NAMES
from esper.core.enums import AlphaMode, BlendOp, LifecycleOp, SeedStage, Topology
from esper.core.records import SlotReport
from esper.policy.actions import ActionSpace
from esper.policy.masks import ActionMasks

SLOT_IDS = ("r0c0", "r1c0", "r0c1", "r1c1")
N_OPS = len(LifecycleOp)


def space(n_slots: int = 4, topology: Topology = Topology.CNN) -> ActionSpace:
    return ActionSpace(tuple(f"s{i}" for i in range(n_slots)), topology)


def report(slot_id: str, stage: SeedStage = SeedStage.DORMANT, **kw: object) -> SlotReport:
    return SlotReport(slot_id=slot_id, stage=stage, **kw)  # type: ignore[arg-type]


_maybe_nan = st.one_of(st.just(math.nan), st.floats(-50, 50, allow_nan=False))


@st.composite
def slot_reports(draw: st.DrawFn, slot_id: str) -> SlotReport:
    """Random (not necessarily lifecycle-consistent) reports: masks/features are pure maps."""
    stage = draw(st.sampled_from(list(SeedStage)))
    total = draw(st.integers(0, 8))
    return SlotReport(
        slot_id=slot_id,
        stage=stage,
        seed_id="x" if stage != SeedStage.DORMANT else "",
        blueprint=draw(st.sampled_from(["", *ALL_BLUEPRINTS])),
        blend_op=draw(st.sampled_from(list(BlendOp))),
        alpha=draw(st.floats(0, 1)),
        alpha_target=draw(st.sampled_from([0.0, 0.5, 0.7, 1.0])),
        alpha_mode=draw(st.sampled_from(list(AlphaMode))),
        alpha_curve=draw(st.integers(0, 4)),
        alpha_steps_total=total,
        alpha_steps_done=draw(st.integers(0, total)),
        alpha_velocity=draw(st.floats(-1, 1)),
        tempo=draw(st.sampled_from([0, 3, 5, 8])),
        age_epochs=draw(st.integers(0, 30)),
        epochs_in_stage=draw(st.integers(0, 30)),
        improvement=draw(_maybe_nan),
        contribution=draw(_maybe_nan),
        contribution_velocity=draw(st.floats(-10, 10)),
        epochs_since_contribution=draw(st.integers(-1, 10)),
        grad_norm_ratio=draw(st.one_of(st.just(math.nan), st.floats(0, 100))),
        grad_health=draw(st.one_of(st.just(math.nan), st.floats(0, 1))),
        scheduled_prune=draw(st.booleans()),
    )


@st.composite
def env_reports(draw: st.DrawFn, n_envs: int, slot_ids: tuple[str, ...]) -> list[list[SlotReport]]:
    return [[draw(slot_reports(s)) for s in slot_ids] for _ in range(n_envs)]


@st.composite
def random_masks(draw: st.DrawFn, n_envs: int, sp: ActionSpace) -> ActionMasks:
    """Consistent random masks: WAIT always valid; every valid op has a valid slot.

    Some envs get the "only WAIT is valid" case on purpose.
    """
    sizes = sp.head_sizes
    s = sp.n_slots
    op = torch.zeros(n_envs, N_OPS, dtype=torch.bool)
    slot = torch.zeros(n_envs, N_OPS, s, dtype=torch.bool)
    heads: dict[str, torch.Tensor] = {}
    for e in range(n_envs):
        only_wait = draw(st.booleans())
        op[e, 0] = True
        for o in range(N_OPS):
            row = draw(st.lists(st.booleans(), min_size=s, max_size=s))
            if o > 0 and not only_wait and draw(st.booleans()):
                op[e, o] = True
                row[draw(st.integers(0, s - 1))] = True
            slot[e, o] = torch.tensor(row)
    for name in HEAD_NAMES[2:]:
        rows = []
        for _ in range(n_envs):
            row = draw(st.lists(st.booleans(), min_size=sizes[name], max_size=sizes[name]))
            row[draw(st.integers(0, sizes[name] - 1))] = True
            rows.append(row)
        heads[name] = torch.tensor(rows)
    return ActionMasks(op=op, slot=slot, **heads)


def seeded_masks(n_envs: int, sp: ActionSpace, seed: int) -> ActionMasks:
    """Deterministic consistent random masks (for tests that are not property tests)."""
    g = torch.Generator().manual_seed(seed)
    sizes = sp.head_sizes
    slot = torch.rand(n_envs, N_OPS, sp.n_slots, generator=g) < 0.5
    op = slot.any(-1) & (torch.rand(n_envs, N_OPS, generator=g) < 0.7)
    op[:, 0] = True
    heads = {}
    for name in HEAD_NAMES[2:]:
        m = torch.rand(n_envs, sizes[name], generator=g) < 0.6
        m[:, 0] = True
        heads[name] = m
    return ActionMasks(op=op, slot=slot, **heads)
