"""Typed, strict run configuration (msgspec), loadable from TOML or JSON.

Unknown keys and wrong types are errors that name the key path (``$.ppo.lr``), and
sizes are validated after decoding. This module never imports torch so that a bad
config fails before the expensive import. CPU-sized defaults that differ from the
reference numbers are listed in ``docs/config.md``.
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from esper.config_checks import validate
from esper.core.constants import (
    HEURISTIC_ALPHA_TARGET,
    HEURISTIC_BLUEPRINT_ORDER,
    HEURISTIC_PENALTY_DECAY,
    HEURISTIC_PRUNE_PENALTY,
    HEURISTIC_STALL_EPOCHS,
    HEURISTIC_STYLE,
    HEURISTIC_TEMPO,
    HOST_GRAD_CLIP,
    HOST_LR,
    HOST_MOMENTUM,
    HOST_WEIGHT_DECAY,
    PLATEAU_MIN_ACC_GAIN_PP,
    SEED_LR,
    STABILISATION_EPOCHS,
    STABILISATION_MAX_ACC_GAIN_PP,
)
from esper.core.enums import (
    AmpMode,
    ParamCostBasis,
    PolicyKind,
    RewardFamily,
    TaskName,
    TelemetryLevel,
)
from esper.errors import ConfigError
from esper.suggest import did_you_mean

Positive = Annotated[int, msgspec.Meta(gt=0)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
NonPositiveFloat = Annotated[float, msgspec.Meta(le=0)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
#: Seeds are offset by round/env strides before reaching torch's int64 generators.
MAX_SEED = 2**32 - 1
Seed = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEED)]
#: Most envs one process runs: each env is a whole host network with its optimizer and
#: runs sequentially per step, so far more is a typo or a memory exhaustion, not a run.
MAX_ENVS = 1024
EnvCount = Annotated[int, msgspec.Meta(ge=1, le=MAX_ENVS)]
#: Lifecycle op names as config keys (``esper.core.enums.LifecycleOp``, lower case).
OpName = Literal["wait", "germinate", "set_alpha_target", "prune", "fossilize", "advance"]
#: Action head names as config keys (``esper.core.constants.HEAD_NAMES``).
HeadName = Literal[
    "op", "slot", "blueprint", "style", "tempo", "alpha_target", "alpha_speed", "alpha_curve"
]
#: Germination style names as config values (``esper.core.enums.GerminationStyle``).
StyleName = Literal["linear_add", "linear_multiply", "sigmoid_add", "gated_gate"]
#: Default exploration prior: PPO starts as an eager grower that rarely prunes (see
#: ``docs/training.md``, "The initial op prior" and "What a default run learns").
DEFAULT_OP_PRIOR: dict[OpName, float] = {"prune": -5.0, "germinate": 3.0}


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    pass


class TaskConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: TaskName = TaskName.DIGITS
    #: Local directory (cifar10) or file (text); never downloaded.
    data_path: str | None = None
    batch_size: Positive = 64
    #: Cap on training samples seen per env per epoch (None: the env's full share).
    train_samples_per_env: Positive | None = None
    #: Each env trains on its own share of every epoch's shuffle (false: all envs train on
    #: the same samples, so the env count no longer divides the data).
    env_split: bool = True
    #: Validation samples used per step (None: the whole validation split).
    val_samples: Positive | None = None
    #: synthetic task size; ignored by the others.
    synthetic_train_size: Positive = 4096
    synthetic_val_size: Positive = 1000
    #: text task context length in bytes.
    seq_len: Positive = 64
    channels_last: bool = True


class HostConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    #: CNN width: 4 channels (a host seeds can improve; at 16 it reaches 97 % alone).
    base_channels: Positive = 4
    n_blocks: Positive = 3
    #: CNN: each block's width (its length is the depth); empty: ``base_channels * 2**i``
    #: for ``n_blocks`` blocks.
    block_channels: list[Positive] = msgspec.field(default_factory=list)
    #: transformer host
    d_model: Positive = 64
    n_heads: Positive = 4
    n_layers: Positive = 2
    #: Slot ids to enable. Unset: the host topology's recommended slots
    #: (``RECOMMENDED_SLOTS``: a CNN's ``r0c0`` and ``r1c0``); empty: every slot it offers.
    slots: list[str] | None = None
    max_seeds: Positive = 3
    strict_gates: bool = False
    #: Seeds pass their gates on their own once the gates' timing rules are met
    #: (growth is one GERMINATE decision; prune, retarget and fossilize stay the policy's).
    auto_advance: bool = True
    #: Host training: SGD on the host (and fossilized seeds), one SGD per live seed.
    lr: PositiveFloat = HOST_LR
    momentum: Fraction = HOST_MOMENTUM
    weight_decay: NonNegativeFloat = HOST_WEIGHT_DECAY
    seed_lr: PositiveFloat = SEED_LR
    #: Gradient-norm clip of host and seed parameters per batch.
    grad_clip: PositiveFloat = HOST_GRAD_CLIP


class EagerConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The eager grower's germination (``[policy.eager]``); its other rules (fossilize,
    prune, stall, rotation penalties) are the heuristic's ``[policy]`` keys."""

    #: Germination rotation order (one name: always that blueprint; those the host does
    #: not offer are skipped, recently pruned ones avoided).
    blueprints: list[str] = msgspec.field(default_factory=lambda: list(HEURISTIC_BLUEPRINT_ORDER))
    #: Slots to germinate in, the first free one first; slots not listed are never grown.
    #: Empty: every slot, in the host's order.
    slot_order: list[str] = msgspec.field(default_factory=list)
    style: StyleName = HEURISTIC_STYLE
    #: Blend length in epochs at germination (one of ``TEMPOS``), also the retarget speed.
    tempo: Positive = HEURISTIC_TEMPO
    #: Alpha target at germination and when retargeting (one of ``ALPHA_TARGETS``).
    alpha_target: PositiveFloat = HEURISTIC_ALPHA_TARGET


class PolicyConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    #: ppo | heuristic | eager | random | static (``esper train --policy``).
    kind: PolicyKind = PolicyKind.PPO
    feature_dim: Positive = 128
    lstm_hidden: Positive = 128
    blueprint_embed_dim: Positive = 4
    compile: bool = False
    #: Blueprints every policy may germinate (masked otherwise). Unset: the host
    #: topology's recommended ones (``RECOMMENDED_BLUEPRINTS``: a CNN's ``conv_heavy``);
    #: empty: all the host offers.
    blueprints: list[str] | None = None
    #: Alpha targets every policy may choose (germination and retarget heads; masked
    #: otherwise); empty: all of ``ALPHA_TARGETS``.
    alpha_targets: list[float] = msgspec.field(default_factory=lambda: [1.0])
    #: Germination styles (style head) and blend tempos in epochs (tempo head) every
    #: policy may choose; empty: all of them (``GerminationStyle``, ``TEMPOS``).
    styles: list[StyleName] = msgspec.field(default_factory=lambda: ["linear_add"])
    tempos: list[int] = msgspec.field(default_factory=lambda: [5])
    #: Mask GERMINATE once too few steps remain for a new seed to blend before the
    #: episode ends (it could only cost parameters).
    mask_late_germination: bool = False
    #: Mask PRUNE until a seed has started blending: before that no counterfactual has
    #: measured it, so pruning only throws its training away.
    prune_after_blending: bool = True
    #: With a host family: the observation carries the host's descriptors (false: the
    #: policy sees the same features as without a family; an ablation).
    observe_host: bool = True
    #: Initial op-head logit bias per op (learned from there on); unnamed ops start at 0.
    op_prior: dict[OpName, float] = msgspec.field(default_factory=lambda: dict(DEFAULT_OP_PRIOR))
    #: Host signals (observation features and the heuristic): plateau epochs and the
    #: "host stabilised" latch.
    plateau_gain_pp: NonNegativeFloat = PLATEAU_MIN_ACC_GAIN_PP
    stabilise_gain_pp: NonNegativeFloat = STABILISATION_MAX_ACC_GAIN_PP
    stabilise_epochs: Positive = STABILISATION_EPOCHS
    #: heuristic policy
    plateau_patience: Positive = 3
    fossilize_threshold_pp: float = 1.0
    prune_threshold_pp: float = -0.5
    heuristic_blueprints: list[str] = msgspec.field(
        default_factory=lambda: list(HEURISTIC_BLUEPRINT_ORDER)
    )
    heuristic_style: StyleName = HEURISTIC_STYLE
    heuristic_tempo: Positive = HEURISTIC_TEMPO
    heuristic_alpha_target: PositiveFloat = HEURISTIC_ALPHA_TARGET
    heuristic_stall_epochs: Positive = HEURISTIC_STALL_EPOCHS
    heuristic_prune_penalty: NonNegativeFloat = HEURISTIC_PRUNE_PENALTY
    heuristic_penalty_decay: Fraction = HEURISTIC_PENALTY_DECAY
    #: eager grower (``kind = "eager"``): what it germinates, where and how
    eager: EagerConfig = msgspec.field(default_factory=EagerConfig)


class PPOConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    lr: PositiveFloat = 3e-4
    clip: PositiveFloat = 0.2
    gamma: Fraction = 0.995
    gae_lambda: Fraction = 1.0
    entropy_coef: NonNegativeFloat = 0.05
    entropy_coef_floor: NonNegativeFloat = 0.01
    #: Rounds over which the entropy coefficient anneals linearly to the floor.
    entropy_anneal_rounds: NonNegative = 0
    #: Weight of each head's entropy in the bonus (unnamed heads 1): e.g. ``{slot = 5.0}``
    #: keeps exploring where to grow while the op head sharpens.
    head_entropy_weights: dict[HeadName, NonNegativeFloat] = msgspec.field(default_factory=dict)
    value_coef: NonNegativeFloat = 1.0
    max_grad_norm: PositiveFloat = 5.0
    target_kl: PositiveFloat | None = 0.015
    update_epochs: Positive = 8
    #: Gradient steps per epoch: the rollout's chunks are shuffled into this many groups.
    minibatches: Positive = 4
    #: Steps per recurrent chunk (replayed from the stored LSTM state); 0 = whole episodes.
    chunk_length: NonNegative = 10
    normalize_advantages: bool = True
    #: Rounds over which the learning rate anneals linearly to lr * lr_final_fraction.
    lr_anneal_rounds: NonNegative = 0
    lr_final_fraction: Fraction = 0.1
    adam_eps: PositiveFloat = 1e-5


class RewardConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    family: RewardFamily = RewardFamily.ACCURACY
    shaping: bool = False
    terminal: bool = True
    anti_gaming: bool = True
    stage_shaping_weight: NonNegativeFloat = 0.3
    rent_weight: NonNegativeFloat = 0.5
    rent_cap: NonNegativeFloat = 1.5
    terminal_weight: NonNegativeFloat = 0.05
    #: ``accuracy`` family: reward per pp of validation accuracy gained since the last step.
    accuracy_weight: NonNegativeFloat = 0.1
    #: ``accuracy`` family: cost per unit of (seed parameters / host parameters), paid
    #: as the seed parameters change (germinate pays, prune refunds).
    param_cost_weight: NonNegativeFloat = 0.05
    #: ``accuracy`` family: which parameters the cost counts. ``live``: a seed costs from
    #: germination on, so pruning it before it blends refunds a cost it never earned
    #: back; ``blended``: alpha x parameters, paid as the seed reaches the output.
    param_cost_basis: ParamCostBasis = ParamCostBasis.LIVE
    normalize: bool = True
    #: Normalised rewards are clipped to +-this (a blow-up is not an unbounded reward).
    normalize_clip: PositiveFloat = 10.0
    # --- contribution family: attribution -------------------------------------------
    #: Reward per pp of credited contribution.
    attribution_weight: NonNegativeFloat = 0.1
    #: Reward per pp of harm (negative contribution): more than help, so that keeping a
    #: harmful seed is never a wash.
    harm_weight: NonNegativeFloat = 0.15
    #: Anti-gaming: positive credit scales with alpha up to this alpha.
    full_credit_alpha: PositiveFloat = 0.5
    # --- anti-gaming: alpha shock -----------------------------------------------------
    #: Alpha may move this much in one step for free; beyond it each unit costs
    #: ``alpha_shock_weight``.
    alpha_shock_free: NonNegativeFloat = 0.25
    alpha_shock_weight: NonNegativeFloat = 0.5
    # --- per-op shaping (reward.shaping): costs are negative, bonuses positive ----------
    germinate_cost: NonPositiveFloat = -0.1
    #: Fossilize bonus per pp of contribution, capped at ``fossilize_bonus_cap_pp``.
    fossilize_bonus_per_pp: NonNegativeFloat = 0.3
    fossilize_bonus_cap_pp: NonNegativeFloat = 10.0
    #: Fossilizing a seed that adds nothing costs this, plus the per-pp rate per pp of harm.
    fossilize_useless_penalty: NonPositiveFloat = -0.5
    prune_cost: NonPositiveFloat = -0.05
    #: A seed younger than this many epochs is young: pruning it costs up to
    #: ``prune_young_penalty`` more, linearly less as it ages.
    prune_young_age: Positive = 10
    prune_young_penalty: NonPositiveFloat = -0.3
    #: Pruning a helpful seed costs this per pp of its contribution.
    prune_helpful_per_pp: NonPositiveFloat = -0.2
    invalid_action_penalty: NonPositiveFloat = -0.1
    # --- loss family -------------------------------------------------------------------
    #: Reward per unit of loss improvement, in units of the random-guess loss ...
    loss_delta_weight: NonNegativeFloat = 10.0
    #: ... with the improvement clipped to +-this (a blow-up is not a -inf reward).
    loss_delta_clip: PositiveFloat = 1.0
    #: Terminal term of the loss family: 1 - loss / random guess, clipped to +-this.
    loss_terminal_clip: PositiveFloat = 1.0


class GovernorConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    enabled: bool = True
    snapshot_every: Positive = 5
    lobotomy_tolerance: Fraction = 0.065
    divergence_min_loss: PositiveFloat = 12.0
    divergence_sigma: PositiveFloat = 6.0
    divergence_mean_factor: PositiveFloat = 3.0
    divergence_consecutive: Positive = 3
    penalty: float = -10.0
    #: Rollback penalties are clipped to [-penalty_cap, 0].
    penalty_cap: NonNegativeFloat = 10.0
    #: Healthy losses kept for the divergence and lobotomy statistics.
    history_window: Positive = 20
    #: Checks needed before the statistical detectors (lobotomy, divergence) may fire.
    min_history: Positive = 3
    #: Lobotomy: the mean of the last ``lobotomy_recent`` healthy losses was under this
    #: fraction of the random-guess loss ("well below random guessing").
    lobotomy_below_fraction: Fraction = 0.6
    lobotomy_recent: Positive = 5


class TelemetryConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    level: str = "normal"
    dir: str = "runs"
    #: Durability bound: a kill -9 loses at most this much of the latest events.
    flush_interval_s: PositiveFloat = 1.0
    queue_capacity: Positive = 65536
    drop_when_full: bool = False
    escalation_rounds: NonNegative = 2
    # --- anomaly detection on each PPO update (training/loop/anomaly.py) ---------------------
    #: Largest probability ratio of an update before it is a ratio explosion.
    anomaly_ratio_max: PositiveFloat = 5.0
    #: approx KL above this multiple of ``ppo.target_kl`` is a KL spike.
    anomaly_kl_factor: PositiveFloat = 10.0
    #: Op-head entropy below this is an entropy collapse.
    anomaly_entropy_min: NonNegativeFloat = 0.01
    #: Explained variance below this is a value collapse.
    anomaly_ev_min: float = -1.0

    @property
    def level_enum(self) -> TelemetryLevel:
        return TelemetryLevel.parse(self.level)


class RunConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    n_envs: EnvCount = 4
    rounds: Positive = 3
    episode_length: Positive = 20
    seed: Seed = 0
    device: str = "cpu"
    #: Devices for envs, round-robin (empty: all envs on ``device``).
    env_devices: list[str] = msgspec.field(default_factory=list)
    amp: AmpMode = AmpMode.OFF
    run_id: str = ""
    counterfactual_factorial: bool = True
    checkpoint_every: NonNegative = 1
    #: Intra-op CPU threads (0 = the cores this process may use, divided among local
    #: torchrun processes). 1 by default: results do not depend on the machine (the
    #: thread count changes float reductions), and runs side by side do not oversubscribe
    #: the cores (25x slower measured); see docs/config.md.
    torch_threads: NonNegative = 1
    #: CUDA only: float32 matmuls and convolutions on TF32 tensor cores (ignored on CPU,
    #: where runs stay bit-identical).
    tf32: bool = True
    #: Train the envs' CNN hosts as one vmapped graph per batch, seeds grouped per slot
    #: (``training/passes/slot_groups.py``); results equal the per-env path up to float
    #: summation order. "auto" (:meth:`Config.batches_envs`): on for float32 CUDA runs
    #: without a host family (1.7-2x the per-env trainer's EPS at 16-64 envs on an
    #: H200), off on a CPU, where it is slower.
    batch_envs: bool | Literal["auto"] = "auto"


