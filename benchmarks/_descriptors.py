"""Which host descriptors a trained family policy uses (``learning.py --family descriptors``).

For each seed's final policy (its checkpoint from ``--family ppo``), at the first step of
the rules table's rounds, every env's observation is changed in one descriptor group at a
time: the group's columns are taken from an env of the *partner* member (the narrow,
doubling hosts and the wide-first, very-wide-last hosts are paired: the members whose best
rules differ). A group the policy uses moves its greedy first choice: which slot it would
grow in, which blueprint, and the probability of germinating now. Swapping every
descriptor at once is the upper bound; the groups that never vary over the family (depth,
a slot's place) are left out: swapping them changes nothing by construction.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esper.config import Config
from esper.core.enums import Initiator, LifecycleOp
from esper.data.tasks import TaskData
from esper.policy.actions import HEAD_INDEX
from esper.policy.features import HOST_LAYOUT, SLOT_HOST_LAYOUT
from esper.training.envs.host_envs import HostEnvs
from esper.training.learning.learner import Learner
from esper.training.learning.policy_factory import build_policy
from esper.training.loop.checkpoint import read_checkpoint
from esper.training.loop.run_setup import action_space_for

#: Each member's partner: the member of the other kind at a similar size.
PARTNERS = {"w2-4-8": "w16-4-64", "w16-4-64": "w2-4-8", "w3-6-12": "w8-4-64", "w8-4-64": "w3-6-12"}
#: Descriptor groups that vary over the family: host-level names and per-slot names.
GROUPS: dict[str, tuple[str, ...]] = {
    "host parameters": ("host_params_log",),
    "slot widths": ("slot_width_log",),
    "slot costs": ("slot_cost",),
    "all descriptors": ("host_params_log", "host_depth", "slot_width_log", "slot_position",
                        "slot_cost"),
}  # fmt: skip


def descriptor_columns(obs_width: int, n_slots: int) -> dict[str, list[int]]:
    """Observation columns of each descriptor name (the descriptors close the row)."""
    width = len(HOST_LAYOUT) + n_slots * len(SLOT_HOST_LAYOUT)
    start = obs_width - width
    cols: dict[str, list[int]] = {name: [start + i] for i, (name, _) in enumerate(HOST_LAYOUT)}
    for k in range(n_slots):
        for j, (name, _) in enumerate(SLOT_HOST_LAYOUT):
            cols.setdefault(name, []).append(
                start + len(HOST_LAYOUT) + k * len(SLOT_HOST_LAYOUT) + j
            )
    return cols


def _greedy(learner: Learner, envs: HostEnvs, obs: torch.Tensor) -> dict[str, np.ndarray]:
    """The frozen policy's first decision of the round on ``obs``: greedy heads, P(germinate)."""
    o = envs.observe(0)
    hidden = learner.policy.initial_hidden(obs.shape[0], learner.device)
    step = learner.policy.act(
        learner.obs_norm.normalize(obs), o.blueprint_ids, o.masks, hidden, deterministic=True
    )
    return {
        "slot": step.actions[:, HEAD_INDEX["slot"]].numpy(),
        "blueprint": step.actions[:, HEAD_INDEX["blueprint"]].numpy(),
        "germinate": step.op_probs[:, LifecycleOp.GERMINATE].numpy().astype(np.float64),
    }


def probe_seed(cfg: Config, checkpoint: Path, data: TaskData, rounds: range) -> dict[str, Any]:
    """Per descriptor group: how often swapping it changes the greedy slot or blueprint,
    and the mean absolute change of P(germinate), over every env of ``rounds``."""
    space = action_space_for(cfg, data)
    learner = Learner(cfg, space, build_policy(cfg, space), frozen=True)
    learner.load_state_dict(read_checkpoint(checkpoint)["learner"])
    envs = HostEnvs(cfg, data, space=space, policy_device=torch.device("cpu"),
                    amp=cfg.run.amp, initiator=Initiator.POLICY)  # fmt: skip
    changed: dict[str, dict[str, list[float]]] = {g: {} for g in GROUPS}
    for rnd in rounds:
        envs.reset(rnd)
        obs = envs.observe(0).obs
        cols = descriptor_columns(obs.shape[1], space.n_slots)
        names = envs.host_names
        partner_row = [names.index(PARTNERS[m]) for m in names]
        base = _greedy(learner, envs, obs)
        for group, fields in GROUPS.items():
            idx = [c for f in fields for c in cols[f]]
            swapped = obs.clone()
            swapped[:, idx] = obs[partner_row][:, idx]
            new = _greedy(learner, envs, swapped)
            row = changed[group]
            row.setdefault("slot", []).extend((new["slot"] != base["slot"]).astype(float))
            row.setdefault("blueprint", []).extend(
                (new["blueprint"] != base["blueprint"]).astype(float)
            )
            row.setdefault("germinate", []).extend(np.abs(new["germinate"] - base["germinate"]))
    return {g: {k: statistics.fmean(v) for k, v in row.items()} for g, row in changed.items()}


def part_name(variant: str, seed: int) -> str:
    return f"descriptors-{variant}-s{seed}"


def summarize(parts_dir: Path, variant: str) -> dict[str, Any]:
    """A variant's stored probes: per group and measure, the mean over its seeds."""
    parts = [json.loads(p.read_text()) for p in sorted(parts_dir.glob("descriptors-*.json"))]
    parts = [p for p in parts if p["variant"] == variant]
    if not parts:
        return {}
    out: dict[str, Any] = {"seeds": [p["seed"] for p in parts], "variant": variant}
    for group in GROUPS:
        out[group] = {
            k: statistics.fmean(p["probe"][group][k] for p in parts)
            for k in ("slot", "blueprint", "germinate")
        }
    return out
