"""The v1 event catalogue: one frozen msgspec Struct per event type.

Every event carries the envelope ``run_id, seq, ts_ns, rank, round, env, step``. The
producer sets ``round``, ``env`` and ``step``; the hub stamps ``run_id``, ``seq``,
``ts_ns`` and ``rank`` at emit time (O(1), see :mod:`esper.telemetry.hub`), which is why
those four carry placeholder defaults. Payload fields are named scalars, enum values as
strings, and small fixed lists; measurements that were not taken are NaN, never 0.

Changing an existing field is a schema change: bump :data:`SCHEMA_VERSION` and
regenerate ``schemas/`` (``esper schemas --write``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any, Final

import msgspec

from esper.core.enums import TelemetryLevel

#: 2: run directories use the hive layout ``events/type=<type>/rank=<r>/``; 3: parts are
#: named by their seq range, and runs have no journal; 4: ``episode_finished.host`` (the
#: host family member) and ``run_started.eval_checkpoint``. The analysis layer reads 1-4.
SCHEMA_VERSION: Final = 4


#: Envelope value of ``seq`` before the hub stamps an event (or a batch of columns).
UNSTAMPED_SEQ: Final = -1


class Event(msgspec.Struct, frozen=True, gc=False, kw_only=True, tag_field="type"):
    """Envelope shared by every event type."""

    run_id: str = ""
    seq: int = UNSTAMPED_SEQ
    ts_ns: int = 0
    rank: int = 0
    round: int = -1
    env: int = -1
    step: int = -1


# --- Run and round ---------------------------------------------------------------------


class RunStarted(Event, tag="run_started", frozen=True, gc=False, kw_only=True):
    config_json: str
    config_hash: str
    parent_run_id: str
    resumed_from_round: int
    esper_version: str
    torch_version: str
    python_version: str
    platform: str
    device: str
    env_devices: list[str]
    amp: str
    compile_policy: bool
    policy_kind: str
    task: str
    n_envs: int
    episode_length: int
    rounds: int
    seed: int
    telemetry_level: str
    deterministic: bool
    #: ``esper evaluate``: the checkpoint whose frozen policy the run evaluates (deterministic
    #: actions, no updates); "" for a training run.
    eval_checkpoint: str = ""
    #: ``esper evaluate --sample``: the frozen policy's actions were sampled (seeded by the
    #: run seed) rather than its most likely valid ones.
    eval_sampled: bool = False
    #: The command line of the process that started this session (``sys.argv`` as a JSON
    #: list); "" where it was not recorded (written before it was added).
    argv: str = ""


class RunFinished(Event, tag="run_finished", frozen=True, gc=False, kw_only=True):
    status: str
    rounds_completed: int
    env_steps: int
    wall_s: float
    eps: float
    events_emitted: int
    rollbacks: int
    error: str


class RoundStarted(Event, tag="round_started", frozen=True, gc=False, kw_only=True):
    n_envs: int
    episode_length: int
    entropy_coef: float
    lr: float


class RoundFinished(Event, tag="round_finished", frozen=True, gc=False, kw_only=True):
    wall_s: float
    eps: float
    mean_episode_reward: float
    mean_final_accuracy: float
    rollbacks: int
    #: Phase wall times summed over the round's steps, in milliseconds.
    train_ms: float
    val_ms: float
    #: Observation (features, masks) plus the policy forward: everything between a
    #: step's host epoch and its actions. ``env_step`` reports the two parts apart
    #: (``features_ms``, ``policy_ms``).
    policy_ms: float
    #: Executing the actions, rewards, the buffer write and the step's events.
    action_ms: float
    ppo_ms: float


# --- Per env-step (level normal) -------------------------------------------------------


class EnvStep(Event, tag="env_step", frozen=True, gc=False, kw_only=True):
    train_loss: float
    train_acc: float
    val_loss: float
    val_acc: float
    active_seeds: int
    host_params: int
    seed_params: int
    train_ms: float
    val_ms: float
    features_ms: float
    policy_ms: float


class ActionTaken(Event, tag="action_taken", frozen=True, gc=False, kw_only=True):
    op: str
    slot: str
    blueprint: str
    style: int
    tempo: int
    alpha_target: float
    alpha_speed: int
    alpha_curve: int
    executed: bool
    op_mask: list[bool]
    n_valid_ops: int
    masked_heads: list[str]
    value: float
    log_prob: float
    op_prob: float


class RewardComputed(Event, tag="reward_computed", frozen=True, gc=False, kw_only=True):
    """A step's reward. Training builds it as its reward breakdown
    (:func:`make_breakdown`); the recorder adds the context."""

    family: str = ""
    op: str = ""
    attribution: float = 0.0
    stage_shaping: float = 0.0
    rent: float = 0.0
    alpha_shock: float = 0.0
    germinate_cost: float = 0.0
    fossilize_bonus: float = 0.0
    prune_penalty: float = 0.0
    invalid_penalty: float = 0.0
    loss_delta: float = 0.0
    terminal: float = 0.0
    rollback_penalty: float = 0.0
    total: float = 0.0
    normalized: float = math.nan


_REWARD_FIELDS: Final = RewardComputed.__struct_fields__
#: The reward components, in the reward's order: every field between ``op`` and ``total``.
REWARD_COMPONENTS: Final = _REWARD_FIELDS[_REWARD_FIELDS.index("op") + 1 : -2]
_ZERO_REWARD: Final = RewardComputed()


def make_breakdown(**components: float) -> RewardComputed:
    """A step's reward breakdown: the ``reward_computed`` event itself (the recorder adds
    the family, op, normalised value and the envelope), whose ``total`` is the exact sum
    of the given components (in field order)."""
    unknown = set(components) - set(REWARD_COMPONENTS)
    if unknown:
        raise ValueError(f"unknown reward component(s): {sorted(unknown)}")
    total = 0.0
    for name in REWARD_COMPONENTS:
        total += components.get(name, 0.0)
    return msgspec.structs.replace(_ZERO_REWARD, **components, total=total)


class CounterfactualComputed(
    Event, tag="counterfactual_computed", frozen=True, gc=False, kw_only=True
):
    slots: list[str]
    contributions: list[float]
    unavailable_reasons: list[str]
    shapley: list[float]
    interaction: float
    real_acc: float
    all_off_acc: float
    n_configs: int
    exact_shapley: bool


# --- Seed lifecycle (level lifecycle) --------------------------------------------------


class SeedGerminated(Event, tag="seed_germinated", frozen=True, gc=False, kw_only=True):
    slot: str
    seed_id: str
    blueprint: str
    style: int
    blend_op: str
    tempo: int
    alpha_target: float
    params: int
    acc_at_germination: float


class SeedStageChanged(Event, tag="seed_stage_changed", frozen=True, gc=False, kw_only=True):
    slot: str
    seed_id: str
    blueprint: str
    from_stage: str
    to_stage: str
    epochs_in_prev_stage: int
    alpha: float
    initiator: str


class GateEvaluated(Event, tag="gate_evaluated", frozen=True, gc=False, kw_only=True):
    slot: str
    seed_id: str
    gate: str
    target_stage: str
    passed: bool
    checks_passed: list[str]
    checks_failed: list[str]
    message: str
    strict: bool


class SeedFossilized(Event, tag="seed_fossilized", frozen=True, gc=False, kw_only=True):
    slot: str
    seed_id: str
    blueprint: str
    contribution: float
    params: int
    age_epochs: int


class SeedPruned(Event, tag="seed_pruned", frozen=True, gc=False, kw_only=True):
    slot: str
    seed_id: str
    blueprint: str
    reason: str
    initiator: str
    age_epochs: int
    stage_at_prune: str
    contribution: float
    scheduled: bool


# --- Safety, episodes, learning --------------------------------------------------------


class GovernorRollback(Event, tag="governor_rollback", frozen=True, gc=False, kw_only=True):
    reason: str
    loss: float
    threshold: float
    restored_to_step: int
    #: The transition that carries the penalty: the decision that led into the failed
    #: epoch (step - 1), or step 0 when the panic happens on the first step.
    penalized_step: int
    seeds_pruned: list[str]
    transitions_affected: int
    penalty: float


class EpisodeFinished(Event, tag="episode_finished", frozen=True, gc=False, kw_only=True):
    final_val_acc: float
    final_val_loss: float
    host_params: int
    params_added: int
    seeds_germinated: int
    seeds_fossilized: int
    seeds_pruned: int
    episode_reward: float
    rollbacks: int
    rollback_penalty: float
    #: The env's host family member ("" without a family; absent before schema 4).
    host: str = ""


class PpoUpdate(Event, tag="ppo_update", frozen=True, gc=False, kw_only=True):
    """One PPO update; the learner returns it as its metrics (the recorder sets its round)."""

    policy_loss: float
    value_loss: float
    entropy: float
    entropy_op: float
    entropy_slot: float
    entropy_blueprint: float
    entropy_style: float
    entropy_tempo: float
    entropy_alpha_target: float
    entropy_alpha_speed: float
    entropy_alpha_curve: float
    clip_frac: float
    clip_frac_op: float
    clip_frac_slot: float
    clip_frac_blueprint: float
    clip_frac_style: float
    clip_frac_tempo: float
    clip_frac_alpha_target: float
    clip_frac_alpha_speed: float
    clip_frac_alpha_curve: float
    approx_kl: float
    explained_variance: float
    grad_norm: float
    lr: float
    entropy_coef: float
    epochs_run: int
    minibatches: int
    early_stopped: bool
    skipped: bool
    skip_reason: str
    n_transitions: int
    ratio_max: float
    value_mean: float
    return_mean: float


class AnomalyDetected(Event, tag="anomaly_detected", frozen=True, gc=False, kw_only=True):
    kind: str
    detail: str
    value: float
    threshold: float
    escalated: bool


class TelemetryLevelChanged(
    Event, tag="telemetry_level_changed", frozen=True, gc=False, kw_only=True
):
    old_level: str
    new_level: str
    reason: str
    until_round: int


class CheckpointSaved(Event, tag="checkpoint_saved", frozen=True, gc=False, kw_only=True):
    path: str
    bytes: int
    next_round: int
    seq_position: int


class CheckpointLoaded(Event, tag="checkpoint_loaded", frozen=True, gc=False, kw_only=True):
    path: str
    next_round: int
    parent_run_id: str
    seq_position: int


class WriterStats(Event, tag="writer_stats", frozen=True, gc=False, kw_only=True):
    """Writer counters as the close began; the close's merged files count in the manifest."""

    events_written: int
    bytes_written: int
    flushes: int
    max_queue_depth: int
    blocked_ns: int
    blocked_emits: int
    dropped: int


