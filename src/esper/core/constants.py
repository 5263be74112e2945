"""Reference numbers of the domain, named once.

Every number the spec gives lives here so code never carries a bare literal. Where a
CPU-sized default differs from the reference, the config says so (see docs/config.md).
"""

from __future__ import annotations

from typing import Final

from esper.core.enums import AlphaCurve, BlendOp, GerminationStyle, LifecycleOp, SeedStage, Topology

# --- Lifecycle -------------------------------------------------------------------------
EMBARGO_EPOCHS: Final = 5
RESETTING_EPOCHS: Final = 1
MIN_PRUNE_AGE: Final = 5
G2_MIN_TRAINING_EPOCHS: Final = 10
#: Steps an episode must still have (this one included) for a seed germinated now to
#: blend at all before its last validation: one epoch to pass G1, G2's minimum training
#: epochs, one to pass G2 and one for alpha to leave 0 (measured through HostEnvs with
#: auto-advance and with the earliest policy ADVANCEs: tests/training/test_envs.py).
GERMINATE_MIN_STEPS_LEFT: Final = G2_MIN_TRAINING_EPOCHS + 3
G2_MIN_GRADIENT_HEALTH: Final = 0.7
G2_STRICT_MIN_IMPROVEMENT_PP: Final = 0.5
G2_STRICT_MIN_GRAD_RATIO: Final = 0.10
G3_STRICT_MIN_BLENDING_EPOCHS: Final = 10
G5_STRICT_MIN_CONTRIBUTION_PP: Final = 1.0
DEFAULT_MAX_SEEDS: Final = 3

#: Stages whose seed module runs in the forward pass.
FORWARD_STAGES: Final = frozenset(
    {SeedStage.TRAINING, SeedStage.BLENDING, SeedStage.HOLDING, SeedStage.FOSSILIZED}
)
# Action-mask rules by stage, torch-free: the mask rules (policy/mask_rules.py) that
# the policy's masks and the telemetry demo both evaluate read them.
#: While any slot holds a seed in one of these stages, nothing new may germinate.
GERMINATE_BLOCKING: Final = (
    SeedStage.GERMINATED,
    SeedStage.TRAINING,
    SeedStage.PRUNED,
    SeedStage.EMBARGOED,
    SeedStage.RESETTING,
)
#: Stages that count against the seed limit (a seed occupies the slot).
OCCUPYING: Final = (
    SeedStage.GERMINATED,
    SeedStage.TRAINING,
    SeedStage.BLENDING,
    SeedStage.HOLDING,
    SeedStage.FOSSILIZED,
)
#: Stages whose seed may be pruned (every occupying stage but FOSSILIZED).
PRUNABLE: Final = (SeedStage.GERMINATED, SeedStage.TRAINING, SeedStage.BLENDING, SeedStage.HOLDING)
#: With ``policy.prune_after_blending``: the stages where a seed's contribution has been
#: measured (its counterfactual exists from blending on); before that a PRUNE throws the
#: seed's training away on no evidence.
PRUNABLE_AFTER_BLENDING: Final = (SeedStage.BLENDING, SeedStage.HOLDING)
#: Stages whose alpha target may be changed.
RETARGETABLE: Final = (SeedStage.BLENDING, SeedStage.HOLDING)
#: Allowed transitions; anything else raises.
TRANSITIONS: Final[dict[SeedStage, frozenset[SeedStage]]] = {
    SeedStage.DORMANT: frozenset({SeedStage.GERMINATED}),
    SeedStage.GERMINATED: frozenset({SeedStage.TRAINING, SeedStage.PRUNED}),
    SeedStage.TRAINING: frozenset({SeedStage.BLENDING, SeedStage.PRUNED}),
    SeedStage.BLENDING: frozenset({SeedStage.HOLDING, SeedStage.PRUNED}),
    SeedStage.HOLDING: frozenset({SeedStage.FOSSILIZED, SeedStage.BLENDING, SeedStage.PRUNED}),
    SeedStage.FOSSILIZED: frozenset(),
    SeedStage.PRUNED: frozenset({SeedStage.EMBARGOED}),
    SeedStage.EMBARGOED: frozenset({SeedStage.RESETTING}),
    SeedStage.RESETTING: frozenset({SeedStage.DORMANT}),
}
#: The stages a seed passes through when every gate passes (germination to fossilization).
SUCCESS_PATH: Final = (
    SeedStage.GERMINATED,
    SeedStage.TRAINING,
    SeedStage.BLENDING,
    SeedStage.HOLDING,
    SeedStage.FOSSILIZED,
)

