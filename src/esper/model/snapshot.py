"""Governor snapshots: host and fossilized seeds, restored bit-exactly.

A snapshot is a flat ``dict[str, Tensor]`` so it can be saved with ``torch.save`` and
read back with ``weights_only=True``. Besides parameters and buffers it records which
slots hold fossils and their identity (blueprint and seed id as UTF-8 byte tensors,
style/tempo/ages and metrics as small numeric tensors), so a restore can rebuild a
fossil that is missing and drop one the snapshot does not know.

The tensors stay on the model's device: taking a snapshot is one copy per dtype
(every tensor of that dtype packed into one clone, the entries are views of it), with
no device-to-host transfer, so the governor can snapshot every few steps without
stalling a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from esper.core.constants import STYLE_BLEND
from esper.core.enums import GerminationStyle, SeedStage
from esper.model.lifecycle import SeedLifecycle
from esper.model.memory_format import is_channels_last
from esper.model.metrics import SeedMetrics

if TYPE_CHECKING:
    from esper.model.morphogenetic import MorphogeneticModel

HOST = "host/"
FOSSIL = "fossil/"
_STATE = "/state/"
_BLUEPRINT = "/blueprint"
_SEED_ID = "/seed_id"
_INTS = "/ints"
_FLOATS = "/floats"
#: Restored fossils are rebuilt from this seed before their weights are overwritten.
_REBUILD_SEED = 0


def _packed_clone(named: dict[str, Tensor]) -> dict[str, Tensor]:
    """Clones of ``named`` on their device: one copy per dtype, entries are views (a
    channels-last tensor keeps its layout, so packing it copies nothing extra)."""
    out: dict[str, Tensor] = {}
    for dtype in dict.fromkeys([t.dtype for t in named.values()]):
        group = {k: t.detach() for k, t in named.items() if t.dtype == dtype}
        flat = torch.cat(
            [
                (t.permute(0, 2, 3, 1) if is_channels_last(t) else t).reshape(-1)
                for t in group.values()
            ]
        )
        offset = 0
        for k, t in group.items():
            piece = flat[offset : offset + t.numel()]
            if is_channels_last(t):
                o, i, h, w = t.shape
                out[k] = piece.view(o, h, w, i).permute(0, 3, 1, 2)
            else:
                out[k] = piece.view(t.shape)
            offset += t.numel()
    return out


def _text(value: str) -> Tensor:
    return torch.tensor(list(value.encode("utf-8")), dtype=torch.uint8)


def _untext(t: Tensor) -> str:
    return bytes(t.tolist()).decode("utf-8")


def snapshot_model(model: MorphogeneticModel) -> dict[str, Tensor]:
    """The host and the fossils (see the module docstring)."""
    return snapshot_fossils(model, {HOST + k: v for k, v in model.host.state_dict().items()})


def snapshot_fossils(
    model: MorphogeneticModel, extra: dict[str, Tensor] | None = None
) -> dict[str, Tensor]:
    """The fossilized seeds alone (with ``extra`` tensors, cloned with them): what a
    snapshot holds besides a host kept elsewhere (a batched store's rows)."""
    tensors = dict(extra or {})
    fossils = [sid for sid in model.slot_ids if model.slot(sid).stage == SeedStage.FOSSILIZED]
    for sid in fossils:
        for k, v in model.slot(sid).state_dict().items():
            tensors[FOSSIL + sid + _STATE + k] = v
    state = _packed_clone(tensors)
    for sid in fossils:
        slot = model.slot(sid)
        prefix = FOSSIL + sid
        life, m = slot.life, slot.metrics
        state[prefix + _BLUEPRINT] = _text(life.blueprint)
        state[prefix + _SEED_ID] = _text(life.seed_id)
        state[prefix + _INTS] = torch.tensor(
            [int(life.style), life.tempo, life.age_epochs, life.epochs_in_stage], dtype=torch.long
        )
        state[prefix + _FLOATS] = torch.tensor(
            [m.contribution, m.acc_at_germination, m.grad_health, m.grad_norm_ratio],
            dtype=torch.float64,
        )
    return state


def _fossil_ids(state: dict[str, Tensor]) -> set[str]:
    return {
        k[len(FOSSIL) : -len(_BLUEPRINT)]
        for k in state
        if k.startswith(FOSSIL) and k.endswith(_BLUEPRINT)
    }


def _rebuild(model: MorphogeneticModel, sid: str, state: dict[str, Tensor]) -> None:
    prefix = FOSSIL + sid
    style_i, tempo, age, in_stage = state[prefix + _INTS].tolist()
    contribution, acc_germ, health, ratio = state[prefix + _FLOATS].tolist()
    style = GerminationStyle(style_i)
    life = SeedLifecycle(
        stage=SeedStage.FOSSILIZED,
        seed_id=_untext(state[prefix + _SEED_ID]),
        blueprint=_untext(state[prefix + _BLUEPRINT]),
        style=style,
        blend_op=STYLE_BLEND[style],
        tempo=tempo,
        planned_target=1.0,
        age_epochs=age,
        epochs_in_stage=in_stage,
    )
    metrics = SeedMetrics(
        acc_at_germination=acc_germ,
        contribution=contribution,
        grad_health=health,
        grad_norm_ratio=ratio,
    )
    gen = torch.Generator().manual_seed(_REBUILD_SEED)
    seed, gate = model.build_seed_modules(sid, life.blueprint, style, gen)
    model.slot(sid).restore_fossil(seed, gate, life=life, metrics=metrics)


def restore_model(model: MorphogeneticModel, state: dict[str, Tensor]) -> None:
    host_state = {k[len(HOST) :]: v for k, v in state.items() if k.startswith(HOST)}
    model.host.load_state_dict(host_state, strict=True)
    restore_fossils(model, state)


def restore_fossils(model: MorphogeneticModel, state: dict[str, Tensor]) -> None:
    """Put back the snapshot's fossils exactly; drop fossils it does not know."""
    fossils = _fossil_ids(state)
    unknown = fossils - set(model.slot_ids)
    if unknown:
        raise ValueError(f"snapshot has fossils in slots {sorted(unknown)} this model lacks")
    for sid in model.slot_ids:
        slot = model.slot(sid)
        if sid not in fossils:
            if slot.stage == SeedStage.FOSSILIZED:
                slot.clear_for_restore()
            continue
        same = (
            slot.stage == SeedStage.FOSSILIZED
            and slot.life.seed_id == _untext(state[FOSSIL + sid + _SEED_ID])
            and slot.life.blueprint == _untext(state[FOSSIL + sid + _BLUEPRINT])
        )
        if not same:
            _rebuild(model, sid, state)
        prefix = FOSSIL + sid + _STATE
        slot_state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        model.slot(sid).load_state_dict(slot_state, strict=True)