# --- Debug ------------------------------------------------------------------------------


class LayerGradStats(Event, tag="layer_grad_stats", frozen=True, gc=False, kw_only=True):
    layer: str
    grad_norm: float
    param_norm: float
    grad_max_abs: float
    zero_frac: float


AnyEvent = (
    RunStarted
    | RunFinished
    | RoundStarted
    | RoundFinished
    | EnvStep
    | ActionTaken
    | RewardComputed
    | CounterfactualComputed
    | SeedGerminated
    | SeedStageChanged
    | GateEvaluated
    | SeedFossilized
    | SeedPruned
    | GovernorRollback
    | EpisodeFinished
    | PpoUpdate
    | AnomalyDetected
    | TelemetryLevelChanged
    | CheckpointSaved
    | CheckpointLoaded
    | WriterStats
    | LayerGradStats
)

#: What a model reports of its seeds' lifecycle: the events themselves, without their
#: round, env and step (the recorder adds them).
LifecycleEvent = SeedGerminated | SeedStageChanged | GateEvaluated | SeedFossilized | SeedPruned

#: Level of each event type: written when ``level <= run level``.
EVENT_LEVELS: Final[dict[type[Event], TelemetryLevel]] = {
    RunStarted: TelemetryLevel.LIFECYCLE,
    RunFinished: TelemetryLevel.LIFECYCLE,
    RoundStarted: TelemetryLevel.LIFECYCLE,
    RoundFinished: TelemetryLevel.LIFECYCLE,
    EnvStep: TelemetryLevel.NORMAL,
    ActionTaken: TelemetryLevel.NORMAL,
    RewardComputed: TelemetryLevel.NORMAL,
    CounterfactualComputed: TelemetryLevel.NORMAL,
    SeedGerminated: TelemetryLevel.LIFECYCLE,
    SeedStageChanged: TelemetryLevel.LIFECYCLE,
    GateEvaluated: TelemetryLevel.LIFECYCLE,
    SeedFossilized: TelemetryLevel.LIFECYCLE,
    SeedPruned: TelemetryLevel.LIFECYCLE,
    GovernorRollback: TelemetryLevel.LIFECYCLE,
    EpisodeFinished: TelemetryLevel.LIFECYCLE,
    PpoUpdate: TelemetryLevel.LIFECYCLE,
    AnomalyDetected: TelemetryLevel.LIFECYCLE,
    TelemetryLevelChanged: TelemetryLevel.LIFECYCLE,
    CheckpointSaved: TelemetryLevel.LIFECYCLE,
    CheckpointLoaded: TelemetryLevel.LIFECYCLE,
    WriterStats: TelemetryLevel.LIFECYCLE,
    LayerGradStats: TelemetryLevel.DEBUG,
}

#: Event types by their tag (the ``type`` field and the directory name on disk).
EVENT_TYPES: Final[dict[str, type[Event]]] = {
    cls.__struct_config__.tag: cls  # type: ignore[misc]
    for cls in EVENT_LEVELS
}

#: Envelope field names, in order, present on every event.
ENVELOPE_FIELDS: Final = Event.__struct_fields__


def set_fields(events: Sequence[Event], fields: Iterable[tuple[str, Iterable[Any]]]) -> None:
    """Set each named field of every event (value k on event k), frozen Structs included:
    one ``map`` in C per field, no Python per event (a hub's stamp of a batch, a round's
    placement of records made over many envs)."""
    for name, values in fields:
        deque(map(msgspec.structs.force_setattr, events, repeat(name), values), maxlen=0)


def event_tag(cls: type[Event]) -> str:
    """The type name an event class is stored under."""
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag
