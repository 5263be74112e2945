"""Enumerations shared by every subsystem.

They live in a torch-free module so that the event definitions, the config and the
analysis layer can use them without importing torch. Inside the program these enums
are used; events store their ``.value`` strings.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class SeedStage(StrEnum):
    """Lifecycle stage of a seed slot (a slot with no seed is DORMANT)."""

    DORMANT = "DORMANT"
    GERMINATED = "GERMINATED"
    TRAINING = "TRAINING"
    BLENDING = "BLENDING"
    HOLDING = "HOLDING"
    FOSSILIZED = "FOSSILIZED"
    PRUNED = "PRUNED"
    EMBARGOED = "EMBARGOED"
    RESETTING = "RESETTING"


class LifecycleOp(IntEnum):
    """Operation chosen by the op head; the integer is the head index."""

    WAIT = 0
    GERMINATE = 1
    SET_ALPHA_TARGET = 2
    PRUNE = 3
    FOSSILIZE = 4
    ADVANCE = 5


class BlendOp(StrEnum):
    ADD = "ADD"
    MULTIPLY = "MULTIPLY"
    GATE = "GATE"


class GerminationStyle(IntEnum):
    """Style head values: (alpha curve family, blend operator) pairs."""

    LINEAR_ADD = 0
    LINEAR_MULTIPLY = 1
    SIGMOID_ADD = 2
    GATED_GATE = 3


class AlphaCurve(IntEnum):
    """Alpha-curve head values. SIGMOID variants differ by steepness (6/12/24)."""

    LINEAR = 0
    COSINE = 1
    SIGMOID_GENTLE = 2
    SIGMOID = 3
    SIGMOID_SHARP = 4


class AlphaMode(StrEnum):
    HOLD = "HOLD"
    UP = "UP"
    DOWN = "DOWN"


class GateId(StrEnum):
    G0 = "G0"
    G1 = "G1"
    G2 = "G2"
    G3 = "G3"
    G5 = "G5"


class Initiator(StrEnum):
    """Who caused a lifecycle change."""

    POLICY = "policy"
    HEURISTIC = "heuristic"
    GOVERNOR = "governor"
    SYSTEM = "system"


class PruneReason(StrEnum):
    POLICY = "policy"
    SCHEDULED_COMPLETE = "scheduled_complete"
    GOVERNOR_ROLLBACK = "governor_rollback"
    HARMFUL = "harmful"
    EPISODE_END = "episode_end"


class RollbackReason(StrEnum):
    NON_FINITE_LOSS = "non_finite_loss"
    LOBOTOMY = "lobotomy"
    DIVERGENCE = "divergence"


class CounterfactualUnavailable(StrEnum):
    """Why a slot has no measured contribution (empty string means it was measured)."""

    AVAILABLE = ""
    NO_SEED = "no_seed"
    NOT_IN_FORWARD = "seed_not_in_forward"
    ALPHA_ZERO = "alpha_zero"
    DISABLED = "counterfactual_disabled"


class TelemetryLevel(IntEnum):
    """Ordered: an event is written when its level <= the run's level."""

    OFF = 0
    LIFECYCLE = 1
    NORMAL = 2
    DEBUG = 3

    @classmethod
    def parse(cls, name: str) -> TelemetryLevel:
        try:
            return cls[name.upper()]
        except KeyError:
            valid = ", ".join(m.name.lower() for m in cls)
            raise ValueError(f"unknown telemetry level {name!r} (valid: {valid})") from None


class RewardFamily(StrEnum):
    CONTRIBUTION = "contribution"
    LOSS = "loss"
    SPARSE = "sparse"
    ACCURACY = "accuracy"


class ParamCostBasis(StrEnum):
    """Which seed parameters the accuracy reward's parameter cost counts."""

    LIVE = "live"  # every live seed's parameters, from germination on
    BLENDED = "blended"  # alpha x parameters of seeds blended into the output


class TaskName(StrEnum):
    DIGITS = "digits"
    CIFAR10 = "cifar10"
    SYNTHETIC = "synthetic"
    TEXT = "text"


class Topology(StrEnum):
    CNN = "cnn"
    TRANSFORMER = "transformer"


class RunStatus(StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    CRASHED = "crashed"


class AmpMode(StrEnum):
    OFF = "off"
    FP16 = "fp16"
    BF16 = "bf16"


class PolicyKind(StrEnum):
    """Which policy decides: PPO learns; the others are baselines that run through the
    same loop and telemetry (``esper train --policy``)."""

    PPO = "ppo"
    #: Rules: germinate once the host plateaus, fossilize what helps, prune what hurts.
    HEURISTIC = "heuristic"
    #: The heuristic's rules, but it germinates whenever a slot is free.
    EAGER = "eager"
    #: Uniform over the valid ops, then over each used head's valid choices.
    RANDOM = "random"
    #: Always WAIT: the host trains alone.
    STATIC = "static"

    @property
    def learned(self) -> bool:
        """Does this policy learn (PPO updates, a rollout buffer)?"""
        return self is PolicyKind.PPO

    @property
    def rule_based(self) -> bool:
        """Are its lifecycle decisions made by rules (``Initiator.HEURISTIC``)?"""
        return self in (PolicyKind.HEURISTIC, PolicyKind.EAGER)


class AnomalyKind(StrEnum):
    RATIO_EXPLOSION = "ratio_explosion"
    VALUE_COLLAPSE = "value_collapse"
    NON_FINITE_LOSS = "non_finite_loss"
    KL_SPIKE = "kl_spike"
    ENTROPY_COLLAPSE = "entropy_collapse"
