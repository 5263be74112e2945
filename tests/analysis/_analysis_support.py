"""Scripted event streams with known true answers, written through the real telemetry hub.

The script (2 rounds x 2 envs x 6 steps) is small enough to reason about by hand; the
constants below are the answers every analysis must reproduce:

- seeds: A (round 0, env 0, conv_small) fossilized at step 5 after G1 T1 B2 H1 epochs;
  B (round 0, env 1, norm) pruned in TRAINING at step 4 after G2 T2; C (round 1, env 0,
  conv_small) alive, G1 then 3 open TRAINING epochs; D (round 1, env 1, norm) alive,
  2 open GERMINATED epochs.
- rollbacks: round 1 env 1 step 2 (penalizing step 1) reaches its reward row and episode;
  round 0 env 0 step 3 (penalizing step 2) reaches neither.
- rewards: every row sums to its total except round 1 env 0 step 3 (off by 0.25).
- actions: 24, of which GERMINATE 4, ADVANCE 5, PRUNE 1, FOSSILIZE 1, WAIT 13; one WAIT
  (round 1 env 1 step 0) not executed.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from esper.core.constants import HEAD_NAMES
from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.events import REWARD_COMPONENTS, make_breakdown
from esper.telemetry.hub import open_run

ROUNDS = 2
N_ENVS = 2
LENGTH = 6
CONFIG_HASH = "cfg-abc123"
SEED = 7
WALL_S = 2.0
BROKEN_ROW = (1, 0, 3)
BROKEN_BY = 0.25
GOOD_ROLLBACK = (1, 1, 2)
BAD_ROLLBACK = (0, 0, 3)
PENALTY = -0.5
SLOTS = ("r0c0", "r0c1", "r0c2")

# (round, env, step) -> lifecycle events at that cell, as (kind, payload) pairs.
_G, _T, _B, _H, _F, _P = "GERMINATED", "TRAINING", "BLENDING", "HOLDING", "FOSSILIZED", "PRUNED"
SEEDS = {
    "seed-a": dict(round=0, env=0, slot="r0c0", blueprint="conv_small"),
    "seed-b": dict(round=0, env=1, slot="r0c1", blueprint="norm"),
    "seed-c": dict(round=1, env=0, slot="r0c0", blueprint="conv_small"),
    "seed-d": dict(round=1, env=1, slot="r0c2", blueprint="norm"),
}
# seed -> [(step, kind, from, to, epochs_in_prev)]
LifecycleRow = tuple[int, str, str, str, int]
LIFECYCLE = {
    "seed-a": [
        (0, "germ", "", _G, 0),
        (1, "stage", _G, _T, 1),
        (2, "stage", _T, _B, 1),
        (4, "stage", _B, _H, 2),
        (5, "stage", _H, _F, 1),
        (5, "fossil", "", "", 0),
    ],
    "seed-b": [
        (0, "germ", "", _G, 0),
        (2, "stage", _G, _T, 2),
        (4, "stage", _T, _P, 2),
        (4, "prune", "", "", 0),
    ],
    "seed-c": [(1, "germ", "", _G, 0), (2, "stage", _G, _T, 1)],
    "seed-d": [(3, "germ", "", _G, 0)],
}
CONTRIBUTION = {"seed-a": 2.5, "seed-b": -1.0}
EXPECTED_DURATIONS = {  # seed -> (GERMINATED, TRAINING, BLENDING, HOLDING), outcome
    "seed-a": ((1, 1, 2, 1), "fossilized"),
    "seed-b": ((2, 2, 0, 0), "pruned"),
    "seed-c": ((1, 3, 0, 0), "alive"),
    "seed-d": ((2, 0, 0, 0), "alive"),
}
EXPECTED_OPS = {"WAIT": 13, "ADVANCE": 5, "GERMINATE": 4, "PRUNE": 1, "FOSSILIZE": 1}
NOT_EXECUTED = (1, 1, 0)


@dataclass
class Script:
    """What a scripted run emitted (the hub adds one final writer_stats on close)."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    episode_reward: dict[tuple[int, int], float] = field(default_factory=dict)
    extra: int = 0

    def expected_counts(self) -> dict[str, int]:
        return dict(self.counts) | {"writer_stats": 1}


def _cell_lifecycle(r: int, e: int, s: int) -> Iterator[tuple[str, str, LifecycleRow]]:
    for seed_id, meta in SEEDS.items():
        if meta["round"] != r or meta["env"] != e:
            continue
        for row in LIFECYCLE[seed_id]:
            if row[0] == s:
                yield seed_id, row[1], row


def _op_at(r: int, e: int, s: int) -> str:
    kinds = {
        kind
        for _, kind, row in _cell_lifecycle(r, e, s)
        if not (kind == "stage" and row[3] in (_F, _P))
    }
    for kind, op in (
        ("fossil", "FOSSILIZE"),
        ("prune", "PRUNE"),
        ("germ", "GERMINATE"),
        ("stage", "ADVANCE"),
    ):
        if kind in kinds:
            return op
    return "WAIT"


def _reward(r: int, e: int, s: int, op: str) -> tuple[dict[str, float], float]:
    parts = {"rent": -0.01, "attribution": 0.1 * e}
    parts.update(
        {
            "GERMINATE": {"germinate_cost": -0.05},
            "FOSSILIZE": {"fossilize_bonus": 0.5},
            "PRUNE": {"prune_penalty": -0.2},
            "ADVANCE": {"stage_shaping": 0.02},
        }.get(op, {})
    )
    if s == LENGTH - 1:
        parts["terminal"] = 1.0 + r
    if (r, e, s + 1) == GOOD_ROLLBACK:  # the penalized transition precedes the panic
        parts["rollback_penalty"] = PENALTY
    total = make_breakdown(**parts).total
    if (r, e, s) == BROKEN_ROW:
        total += BROKEN_BY
    return parts, total


def _lifecycle_event(seed_id: str, kind: str, row: LifecycleRow, r: int, e: int) -> ev.Event:
    meta = SEEDS[seed_id]
    s, _, frm, to, prev = row
    common = dict(round=r, env=e, step=s, slot=meta["slot"], seed_id=seed_id)
    if kind == "germ":
        return ev.SeedGerminated(
            **common, blueprint=meta["blueprint"], style=0, blend_op="ADD", tempo=5,
            alpha_target=1.0, params=1000, acc_at_germination=55.0,
        )  # fmt: skip
    if kind == "stage":
        return ev.SeedStageChanged(
            **common, blueprint=meta["blueprint"], from_stage=frm, to_stage=to,
            epochs_in_prev_stage=prev, alpha=0.5, initiator="policy",
        )  # fmt: skip
    age = s - LIFECYCLE[seed_id][0][0]
    if kind == "fossil":
        return ev.SeedFossilized(
            **common, blueprint=meta["blueprint"], contribution=CONTRIBUTION[seed_id],
            params=1000, age_epochs=age,
        )  # fmt: skip
    return ev.SeedPruned(
        **common, blueprint=meta["blueprint"], reason="policy", initiator="policy",
        age_epochs=age, stage_at_prune=_T, contribution=CONTRIBUTION[seed_id], scheduled=False,
    )  # fmt: skip


def _step_events(r: int, e: int, s: int, script: Script) -> Iterator[ev.Event]:
    nan = math.nan
    yield ev.EnvStep(
        round=r, env=e, step=s, train_loss=1.0, train_acc=60.0, val_loss=1.1, val_acc=58.0,
        active_seeds=1, host_params=5000, seed_params=0, train_ms=10.0, val_ms=2.0,
        features_ms=0.5, policy_ms=1.0,
    )  # fmt: skip
    op = _op_at(r, e, s)
    yield ev.ActionTaken(
        round=r, env=e, step=s, op=op, slot=SLOTS[0], blueprint="norm", style=0, tempo=0,
        alpha_target=1.0, alpha_speed=0, alpha_curve=0, executed=(r, e, s) != NOT_EXECUTED,
        op_mask=[True] * 6, n_valid_ops=6, masked_heads=[], value=0.5, log_prob=-1.0, op_prob=0.4,
    )  # fmt: skip
    parts, total = _reward(r, e, s, op)
    script.episode_reward[(r, e)] = script.episode_reward.get((r, e), 0.0) + total
    full = make_breakdown(**parts)
    yield ev.RewardComputed(
        round=r, env=e, step=s, family="contribution", op=op,
        **{k: getattr(full, k) for k in REWARD_COMPONENTS},
        total=total, normalized=total,
    )  # fmt: skip
    yield ev.CounterfactualComputed(
        round=r, env=e, step=s, slots=list(SLOTS), contributions=[0.1, nan, nan],
        unavailable_reasons=["", "no_seed", "no_seed"], shapley=[], interaction=nan,
        real_acc=58.0, all_off_acc=57.9, n_configs=2, exact_shapley=False,
    )  # fmt: skip
    if (r, e, s) in (GOOD_ROLLBACK, BAD_ROLLBACK):
        yield ev.GovernorRollback(
            round=r, env=e, step=s, reason="divergence", loss=9.0, threshold=5.0,
            restored_to_step=s - 1, penalized_step=s - 1, seeds_pruned=[],
            transitions_affected=2, penalty=PENALTY,
        )  # fmt: skip
    for seed_id, kind, row in _cell_lifecycle(r, e, s):
        yield _lifecycle_event(seed_id, kind, row, r, e)