# --- Alpha controller ------------------------------------------------------------------
ALPHA_TARGETS: Final = (0.5, 0.7, 1.0)
ALPHA_SPEEDS: Final = (0, 3, 5, 8)  # epochs; 0 means instant
TEMPOS: Final = (3, 5, 8)  # blend length (epochs) chosen at germination
SIGMOID_STEEPNESS: Final[dict[AlphaCurve, float]] = {
    AlphaCurve.SIGMOID_GENTLE: 6.0,
    AlphaCurve.SIGMOID: 12.0,
    AlphaCurve.SIGMOID_SHARP: 24.0,
}
STYLE_CURVE: Final[dict[GerminationStyle, AlphaCurve]] = {
    GerminationStyle.LINEAR_ADD: AlphaCurve.LINEAR,
    GerminationStyle.LINEAR_MULTIPLY: AlphaCurve.LINEAR,
    GerminationStyle.SIGMOID_ADD: AlphaCurve.SIGMOID,
    GerminationStyle.GATED_GATE: AlphaCurve.LINEAR,
}
STYLE_BLEND: Final[dict[GerminationStyle, BlendOp]] = {
    GerminationStyle.LINEAR_ADD: BlendOp.ADD,
    GerminationStyle.LINEAR_MULTIPLY: BlendOp.MULTIPLY,
    GerminationStyle.SIGMOID_ADD: BlendOp.ADD,
    GerminationStyle.GATED_GATE: BlendOp.GATE,
}

# --- Blueprints ------------------------------------------------------------------------
CNN_BLUEPRINTS: Final = (
    "norm",
    "attention",
    "conv_small",
    "depthwise",
    "bottleneck",
    "conv_light",
    "conv_heavy",
)
TRANSFORMER_BLUEPRINTS: Final = ("norm", "lora", "lora_large", "attention", "mlp_small", "mlp")
#: The blueprint head indexes this union (masked per host topology).
ALL_BLUEPRINTS: Final = (
    "norm",
    "attention",
    "conv_small",
    "depthwise",
    "bottleneck",
    "conv_light",
    "conv_heavy",
    "lora",
    "lora_large",
    "mlp_small",
    "mlp",
)
#: What a run may grow when ``host.slots`` / ``policy.blueprints`` are not set, per host
#: topology (empty: every slot or blueprint the host offers). On the default narrow CNN
#: only ``conv_heavy`` seeds in the first block's two slots add accuracy, so a policy
#: that may choose them learns growth that pays (docs/training.md, "What a default run
#: learns"); nothing has been measured for the transformer, which keeps every choice.
RECOMMENDED_SLOTS: Final[dict[Topology, tuple[str, ...]]] = {
    Topology.CNN: ("r0c0", "r1c0"),
    Topology.TRANSFORMER: (),
}
RECOMMENDED_BLUEPRINTS: Final[dict[Topology, tuple[str, ...]]] = {
    Topology.CNN: ("conv_heavy",),
    Topology.TRANSFORMER: (),
}
LORA_RANK: Final = 8
LORA_LARGE_RANK: Final = 32

# --- Action heads ----------------------------------------------------------------------
HEAD_NAMES: Final = (
    "op",
    "slot",
    "blueprint",
    "style",
    "tempo",
    "alpha_target",
    "alpha_speed",
    "alpha_curve",
)
#: Heads (besides op) whose value matters for each op; the rest take canonical values.
RELEVANT_HEADS: Final[dict[LifecycleOp, frozenset[str]]] = {
    LifecycleOp.WAIT: frozenset({"op"}),
    LifecycleOp.GERMINATE: frozenset({"op", "slot", "blueprint", "style", "tempo", "alpha_target"}),
    LifecycleOp.SET_ALPHA_TARGET: frozenset(
        {"op", "slot", "style", "alpha_target", "alpha_speed", "alpha_curve"}
    ),
    LifecycleOp.PRUNE: frozenset({"op", "slot", "alpha_speed", "alpha_curve"}),
    LifecycleOp.FOSSILIZE: frozenset({"op", "slot"}),
    LifecycleOp.ADVANCE: frozenset({"op", "slot"}),
}
#: Canonical index for each head when irrelevant to the chosen op.
CANONICAL_HEAD_VALUE: Final[dict[str, int]] = {
    "op": 0,
    "slot": 0,
    "blueprint": 0,
    "style": 0,
    "tempo": 0,
    "alpha_target": len(ALPHA_TARGETS) - 1,
    "alpha_speed": 0,
    "alpha_curve": 0,
}

