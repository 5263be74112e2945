"""The shape of a synthetic stream: seeds, lifecycle events and every event's ``seq``.

Kept apart from the table writers (:mod:`esper_analysis.synth`) so the seq layout, the
only subtle part, can be read on its own. Order of events in one round: round_started;
for each step, for each env: env_step, action_taken, reward_computed,
counterfactual_computed, an optional governor_rollback, then that cell's lifecycle
events; then episode_finished per env, round_finished and ppo_update.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Final

import numpy as np
import polars as pl

from esper.core.constants import ALL_BLUEPRINTS

SYNTH_SLOTS: Final = ("r0c0", "r0c1", "r0c2")
#: Events per env-step at level normal: env_step, action, reward, counterfactual.
PER_STEP: Final = 4
#: Events after the cells of a round, besides one episode_finished per env.
ROUND_TAIL: Final = 2
GERMINATE_P: Final = 0.6
PRUNE_P: Final = 0.35
#: Transition index of a move to PRUNED (0..3 leave live stage k for k+1).
PRUNE_K: Final = -1
Arrays = dict[str, Any]


def candidates(rng: np.random.Generator, rounds: int, n_envs: int, length: int) -> Arrays:
    """One candidate seed per (round, env, slot): germination step, stage durations, fate."""
    n = rounds * n_envs * len(SYNTH_SLOTS)
    idx = np.arange(n)
    germ = rng.random(n) < GERMINATE_P
    g = rng.integers(0, max(1, length // 2), n)
    dur = np.stack(
        [np.ones(n, np.int64), rng.integers(2, 7, n), rng.integers(2, 7, n), rng.integers(2, 5, n)],
        axis=1,
    )
    trans = g[:, None] + np.cumsum(dur, axis=1)  # step at which live stage k is left
    p_stage = rng.integers(1, 4, n)  # stage pruned in: TRAINING, BLENDING or HOLDING
    prune_step = trans[idx, p_stage - 1] + dur[idx, p_stage] // 2
    wants_prune = rng.random(n) < PRUNE_P
    return {
        "round": idx // (len(SYNTH_SLOTS) * n_envs),
        "env": (idx // len(SYNTH_SLOTS)) % n_envs,
        "slot": idx % len(SYNTH_SLOTS),
        "g": g,
        "dur": dur,
        "trans": trans,
        "germ": germ & (g < length),
        "pruned": germ & wants_prune & (prune_step < length),
        "p_stage": np.where(wants_prune, p_stage, 9),
        "prune_step": prune_step,
        "fossil": germ & ~wants_prune & (trans[:, 3] < length),
        "blueprint": rng.integers(0, len(ALL_BLUEPRINTS), n),
        "contribution": np.where(wants_prune, rng.normal(-0.5, 1.0, n), rng.normal(2.0, 1.0, n)),
    }


def lifecycle_rows(c: Arrays, length: int) -> dict[str, dict[str, np.ndarray]]:
    """Candidate index, step and transition index ``k`` of every lifecycle event.

    ``k`` 0..3 leaves live stage k (into k+1); ``k == -1`` is the move to PRUNED.
    """
    parts: dict[str, list[dict[str, np.ndarray]]] = {}

    def add(kind: str, i: np.ndarray, step: np.ndarray, k: int) -> None:
        parts.setdefault(kind, []).append({"i": i, "step": step, "k": np.full(len(i), k)})

    i = np.flatnonzero(c["germ"])
    add("seed_germinated", i, c["g"][i], 0)
    for k in range(4):
        alive = c["germ"] & (c["trans"][:, k] < length) & (k < c["p_stage"])
        i = np.flatnonzero(alive & ~(c["pruned"] & (c["prune_step"] <= c["trans"][:, k])))
        add("seed_stage_changed", i, c["trans"][i, k], k)
        add("gate_evaluated", i, c["trans"][i, k], k)
    i = np.flatnonzero(c["pruned"])
    add("seed_stage_changed", i, c["prune_step"][i], PRUNE_K)
    add("seed_pruned", i, c["prune_step"][i], PRUNE_K)
    i = np.flatnonzero(c["fossil"])
    add("seed_fossilized", i, c["trans"][i, 3], 3)
    return {
        t: {key: np.concatenate([p[key] for p in ps]) for key in ps[0]} for t, ps in parts.items()
    }


@dataclasses.dataclass
class Plan:
    """Grid shape and the seq of every event, derived from per-cell event counts."""

    rounds: int
    n_envs: int
    length: int
    run_id: str
    t0_ns: int
    cell_base: np.ndarray  # (R*L*E,) seq of each (round, step, env) cell's first event
    round_start: np.ndarray  # (R,) seq of round_started
    round_end: np.ndarray  # (R,) seq of the first end-of-round event
    rollback_cells: np.ndarray  # cell ids with a governor_rollback
    lifecycle_seq: dict[str, np.ndarray]
    last_seq: int

    def cell(self, r: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
        return np.asarray((r * self.length + s) * self.n_envs + e)

    def grid(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """round, step, env of every cell in cell order."""
        cells = np.arange(self.rounds * self.length * self.n_envs)
        e = cells % self.n_envs
        s = (cells // self.n_envs) % self.length
        return cells // (self.n_envs * self.length), s, e

    def envelope(self, r: np.ndarray, e: np.ndarray, s: np.ndarray, seq: np.ndarray) -> Arrays:
        n = len(seq)
        return {
            "run_id": pl.repeat(self.run_id, n, eager=True),
            "seq": seq,
            "ts_ns": self.t0_ns + seq * 1_000,
            "rank": np.zeros(n, np.int64),
            "round": r,
            "env": e,
            "step": s,
        }


def plan_stream(
    run_id: str, c: Arrays, rows: Arrays, rollback_cells: np.ndarray, shape: tuple[int, int, int]
) -> Plan:
    """Seq of every event: per-cell counts -> cumulative offsets within each round."""
    rounds, n_envs, length = shape
    n_cells = rounds * length * n_envs
    lc_cells, lc_keys = [], []
    for type_order, t in enumerate(sorted(rows)):
        i = rows[t]["i"]
        lc_cells.append((c["round"][i] * length + rows[t]["step"]) * n_envs + c["env"][i])
        lc_keys.append(type_order * (1 << 40) + i)
    cells = np.concatenate(lc_cells)
    order = np.lexsort((np.concatenate(lc_keys), cells))
    has_rb = np.zeros(n_cells, np.int64)
    has_rb[rollback_cells] = 1
    per_cell = PER_STEP + has_rb + np.bincount(cells, minlength=n_cells)
    per_round = per_cell.reshape(rounds, -1).sum(axis=1) + 1 + n_envs + ROUND_TAIL
    round_start = 1 + np.concatenate([[0], np.cumsum(per_round)[:-1]])
    by_round = per_cell.reshape(rounds, -1)
    within = np.cumsum(by_round, axis=1) - by_round
    cell_base = (within + round_start[:, None] + 1).reshape(-1)
    round_end = round_start + per_round - n_envs - ROUND_TAIL
    sorted_cells = cells[order]
    first = np.searchsorted(sorted_cells, sorted_cells, side="left")
    seq_sorted = (
        cell_base[sorted_cells] + PER_STEP + has_rb[sorted_cells] + (np.arange(len(order)) - first)
    )
    seq = np.empty(len(order), np.int64)
    seq[order] = seq_sorted
    lifecycle_seq, start = {}, 0
    for t, cell_part in zip(sorted(rows), lc_cells, strict=True):
        lifecycle_seq[t] = seq[start : start + len(cell_part)]
        start += len(cell_part)
    return Plan(
        rounds=rounds,
        n_envs=n_envs,
        length=length,
        run_id=run_id,
        t0_ns=time.time_ns(),
        cell_base=cell_base,
        round_start=round_start,
        round_end=round_end,
        rollback_cells=rollback_cells,
        lifecycle_seq=lifecycle_seq,
        last_seq=int(round_start[-1] + per_round[-1]),
    )