class FamilyMember(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One host of a family: a CNN with these block widths (its depth is their count);
    everything else is ``[host]``."""

    name: str
    block_channels: list[Positive]


class FamilyConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A host family (``[[family.members]]``): at every reset each env draws its host
    from the members, balanced within a round and seeded by (run seed, round), so
    every policy run with the same seed trains the same hosts. Empty: every env's host
    is ``[host]``. With a family the observation carries the host's descriptors."""

    members: list[FamilyMember] = msgspec.field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return bool(self.members)


class Config(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    run: RunConfig = msgspec.field(default_factory=RunConfig)
    task: TaskConfig = msgspec.field(default_factory=TaskConfig)
    host: HostConfig = msgspec.field(default_factory=HostConfig)
    family: FamilyConfig = msgspec.field(default_factory=FamilyConfig)
    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    ppo: PPOConfig = msgspec.field(default_factory=PPOConfig)
    reward: RewardConfig = msgspec.field(default_factory=RewardConfig)
    governor: GovernorConfig = msgspec.field(default_factory=GovernorConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)

    @property
    def observes_host(self) -> bool:
        """The observation carries host descriptors: a family, and not ablated."""
        return self.family.enabled and self.policy.observe_host

    def fingerprint(self) -> str:
        """Stable hash of the behaviour-defining config (run id and output dir excluded)."""
        data = msgspec.to_builtins(self)
        data["run"].pop("run_id", None)
        data["telemetry"].pop("dir", None)
        encoded = msgspec.json.encode(data, order="sorted")
        return hashlib.sha256(encoded).hexdigest()[:16]

    def batches_envs(self) -> bool:
        """Whether the envs train as batched graphs (``run.batch_envs``; "auto" as
        documented there: batching has not been measured with AMP, nor with a host
        family, whose members batch apart, one group each)."""
        if self.run.batch_envs != "auto":
            return bool(self.run.batch_envs)
        on_cuda = self.run.device.startswith("cuda")
        return on_cuda and self.run.amp == AmpMode.OFF and not self.family.enabled

    def to_json(self) -> str:
        return msgspec.json.encode(self, order="sorted").decode()


_BAD_CHOICE = re.compile(
    r"Invalid enum value '(?P<value>[^']*)' - at (`key` in )?`\$\.(?P<path>[\w.]+)`"
)
_UNKNOWN_KEY = re.compile(
    r"Object contains unknown field `(?P<key>[^`]*)`( - at `\$\.(?P<path>[\w.]+)`)?"
)


def _field_type(path: str) -> Any:
    """The annotated type at a dotted path of :class:`Config` (None: no such key)."""
    node: Any = Config
    for name in path.split(".") if path else []:
        fields = typing.get_type_hints(node) if _is_section(node) else {}
        if name not in fields:
            return None
        node = fields[name]
    return node


def _is_section(node: Any) -> bool:
    return isinstance(node, type) and issubclass(node, msgspec.Struct)


def keys_at(path: str) -> list[str]:
    """The keys a config section accepts (``""``: the top-level sections)."""
    node = _field_type(path)
    return list(typing.get_type_hints(node)) if _is_section(node) else []


def _choices_at(path: str) -> list[str]:
    """The values a choice field (an enum or a literal) at ``path`` accepts; for a
    mapping (``policy.op_prior``), those of its keys."""
    node: Any = Config
    for name in path.split("."):
        fields = typing.get_type_hints(node) if isinstance(node, type) else {}
        if name not in fields:
            return []
        node = fields[name]
    if typing.get_origin(node) is dict:
        node = typing.get_args(node)[0]
    if typing.get_origin(node) in (typing.Union, types.UnionType):  # bool | Literal["auto"]
        return [c for arg in typing.get_args(node) for c in _choices_of(arg)]
    return _choices_of(node)


def _choices_of(node: Any) -> list[str]:
    """The values one type accepts, when it is a choice (enum, literal, bool)."""
    if node is bool:
        return ["true", "false"]
    if isinstance(node, type) and issubclass(node, enum.Enum):
        return [str(m.value) for m in node]
    return [str(v) for v in typing.get_args(node)] if typing.get_origin(node) is Literal else []


def _convert_error(exc: msgspec.ValidationError, source: str) -> ConfigError:
    """msgspec's message, plus the valid values and the nearest for a bad choice."""
    text = str(exc)
    unknown = _UNKNOWN_KEY.search(text)
    if unknown:
        text += did_you_mean(unknown["key"], keys_at(unknown["path"] or ""))
    bad = _BAD_CHOICE.search(text)
    valid = _choices_at(bad["path"]) if bad else []
    if bad and valid:
        near = difflib.get_close_matches(bad["value"], valid, n=1, cutoff=0.5)
        text += f" (choose from {', '.join(valid)}" + (
            f"; did you mean {near[0]!r}?)" if near else ")"
        )
    return ConfigError(f"{source}: {text}")


def config_from_dict(data: dict[str, Any], *, source: str = "config") -> Config:
    """Decode and validate a plain mapping (strict: unknown keys and wrong types raise)."""
    try:
        cfg = msgspec.convert(data, Config, strict=True)
    except msgspec.ValidationError as exc:
        raise _convert_error(exc, source) from None
    try:
        return validate(cfg)
    except ConfigError as exc:  # name the file, like the decoding errors do
        raise ConfigError(f"{source}: {exc}") from None


def load_config(path: str | Path) -> Config:
    """Load a TOML or JSON config file; errors name the file and the key path."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    raw = p.read_bytes()
    try:
        if p.suffix.lower() == ".toml":
            data = msgspec.toml.decode(raw)
        elif p.suffix.lower() == ".json":
            data = msgspec.json.decode(raw)
        else:
            raise ConfigError(f"{p}: unsupported config format (use .toml or .json)")
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not valid {p.suffix[1:].upper()}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a table/object")
    return config_from_dict(data, source=str(p))


def config_hash_of(stored: object) -> str:
    """The fingerprint of a configuration stored as JSON (a checkpoint's ``config``), so
    a resume can tell which run wrote it; empty when none is stored."""
    if not isinstance(stored, str):
        return ""
    source = "the checkpoint's stored configuration"
    try:
        data = msgspec.json.decode(stored)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be an object")
    return config_from_dict(data, source=source).fingerprint()


def with_overrides(cfg: Config, overrides: dict[str, Any]) -> Config:
    """Apply dotted-path overrides (``{"run.n_envs": 4}``) with the same strict checks.

    A path through a mapping (``policy.op_prior.prune``) sets one of its entries; an
    unknown key is an error naming it and the nearest valid one.
    """
    data = msgspec.to_builtins(cfg)
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for depth, part in enumerate(parents):
            child = node.get(part) if isinstance(node, dict) else None
            if part in node and not isinstance(child, dict):
                path = ".".join(parents[: depth + 1])
                raise ConfigError(f"$.{dotted}: {path} is a value, not a section")
            if not isinstance(child, dict):
                raise _unknown_key(".".join(parents[:depth]), part, dotted)
            node = child
        section = ".".join(parents)
        if leaf not in node and _is_section(_field_type(section)):
            raise _unknown_key(section, leaf, dotted)
        node[leaf] = value
    return config_from_dict(data, source="overrides")


def _unknown_key(section: str, key: str, dotted: str) -> ConfigError:
    keys = keys_at(section)
    where = f"[{section}]" if section else "the config's sections"
    return ConfigError(
        f"$.{dotted}: unknown key {key!r} in {where}{did_you_mean(key, keys)}"
        + (f"; valid: {', '.join(keys)}" if keys and len(keys) <= MAX_LISTED_KEYS else "")
    )


#: An unknown key's error lists the valid ones when there are at most this many.
MAX_LISTED_KEYS = 12


def parse_assignment(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--set``: VALUE is a TOML value (``1e-3``, ``true``, ``[2, 4]``,
    ``{ prune = -3.0 }``, ``"text"``); a bare word is a string, ``none`` clears an
    optional key. Types are checked when the override is applied, like the TOML's."""
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key or not raw:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE (e.g. ppo.lr=1e-3)")
    if raw.lower() in ("none", "null"):
        return key, None
    try:
        value = msgspec.toml.decode(f"value = {raw}".encode())["value"]
    except msgspec.DecodeError:
        return key, raw  # a bare word (digits, cuda:0): the string itself
    return key, value