# --- Optimisers (host and seeds) -------------------------------------------------------
HOST_LR: Final = 0.01
HOST_MOMENTUM: Final = 0.9
HOST_WEIGHT_DECAY: Final = 5e-4
SEED_LR: Final = 0.01
#: Gradient-norm clip of host and seed parameters per training batch.
HOST_GRAD_CLIP: Final = 5.0

# --- Seeding ---------------------------------------------------------------------------
#: Strides that derive per-round / per-env seeds from the run seed without collisions.
ROUND_SEED_STRIDE: Final = 1_000_003
ENV_SEED_STRIDE: Final = 10_007

# --- Policy: observations, masks, heuristic --------------------------------------------
#: Epochs of loss/accuracy history carried in the observation.
OBS_HISTORY_LEN: Final = 5
#: The observation normaliser clips normalised features to +-this many std devs.
OBS_CLIP: Final = 10.0
#: Accuracies are percentages; features divide by this to put them in [0, 1].
ACC_PERCENT_SCALE: Final = 100.0
#: An epoch whose val accuracy does not beat the best so far by this many percentage
#: points is a plateau epoch. (Accuracy, not loss: on small tasks the loss keeps falling
#: by several percent per epoch long after accuracy has saturated.)
PLATEAU_MIN_ACC_GAIN_PP: Final = 0.5
#: The host counts as stabilised (a latch) once the epoch-over-epoch val accuracy gain has
#: stayed below STABILISATION_MAX_ACC_GAIN_PP for STABILISATION_EPOCHS epochs in a row.
STABILISATION_MAX_ACC_GAIN_PP: Final = 1.0
STABILISATION_EPOCHS: Final = 3
#: Plateau counts are clipped to this in the observation.
PLATEAU_FEATURE_CAP: Final = 10
#: Logit given to masked choices: large and finite so a fully-masked row never yields NaN.
MASKED_LOGIT: Final = -1e9
#: Heuristic germination choices: tempo (also its retarget speed; a member of TEMPOS and
#: ALPHA_SPEEDS) and alpha target (a member of ALPHA_TARGETS).
HEURISTIC_TEMPO: Final = 5
HEURISTIC_ALPHA_TARGET: Final = 1.0
#: The heuristic prunes a HOLDING seed that has not cleared the fossilize threshold after
#: this many epochs, and a TRAINING seed stuck this many epochs past the G2 minimum.
HEURISTIC_STALL_EPOCHS: Final = 5
#: Blueprint rotation: each prune adds this penalty to the blueprint; penalties decay
#: by this factor every decision.
HEURISTIC_PRUNE_PENALTY: Final = 1.0
HEURISTIC_PENALTY_DECAY: Final = 0.9
#: Germination style of the heuristic (a GerminationStyle name, lower case).
HEURISTIC_STYLE: Final = "linear_add"
#: Rotation order, most capacity first (CNN seed parameters at 4 / 16 channels:
#: conv_heavy 296 / 4,640, conv_small 164 / 2,576, bottleneck 196 / 304, conv_light
#: 164 / 656, depthwise 64 / 448, attention 40 / 148, norm 8 / 32). A seed adds accuracy
#: only through capacity: on a 4-channel digits host an eager grower gained +0.02 pp
#: rotating from ``norm`` and +1.4 pp with ``conv_heavy`` (docs/training.md).
#: ``policy.heuristic_blueprints`` overrides it.
HEURISTIC_BLUEPRINT_ORDER: Final[tuple[str, ...]] = (
    "conv_heavy",
    "conv_small",
    "bottleneck",
    "conv_light",
    "depthwise",
    "mlp",
    "lora_large",
    "attention",
    "mlp_small",
    "lora",
    "norm",
)
