"""Which host descriptors a trained family policy uses (``learning.py --family descriptors``).

For each seed's final policy (its checkpoint from ``--family ppo``), frozen, over the rules
table's rounds: the policy plays its episodes as ``esper evaluate`` does, and at every
step the same decision is also taken with one descriptor group of every env's
observation taken from an env of the *partner* member (the narrow, doubling hosts and the
wide-first, very-wide-last hosts are paired: the members whose best rules differ), with
the same recurrent state. A group the policy uses changes its greedy decisions: whether
it germinates now, and where and what. Swapping every descriptor at once is the upper
bound; the groups that never vary over the family (depth, a slot's place) are left out
as groups of their own: swapping them changes nothing by construction.
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
from esper.policy.features import (
    HOST_DIM,
    HOST_LAYOUT,
    SLOT_HOST_DIM,
    SLOT_HOST_LAYOUT,
    obs_dim,
)
from esper.policy.protocol import Hidden
from esper.training.envs.env_results import Observation, PhaseTimes
from esper.training.envs.host_envs import HostEnvs
from esper.training.learning.learner import Learner
from esper.training.learning.policy_factory import build_policy
from esper.training.loop.checkpoint import read_checkpoint
from esper.training.loop.run_setup import action_space_for, configure_torch

#: The heads that say what and where a germination grows.
GROWTH_HEADS = [HEAD_INDEX["slot"], HEAD_INDEX["blueprint"]]
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


def descriptor_columns(n_slots: int) -> dict[str, list[int]]:
    """Observation columns of each descriptor name: the host descriptors close the row
    (``HOST_LAYOUT``, then ``SLOT_HOST_LAYOUT`` once per slot)."""
    at = obs_dim(n_slots, host_features=True) - HOST_DIM - n_slots * SLOT_HOST_DIM
    cols: dict[str, list[int]] = {}
    for name, width in (*HOST_LAYOUT, *SLOT_HOST_LAYOUT * n_slots):
        cols.setdefault(name, []).extend(range(at, at + width))
        at += width
    return cols


def _growth(heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What and where each env would grow, and whether its op is GERMINATE."""
    return heads[:, GROWTH_HEADS], heads[:, HEAD_INDEX["op"]] == LifecycleOp.GERMINATE


def _greedy(learner: Learner, o: Observation, obs: torch.Tensor, hidden: Hidden) -> np.ndarray:
    """The frozen policy's greedy heads on ``obs`` (with ``o``'s masks)."""
    step = learner.policy.act(
        learner.obs_norm.normalize(obs), o.blueprint_ids, o.masks, hidden, deterministic=True
    )
    heads: np.ndarray = step.actions.numpy()
    return heads


def probe_seed(cfg: Config, checkpoint: Path, data: TaskData, rounds: range) -> dict[str, Any]:
    """Per descriptor group, over every step of ``rounds``: the share of steps whose
    greedy op changes when the group is swapped, and of germinations (real or swapped)
    whose op, slot or blueprint changes."""
    configure_torch(cfg)  # threads as in a run
    space = action_space_for(cfg, data)
    learner = Learner(cfg, space, build_policy(cfg, space), frozen=True)
    learner.load_state_dict(read_checkpoint(checkpoint)["learner"])
    envs = HostEnvs(cfg, data, space=space, policy_device=torch.device("cpu"),
                    amp=cfg.run.amp, initiator=Initiator.POLICY)  # fmt: skip
    cols = descriptor_columns(space.n_slots)
    swap = {g: [c for f in fields for c in cols[f]] for g, fields in GROUPS.items()}
    counts = {g: {"steps": 0, "op": 0, "germinations": 0, "growth": 0} for g in GROUPS}
    for rnd in rounds:
        envs.reset(rnd)
        hidden = learner.begin_round(cfg.run.n_envs)
        partner = [envs.host_names.index(PARTNERS[m]) for m in envs.host_names]
        for step in range(cfg.run.episode_length):
            envs.advance(rnd, step, PhaseTimes())
            o = envs.observe(step)
            decision = learner.decide(o, hidden)  # the real decision, as evaluate takes it
            base, grows = _growth(decision.heads)
            for group, idx in swap.items():
                swapped = o.obs.clone()
                swapped[:, idx] = o.obs[partner][:, idx]
                new, new_grows = _growth(_greedy(learner, o, swapped, hidden))
                c = counts[group]
                either = grows | new_grows
                c["steps"] += len(grows)
                c["op"] += int((grows != new_grows).sum())
                c["germinations"] += int(either.sum())
                changed = (grows != new_grows) | (new != base).any(axis=1)
                c["growth"] += int((changed & either).sum())
            envs.step(decision.heads, step)
            hidden = decision.hidden
    return {
        g: {
            "op": c["op"] / c["steps"],
            "growth": c["growth"] / c["germinations"] if c["germinations"] else float("nan"),
            "germinations": c["germinations"],
        }
        for g, c in counts.items()
    }


def part_name(variant: str, seed: int) -> str:
    return f"descriptors-{variant}-s{seed}"


def summarize(parts_dir: Path, variant: str) -> dict[str, Any]:
    """A variant's stored probes, pooled over its seeds: per group the share of steps
    whose op changed and of germinations that changed (a seed whose policy never
    germinates has none to change), and each seed's own shares."""
    parts = [json.loads(p.read_text()) for p in sorted(parts_dir.glob("descriptors-*.json"))]
    parts = [p for p in parts if p["variant"] == variant]
    if not parts:
        return {}
    out: dict[str, Any] = {"seeds": [p["seed"] for p in parts], "variant": variant}
    for group in GROUPS:
        probes = [p["probe"][group] for p in parts]
        germinations = sum(q["germinations"] for q in probes)
        changed = sum(q["growth"] * q["germinations"] for q in probes if q["germinations"])
        out[group] = {
            "op": statistics.fmean(q["op"] for q in probes),
            "growth": changed / germinations if germinations else float("nan"),
            "per_seed": {p["seed"]: p["probe"][group]["growth"] for p in parts},
        }
    return out
