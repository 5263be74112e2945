"""Write a large, internally consistent synthetic run quickly (benchmarks, smoke tests).

The layout, column types and file metadata are those of the real writer, but rows are
generated with numpy one event type at a time (written, then freed), so ten million
events take seconds and bounded memory. The stream is consistent: rewards sum to their
totals, every rollback reaches its reward row and its episode, seed lifecycles follow
the stage machine, and ``seq`` is gap-free in emission order (see
:mod:`esper_analysis.synth_plan`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from esper.core.constants import ALL_BLUEPRINTS, HEAD_NAMES, SUCCESS_PATH
from esper.core.enums import LifecycleOp, RunStatus, SeedStage
from esper.core.records import REWARD_COMPONENTS
from esper.telemetry.events import SCHEMA_VERSION
from esper.telemetry.paths import event_type_of, type_rank_dir
from esper.telemetry.sink import COMPACT_ROW_GROUP_ROWS, compact_options
from esper_analysis.loader import EVENTS_DIR, MANIFEST_NAME
from esper_analysis.schema import event_schema
from esper_analysis.synth_plan import (
    PER_STEP,
    PRUNE_K,
    SYNTH_SLOTS,
    Arrays,
    Plan,
    candidates,
    lifecycle_rows,
    plan_stream,
)

SYNTH_N_ENVS: Final = 4
SYNTH_EPISODE_LENGTH: Final = 25
_STAGES: Final = tuple(s.value for s in SUCCESS_PATH)  # the real lifecycle's order
_GATES: Final = ("G1", "G2", "G3", "G5")
_OPS: Final = tuple(op.name for op in LifecycleOp)
_ROLLBACK_P: Final = 0.02
_ROLLBACK_PENALTY: Final = -0.5
_SEED_PARAMS: Final = 2_000
_HOST_PARAMS: Final = 120_000
#: Milliseconds of each round phase per second of round wall time (they sum to 970).
_PHASE_MS_PER_WALL_S: Final = {"train": 600, "val": 200, "policy": 50, "action": 20, "ppo": 100}
#: Lifecycle events per episode on average (sizes the number of rounds).
_LIFECYCLE_PER_EPISODE: Final = 15


@dataclasses.dataclass(frozen=True)
class SynthRun:
    path: Path
    n_events: int
    rounds: int
    n_envs: int
    episode_length: int


def _write(run_dir: Path, event_type: str, columns: dict[str, Any]) -> int:
    """One part file per type, typed exactly like the real writer's tables."""
    schema = event_schema(event_type)
    frame = pl.DataFrame(columns).select([pl.col(n).cast(dt) for n, dt in schema.items()])
    out = type_rank_dir(run_dir, event_type, 0)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"esper.schema_version": str(SCHEMA_VERSION), "esper.event_type": event_type}
    table = frame.to_arrow().replace_schema_metadata(meta)
    pq.write_table(  # as the writer's compacted files: same options, page checksums
        table,
        out / "part-000000.parquet",
        write_page_checksum=True,
        row_group_size=COMPACT_ROW_GROUP_ROWS,
        **compact_options(table.schema),
    )
    return frame.height


def _names(codes: np.ndarray, names: Sequence[str]) -> pl.Series:
    return pl.Series(codes).replace_strict(dict(enumerate(names)), return_dtype=pl.String)


def _const(value: Any, n: int) -> pl.Series:
    return pl.repeat(value, n, eager=True)


def _const_list(value: list[Any], inner: pl.DataType, n: int) -> pl.Series:
    return pl.Series([value], dtype=pl.List(inner)).new_from_index(0, n)


def _ops(plan: Plan, c: Arrays, rows: Arrays) -> tuple[np.ndarray, np.ndarray]:
    """Op code and slot index per cell, consistent with the lifecycle events."""
    op = np.zeros(plan.rounds * plan.length * plan.n_envs, np.int64)
    slot = np.zeros_like(op)
    changed = rows["seed_stage_changed"]
    advance = {k: v[(changed["k"] >= 0) & (changed["k"] < 3)] for k, v in changed.items()}
    for part, code in (
        (advance, LifecycleOp.ADVANCE),
        (rows["seed_germinated"], LifecycleOp.GERMINATE),
        (rows["seed_pruned"], LifecycleOp.PRUNE),
        (rows["seed_fossilized"], LifecycleOp.FOSSILIZE),
    ):
        i = part["i"]
        cells = plan.cell(c["round"][i], part["step"], c["env"][i])
        op[cells] = int(code)
        slot[cells] = c["slot"][i]
    return op, slot


def _rewards(rng: np.random.Generator, plan: Plan, op: np.ndarray) -> dict[str, np.ndarray]:
    """Reward components per cell; ``total`` is their sum in catalogue order."""
    n = len(op)
    r, s, _ = plan.grid()
    comp = {name: np.zeros(n) for name in REWARD_COMPONENTS}
    comp["attribution"] = rng.normal(0.0, 0.05, n) * (rng.random(n) < 0.5)
    comp["stage_shaping"] = np.where(op == LifecycleOp.ADVANCE, 0.01, 0.0)
    comp["rent"] = -rng.uniform(0.0, 0.005, n)
    comp["germinate_cost"] = np.where(op == LifecycleOp.GERMINATE, -0.05, 0.0)
    comp["fossilize_bonus"] = np.where(op == LifecycleOp.FOSSILIZE, 0.5, 0.0)
    comp["prune_penalty"] = np.where(op == LifecycleOp.PRUNE, -0.1, 0.0)
    comp["invalid_penalty"] = np.where(rng.random(n) < 0.01, -0.02, 0.0)
    comp["loss_delta"] = rng.normal(0.0, 0.02, n)
    last = s == plan.length - 1
    comp["terminal"] = np.where(last, rng.normal(1.0, 0.2, n) + r / plan.rounds, 0.0)
    # The penalty lands on the transition that led into the failed epoch (step - 1).
    comp["rollback_penalty"][plan.rollback_cells - plan.n_envs] = _ROLLBACK_PENALTY
    total = np.zeros(n)
    for name in REWARD_COMPONENTS:
        total = total + comp[name]
    comp["total"] = total
    return comp


def _accuracy(rng: np.random.Generator, progress: np.ndarray) -> np.ndarray:
    """A learning curve in percent: rises from 50 towards 90 as training progresses."""
    return 50.0 + 40.0 * (1.0 - np.exp(-3.0 * progress)) + rng.normal(0, 1.0, len(progress))


def _write_env_steps(rng: np.random.Generator, run_dir: Path, plan: Plan) -> int:
    r, s, e = plan.grid()
    n = len(r)
    progress = (r + s / plan.length) / plan.rounds
    acc = _accuracy(rng, progress)
    return _write(
        run_dir,
        "env_step",
        {
            **plan.envelope(r, e, s, plan.cell_base),
            "train_loss": 2.0 * np.exp(-3.0 * progress) + rng.uniform(0, 0.05, n),
            "train_acc": acc + 2.0,
            "val_loss": 2.1 * np.exp(-3.0 * progress),
            "val_acc": acc,
            "active_seeds": rng.integers(0, len(SYNTH_SLOTS), n),
            "host_params": np.full(n, _HOST_PARAMS),
            "seed_params": rng.integers(0, 5_000, n),
            "train_ms": rng.gamma(9.0, 2.0, n),
            "val_ms": rng.gamma(4.0, 1.0, n),
            "features_ms": rng.gamma(2.0, 0.1, n),
            "policy_ms": rng.gamma(2.0, 0.3, n),
        },
    )


def _write_actions(
    rng: np.random.Generator, run_dir: Path, plan: Plan, op: np.ndarray, slot: np.ndarray
) -> int:
    r, s, e = plan.grid()
    n = len(r)
    return _write(
        run_dir,
        "action_taken",
        {
            **plan.envelope(r, e, s, plan.cell_base + 1),
            "op": _names(op, _OPS),
            "slot": _names(slot, SYNTH_SLOTS),
            "blueprint": _names(rng.integers(0, len(ALL_BLUEPRINTS), n), ALL_BLUEPRINTS),
            "style": rng.integers(0, 4, n),
            "tempo": rng.integers(0, 3, n),
            "alpha_target": np.ones(n),
            "alpha_speed": rng.integers(0, 4, n),
            "alpha_curve": rng.integers(0, 5, n),
            "executed": rng.random(n) < 0.97,
            "op_mask": _const_list([True] * len(_OPS), pl.Boolean(), n),
            "n_valid_ops": np.full(n, len(_OPS)),
            "masked_heads": _const_list([], pl.String(), n),
            "value": rng.normal(0.5, 0.3, n),
            "log_prob": -rng.gamma(2.0, 0.5, n),
            "op_prob": rng.uniform(0.1, 1.0, n),
        },
    )