def _round_events(r: int, script: Script) -> Iterator[ev.Event]:
    yield ev.RoundStarted(round=r, n_envs=N_ENVS, episode_length=LENGTH, entropy_coef=0.01, lr=3e-4)
    for s in range(LENGTH):
        for e in range(N_ENVS):
            yield from _step_events(r, e, s, script)
    for e in range(N_ENVS):
        good = (r, e) == GOOD_ROLLBACK[:2]
        yield ev.EpisodeFinished(
            round=r, env=e, step=LENGTH - 1, final_val_acc=60.0 + 10 * r + e, final_val_loss=1.0,
            host_params=5000, params_added=0, seeds_germinated=1, seeds_fossilized=0,
            seeds_pruned=0, episode_reward=script.episode_reward[(r, e)],
            rollbacks=1 if good else 0, rollback_penalty=PENALTY if good else 0.0,
        )  # fmt: skip
    rewards = [script.episode_reward[(r, e)] for e in range(N_ENVS)]
    yield ev.RoundFinished(
        round=r, wall_s=WALL_S, eps=N_ENVS * LENGTH / WALL_S,
        mean_episode_reward=sum(rewards) / N_ENVS, mean_final_accuracy=60.5 + 10 * r,
        rollbacks=1 if r == GOOD_ROLLBACK[0] else 0, train_ms=1200.0, val_ms=300.0,
        policy_ms=100.0, action_ms=20.0, ppo_ms=200.0,
    )  # fmt: skip
    yield _ppo(r)


def _ppo(r: int) -> ev.PpoUpdate:
    entropy = 1.0 - 0.1 * r
    heads = {f"entropy_{h}": entropy * (i + 1) / 10 for i, h in enumerate(HEAD_NAMES)}
    clips = {f"clip_frac_{h}": 0.01 * (i + 1) for i, h in enumerate(HEAD_NAMES)}
    return ev.PpoUpdate(
        round=r, policy_loss=0.1, value_loss=0.5 - 0.1 * r, entropy=entropy, **heads,
        clip_frac=0.1, **clips, approx_kl=0.01 * (r + 1), explained_variance=0.5 + 0.2 * r,
        grad_norm=1.0, lr=3e-4, entropy_coef=0.01, epochs_run=4, minibatches=2,
        early_stopped=r == 1, skipped=False, skip_reason="", n_transitions=N_ENVS * LENGTH,
        ratio_max=1.2, value_mean=0.3, return_mean=0.4,
    )  # fmt: skip


def run_started() -> ev.RunStarted:
    return ev.RunStarted(
        config_json="{}", config_hash=CONFIG_HASH, parent_run_id="", resumed_from_round=-1,
        esper_version="0.1.0", torch_version="", python_version="3", platform="linux",
        device="cpu", env_devices=["cpu"], amp="off", compile_policy=False, policy_kind="ppo",
        task="digits", n_envs=N_ENVS, episode_length=LENGTH, rounds=ROUNDS, seed=SEED,
        telemetry_level="normal", deterministic=True,
    )  # fmt: skip


def run_finished(events: int) -> ev.RunFinished:
    return ev.RunFinished(
        round=ROUNDS - 1, status="finished", rounds_completed=ROUNDS,
        env_steps=ROUNDS * N_ENVS * LENGTH, wall_s=ROUNDS * WALL_S,
        eps=N_ENVS * LENGTH / WALL_S, events_emitted=events, rollbacks=2, error="",
    )  # fmt: skip


def scripted_events(script: Script, *, rounds: range | None = None) -> Iterator[ev.Event]:
    """The whole stream (run_started .. run_finished), or only some rounds of it."""
    selected = range(ROUNDS) if rounds is None else rounds
    if selected.start == 0:
        yield run_started()
    for r in selected:
        yield from _round_events(r, script)
    if selected.stop == ROUNDS:
        yield run_finished(sum(script.counts.values()))


def emit_run(
    root: Path,
    run_id: str,
    *,
    extra: tuple[ev.Event, ...] = (),
    rank: int = 0,
    level: TelemetryLevel = TelemetryLevel.NORMAL,
) -> tuple[Path, Script]:
    """Emit the scripted stream (plus ``extra`` events) and close the run cleanly."""
    script = Script()
    hub = open_run(
        root, run_id, level=level, rank=rank, config_hash=CONFIG_HASH, flush_interval_s=0.05
    )
    for event in scripted_events(script):
        if isinstance(event, ev.RunFinished):
            for more in extra:
                script.counts[ev.event_tag(type(more))] += 1
                hub.emit(more)
        script.counts[ev.event_tag(type(event))] += 1
        hub.emit(event)
    hub.close(RunStatus.FINISHED)
    return root / run_id, script