def _write_rewards(
    rng: np.random.Generator, run_dir: Path, plan: Plan, op: np.ndarray
) -> tuple[int, np.ndarray]:
    """reward_computed rows; returns the episode rewards, shape (rounds, envs)."""
    r, s, e = plan.grid()
    comp = _rewards(rng, plan, op)
    n = _write(
        run_dir,
        "reward_computed",
        {
            **plan.envelope(r, e, s, plan.cell_base + 2),
            "family": _const("contribution", len(r)),
            "op": _names(op, _OPS),
            **comp,
            "normalized": comp["total"] * 0.5,
        },
    )
    shape = (plan.rounds, plan.length, plan.n_envs)
    return n, comp["total"].reshape(shape).sum(axis=1)


def _write_counterfactuals(rng: np.random.Generator, run_dir: Path, plan: Plan) -> int:
    r, s, e = plan.grid()
    n = len(r)
    contrib = rng.normal(0.5, 1.0, (n, len(SYNTH_SLOTS)))
    acc = _accuracy(rng, (r + s / plan.length) / plan.rounds)
    return _write(
        run_dir,
        "counterfactual_computed",
        {
            **plan.envelope(r, e, s, plan.cell_base + 3),
            "slots": _const_list(list(SYNTH_SLOTS), pl.String(), n),
            "contributions": pl.Series(contrib).cast(pl.List(pl.Float64)),
            "unavailable_reasons": _const_list([""] * len(SYNTH_SLOTS), pl.String(), n),
            "shapley": _const_list([], pl.Float64(), n),
            "interaction": rng.normal(0, 0.1, n),
            "real_acc": acc,
            "all_off_acc": acc - contrib.sum(axis=1),
            "n_configs": np.full(n, len(SYNTH_SLOTS) + 1),
            "exact_shapley": np.zeros(n, bool),
        },
    )


def _lifecycle_payload(
    t: str, c: Arrays, part: dict[str, np.ndarray], rng: np.random.Generator
) -> dict[str, Any]:
    """Payload columns of one lifecycle event type (see synth_plan.lifecycle_rows)."""
    i, step, k = part["i"], part["step"], part["k"]
    n = len(i)
    pruning = k == PRUNE_K
    seed = {
        "slot": _names(c["slot"][i], SYNTH_SLOTS),
        "seed_id": pl.Series(i).cast(pl.String).str.pad_start(9, "0").str.replace("^", "seed-"),
        "blueprint": _names(c["blueprint"][i], ALL_BLUEPRINTS),
    }
    from_stage = _names(np.where(pruning, c["p_stage"][i], k), _STAGES)
    to_stage = pl.Series(
        np.where(pruning, SeedStage.PRUNED.value, np.array(_STAGES)[np.clip(k + 1, 0, 4)])
    )
    age = step - c["g"][i]
    if t == "seed_germinated":
        return {
            **seed,
            "style": np.zeros(n, np.int64),
            "blend_op": _const("ADD", n),
            "tempo": np.full(n, 5),
            "alpha_target": np.ones(n),
            "params": np.full(n, _SEED_PARAMS),
            "acc_at_germination": rng.uniform(40, 90, n),
        }
    if t == "seed_stage_changed":
        prev = np.where(pruning, c["p_stage"][i], k)
        in_prev = c["dur"][i, np.clip(prev, 0, 3)] // np.where(pruning, 2, 1)
        return {
            **seed,
            "from_stage": from_stage,
            "to_stage": to_stage,
            "epochs_in_prev_stage": in_prev,
            "alpha": np.clip(k / 3.0, 0.0, 1.0),
            "initiator": _const("policy", n),
        }
    if t == "gate_evaluated":
        return {
            "slot": seed["slot"],
            "seed_id": seed["seed_id"],
            "gate": _names(k, _GATES),
            "target_stage": to_stage,
            "passed": np.ones(n, bool),
            "checks_passed": _const_list(["min_epochs"], pl.String(), n),
            "checks_failed": _const_list([], pl.String(), n),
            "message": _const("", n),
            "strict": np.zeros(n, bool),
        }
    common = {**seed, "contribution": c["contribution"][i], "age_epochs": age}
    if t == "seed_fossilized":
        return {**common, "params": np.full(n, _SEED_PARAMS)}
    return {
        **common,
        "reason": _const("policy", n),
        "initiator": _const("policy", n),
        "stage_at_prune": from_stage,
        "scheduled": np.zeros(n, bool),
    }


def _write_lifecycle(
    rng: np.random.Generator, run_dir: Path, plan: Plan, c: Arrays, rows: Arrays
) -> int:
    written = 0
    for t, part in rows.items():
        i = part["i"]
        envelope = plan.envelope(c["round"][i], c["env"][i], part["step"], plan.lifecycle_seq[t])
        written += _write(run_dir, t, {**envelope, **_lifecycle_payload(t, c, part, rng)})
    return written


def _write_rollbacks(rng: np.random.Generator, run_dir: Path, plan: Plan) -> int:
    cells = plan.rollback_cells
    n = len(cells)
    e = cells % plan.n_envs
    s = (cells // plan.n_envs) % plan.length
    r = cells // (plan.n_envs * plan.length)
    return _write(
        run_dir,
        "governor_rollback",
        {
            **plan.envelope(r, e, s, plan.cell_base[cells] + PER_STEP),
            "reason": _const("divergence", n),
            "loss": rng.uniform(5.0, 9.0, n),
            "threshold": np.full(n, 4.0),
            "restored_to_step": np.maximum(s - 1, 0),
            "penalized_step": s - 1,
            "seeds_pruned": _const_list([], pl.String(), n),
            "transitions_affected": np.ones(n, np.int64),
            "penalty": np.full(n, _ROLLBACK_PENALTY),
        },
    )


def _episode_columns(
    rng: np.random.Generator, plan: Plan, c: Arrays, reward: np.ndarray
) -> dict[str, Any]:
    n_r, n_e, n_l = plan.rounds, plan.n_envs, plan.length
    rounds = np.repeat(np.arange(n_r), n_e)
    envs = np.tile(np.arange(n_e), n_r)
    per_episode = (n_r, n_e, len(SYNTH_SLOTS))

    def seeds(flag: str) -> np.ndarray:
        return np.asarray(c[flag].reshape(per_episode).sum(axis=2).reshape(-1))

    has_rb = np.zeros(n_r * n_l * n_e, np.int64)
    has_rb[plan.rollback_cells] = 1
    rollbacks = has_rb.reshape(n_r, n_l, n_e).sum(axis=1).reshape(-1)
    acc = _accuracy(rng, (rounds + 1) / n_r)
    return {
        **plan.envelope(
            rounds, envs, np.full(n_r * n_e, n_l - 1), np.repeat(plan.round_end, n_e) + envs
        ),
        "final_val_acc": acc,
        "final_val_loss": 2.0 - acc / 60.0,
        "host_params": np.full(n_r * n_e, _HOST_PARAMS),
        "params_added": seeds("fossil") * _SEED_PARAMS,
        "seeds_germinated": seeds("germ"),
        "seeds_fossilized": seeds("fossil"),
        "seeds_pruned": seeds("pruned"),
        "episode_reward": reward.reshape(-1),
        "rollbacks": rollbacks,
        "rollback_penalty": rollbacks * _ROLLBACK_PENALTY,
    }


def _ppo_columns(rng: np.random.Generator, plan: Plan) -> dict[str, Any]:
    n = plan.rounds
    frac = np.arange(n) / n
    cols: dict[str, Any] = {
        "policy_loss": rng.normal(0, 0.05, n),
        "value_loss": np.exp(-frac) + rng.uniform(0, 0.1, n),
        "entropy": 1.5 * np.exp(-frac),
        "clip_frac": rng.uniform(0, 0.3, n),
    }
    for head in HEAD_NAMES:
        cols[f"entropy_{head}"] = cols["entropy"] * rng.uniform(0.5, 1.0)
        cols[f"clip_frac_{head}"] = cols["clip_frac"] * rng.uniform(0.5, 1.0)
    cols.update(
        approx_kl=rng.uniform(0, 0.02, n),
        explained_variance=1 - np.exp(-3 * frac),
        grad_norm=rng.uniform(0.1, 1.0, n),
        lr=np.full(n, 3e-4),
        entropy_coef=np.full(n, 0.01),
        epochs_run=np.full(n, 4),
        minibatches=np.full(n, 4),
        early_stopped=rng.random(n) < 0.1,
        skipped=np.zeros(n, bool),
        skip_reason=_const("", n),
        n_transitions=np.full(n, plan.length * plan.n_envs),
        ratio_max=rng.uniform(1.0, 1.5, n),
        value_mean=rng.normal(0.5, 0.1, n),
        return_mean=rng.normal(0.5, 0.1, n),
    )
    return cols


def _write_rounds(
    rng: np.random.Generator, run_dir: Path, plan: Plan, c: Arrays, reward: np.ndarray
) -> int:
    n, n_e = plan.rounds, plan.n_envs
    rounds, minus = np.arange(n), np.full(n, -1)
    episodes = _episode_columns(rng, plan, c, reward)
    written = _write(run_dir, "episode_finished", episodes)
    written += _write(
        run_dir,
        "round_started",
        {
            **plan.envelope(rounds, minus, minus, plan.round_start),
            "n_envs": np.full(n, n_e),
            "episode_length": np.full(n, plan.length),
            "entropy_coef": np.full(n, 0.01),
            "lr": np.full(n, 3e-4),
        },
    )
    wall = rng.uniform(4.0, 6.0, n)
    written += _write(
        run_dir,
        "round_finished",
        {
            **plan.envelope(rounds, minus, minus, plan.round_end + n_e),
            "wall_s": wall,
            "eps": plan.length * n_e / wall,
            "mean_episode_reward": reward.mean(axis=1),
            "mean_final_accuracy": episodes["final_val_acc"].reshape(n, n_e).mean(axis=1),
            "rollbacks": episodes["rollbacks"].reshape(n, n_e).sum(axis=1),
            **{f"{phase}_ms": wall * share for phase, share in _PHASE_MS_PER_WALL_S.items()},
        },
    )
    envelope = plan.envelope(rounds, minus, minus, plan.round_end + n_e + 1)
    return written + _write(run_dir, "ppo_update", {**envelope, **_ppo_columns(rng, plan)})


def _write_run_events(run_dir: Path, plan: Plan, seed: int, config_hash: str, total: int) -> int:
    minus = np.full(1, -1)
    last_round = np.full(1, plan.rounds - 1)
    env_steps = plan.rounds * plan.length * plan.n_envs
    config = {"run": {"seed": seed, "synthetic": True}, "task": {"name": "synthetic"}}
    started = {
        "config_json": [json.dumps(config, sort_keys=True)],
        "config_hash": [config_hash],
        "parent_run_id": [""],
        "resumed_from_round": [-1],
        "esper_version": ["synthetic"],
        "torch_version": [""],
        "python_version": [""],
        "platform": [""],
        "device": ["cpu"],
        "env_devices": [["cpu"]],
        "amp": ["off"],
        "compile_policy": [False],
        "policy_kind": ["ppo"],
        "task": ["synthetic"],
        "n_envs": [plan.n_envs],
        "episode_length": [plan.length],
        "rounds": [plan.rounds],
        "seed": [seed],
        "telemetry_level": ["normal"],
        "deterministic": [True],
    }
    finished = {
        "status": [RunStatus.FINISHED.value],
        "rounds_completed": [plan.rounds],
        "env_steps": [env_steps],
        "wall_s": [plan.rounds * 5.0],
        "eps": [env_steps / (plan.rounds * 5.0)],
        "events_emitted": [total],
        "rollbacks": [len(plan.rollback_cells)],
        "error": [""],
    }
    stats = {
        "events_written": [total],
        "bytes_written": [0],
        "flushes": [plan.rounds],
        "max_queue_depth": [0],
        "blocked_ns": [0],
        "blocked_emits": [0],
        "dropped": [0],
    }
    end = np.full(1, plan.last_seq)
    return (
        _write(run_dir, "run_started", {**plan.envelope(minus, minus, minus, minus + 1), **started})
        + _write(
            run_dir, "run_finished", {**plan.envelope(last_round, minus, minus, end), **finished}
        )
        + _write(
            run_dir, "writer_stats", {**plan.envelope(last_round, minus, minus, end + 1), **stats}
        )
    )


def _write_manifest(run_dir: Path, plan: Plan, config_hash: str, total: int) -> None:
    """The manifest the real writer leaves after a clean close (atomic write)."""
    counts = {
        event_type_of(d.name): sum(pq.read_metadata(p).num_rows for p in d.glob("rank=*/*.parquet"))
        for d in sorted((run_dir / EVENTS_DIR).iterdir())
    }
    now = time.time_ns()
    manifest = {
        "run_id": plan.run_id,
        "rank": 0,
        "schema_version": SCHEMA_VERSION,
        "config_hash": config_hash,
        "parent_run_id": "",
        "status": RunStatus.FINISHED.value,
        "error": "",
        "level": "normal",
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "flush_interval_s": 0.5,
        "started_ns": plan.t0_ns,
        "heartbeat_ns": now,
        "finished_ns": now,
        "first_seq": 0,
        "last_seq": total - 1,
        "counts": counts,
        "writer": {"events_written": total},
        "pending_compactions": [],
        "resumes": [],
    }
    tmp = run_dir / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / MANIFEST_NAME)


def synthesize_run(
    path: str | os.PathLike[str],
    n_events: int,
    *,
    seed: int,
    n_envs: int = SYNTH_N_ENVS,
    episode_length: int = SYNTH_EPISODE_LENGTH,
) -> SynthRun:
    """Write a finished synthetic run of about ``n_events`` events (whole rounds).

    ``path`` is the run directory (its name becomes the run id) and must not exist.
    The same ``seed`` writes the same events (timestamps aside).
    """
    run_dir = Path(path)
    if run_dir.exists():
        raise FileExistsError(f"{run_dir} already exists")
    if episode_length < 2 or n_envs < 1:
        raise ValueError("synthetic runs need episode_length >= 2 and n_envs >= 1")
    per_round = n_envs * (episode_length * PER_STEP + _LIFECYCLE_PER_EPISODE + 1) + 3
    rounds = max(1, round(n_events / per_round))
    rng = np.random.default_rng(seed)
    c = candidates(rng, rounds, n_envs, episode_length)
    rows = lifecycle_rows(c, episode_length)
    episodes = np.flatnonzero(rng.random(rounds * n_envs) < _ROLLBACK_P)
    step = rng.integers(episode_length // 2, episode_length, len(episodes))
    rb_cells = (episodes // n_envs * episode_length + step) * n_envs + episodes % n_envs
    plan = plan_stream(run_dir.name, c, rows, np.sort(rb_cells), (rounds, n_envs, episode_length))
    run_dir.mkdir(parents=True)
    total = plan.last_seq + 2  # run_finished, then the final writer_stats
    op, slot = _ops(plan, c, rows)
    written = _write_env_steps(rng, run_dir, plan)
    written += _write_actions(rng, run_dir, plan, op, slot)
    n, episode_reward = _write_rewards(rng, run_dir, plan, op)
    written += n + _write_counterfactuals(rng, run_dir, plan)
    written += _write_lifecycle(rng, run_dir, plan, c, rows)
    written += _write_rollbacks(rng, run_dir, plan)
    written += _write_rounds(rng, run_dir, plan, c, episode_reward)
    written += _write_run_events(run_dir, plan, seed, f"synthetic-{seed}", total)
    if written != total:
        raise AssertionError(f"synthetic stream inconsistent: {written} rows for {total} seqs")
    _write_manifest(run_dir, plan, f"synthetic-{seed}", total)
    return SynthRun(run_dir, total, rounds, n_envs, episode_length)
