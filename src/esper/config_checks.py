"""Checks of a decoded :class:`~esper.config.Config` that its types cannot express.

Why a module of its own: the config module declares the settings; these are the rules
between them (devices, priors, menus, the rule-based policies' choices, host
families). Every error names the key path, as decoding errors do.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from esper.core.constants import ALL_BLUEPRINTS, ALPHA_TARGETS, GERMINATE_MIN_STEPS_LEFT, TEMPOS
from esper.core.datasets import TEXT_SOURCE, cifar_how_to_get
from esper.core.enums import GerminationStyle, PolicyKind, TaskName, TelemetryLevel
from esper.errors import ConfigError

if TYPE_CHECKING:
    from esper.config import Config, PolicyConfig

DEVICE_PATTERN = re.compile(r"(cpu|cuda)(:\d+)?")
#: A prior is a nudge, not a mask: beyond this an op would be all but impossible.
MAX_OP_PRIOR = 5.0
#: Family member names: short, printable, safe in tables and file names.
MEMBER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


def validate(cfg: Config) -> Config:
    """The checks decoding cannot make: cross-field rules, names, menus, finite floats."""
    try:
        TelemetryLevel.parse(cfg.telemetry.level)
    except ValueError as exc:
        raise ConfigError(f"$.telemetry.level: {exc}") from None
    if cfg.telemetry.level_enum == TelemetryLevel.DEBUG and cfg.telemetry.escalation_rounds < 0:
        raise ConfigError("$.telemetry.escalation_rounds: must be >= 0")
    if cfg.ppo.entropy_coef_floor > cfg.ppo.entropy_coef:
        raise ConfigError("$.ppo.entropy_coef_floor: must not exceed $.ppo.entropy_coef")
    for where, device in [("$.run.device", cfg.run.device)] + [
        (f"$.run.env_devices[{i}]", d) for i, d in enumerate(cfg.run.env_devices)
    ]:
        if DEVICE_PATTERN.fullmatch(device) is None:
            raise ConfigError(f"{where}: expected cpu, cuda or cuda:<index>, got {device!r}")
    _check_finite(cfg)
    for op, bias in cfg.policy.op_prior.items():
        if not -MAX_OP_PRIOR <= bias <= MAX_OP_PRIOR:
            raise ConfigError(
                f"$.policy.op_prior.{op}: must be within +-{MAX_OP_PRIOR} (a prior, not a mask), "
                f"got {bias}"
            )
    if cfg.task.name in (TaskName.CIFAR10, TaskName.TEXT) and not cfg.task.data_path:
        what = (
            f"a directory: {cifar_how_to_get('it')}"
            if cfg.task.name == TaskName.CIFAR10
            else TEXT_SOURCE
        )
        raise ConfigError(
            f"$.task.data_path: task {cfg.task.name.value!r} needs a local path "
            f"(--data-path PATH), {what}; nothing is downloaded at run time"
        )
    _check_family(cfg)
    _check_blueprint_names(cfg.policy.blueprints or [], "blueprints")
    _check_menus(cfg.policy)
    _validate_heuristic(cfg.policy)
    if cfg.policy.mask_late_germination and cfg.run.episode_length < GERMINATE_MIN_STEPS_LEFT:
        raise ConfigError(
            f"$.policy.mask_late_germination: run.episode_length {cfg.run.episode_length} is "
            f"shorter than the {GERMINATE_MIN_STEPS_LEFT} steps a seed needs to blend, so no "
            "step could germinate"
        )
    return cfg


def _check_family(cfg: Config) -> None:
    """Member names unique and printable, block widths given (the batched host path
    stacks each member's envs apart: ``host_batching``)."""
    members = cfg.family.members
    for i, member in enumerate(members):
        where = f"$.family.members[{i}]"
        if MEMBER_NAME.fullmatch(member.name) is None:
            raise ConfigError(
                f"{where}.name: {member.name!r}: use 1-32 characters from [A-Za-z0-9_.-], "
                "starting with a letter or digit"
            )
        if member.name in [m.name for m in members[:i]]:
            raise ConfigError(f"{where}.name: {member.name!r} listed twice")
        if not member.block_channels:
            raise ConfigError(f"{where}.block_channels: must list at least one block width")
    if members and cfg.task.name == TaskName.TEXT:
        raise ConfigError(
            "$.family.members: a host family is a family of CNN hosts (block widths); "
            "task 'text' trains a transformer host"
        )


def _check_blueprint_names(names: list[str], key: str) -> None:
    """Every name a known blueprint, none listed twice (the bad index named)."""
    for i, name in enumerate(names):
        if name not in ALL_BLUEPRINTS:
            raise ConfigError(
                f"$.policy.{key}[{i}]: unknown blueprint {name!r} "
                f"(known: {', '.join(ALL_BLUEPRINTS)})"
            )
        if name in names[:i]:
            raise ConfigError(f"$.policy.{key}[{i}]: {name!r} listed twice")


def _check_menu(menu: Sequence[object], allowed: Sequence[object], key: str) -> None:
    """A head's menu: values the head can encode, none listed twice."""
    for i, value in enumerate(menu):
        if value not in allowed:
            raise ConfigError(f"$.policy.{key}[{i}]: must be one of {list(allowed)}, got {value!r}")
        if value in menu[:i]:
            raise ConfigError(f"$.policy.{key}[{i}]: {value!r} listed twice")


def _rule_choices(policy: PolicyConfig) -> tuple[tuple[str, list[str], str, int, float], ...]:
    """(key prefix, blueprints, style, tempo, alpha target) of each rule-based policy."""
    eager = policy.eager
    return (
        (
            "heuristic_",
            policy.heuristic_blueprints,
            policy.heuristic_style,
            policy.heuristic_tempo,
            policy.heuristic_alpha_target,
        ),
        ("eager.", eager.blueprints, eager.style, eager.tempo, eager.alpha_target),
    )


def _check_menus(policy: PolicyConfig) -> None:
    """The alpha-target, style and tempo menus; a rule-based policy's own choices must be
    in them when it runs (it would otherwise choose a masked value)."""
    styles = [s.name.lower() for s in GerminationStyle]
    _check_menu(policy.alpha_targets, ALPHA_TARGETS, "alpha_targets")
    _check_menu(policy.styles, styles, "styles")
    _check_menu(policy.tempos, TEMPOS, "tempos")
    running = {PolicyKind.HEURISTIC: "heuristic_", PolicyKind.EAGER: "eager."}.get(policy.kind)
    for prefix, _, style, tempo, alpha_target in _rule_choices(policy):
        if prefix != running:
            continue
        for key, menu, choice in (
            ("alpha_targets", policy.alpha_targets, alpha_target),
            ("styles", policy.styles, style),
            ("tempos", policy.tempos, tempo),
        ):
            if menu and choice not in menu:
                name = f"{prefix}{key.removesuffix('s')}"
                raise ConfigError(
                    f"$.policy.{name}: {choice!r} is not in policy.{key} {list(menu)}"
                )


def _validate_heuristic(policy: PolicyConfig) -> None:
    """The rule-based policies' choices must be values the action heads can encode."""
    for prefix, blueprints, _, tempo, alpha_target in _rule_choices(policy):
        if not blueprints:
            raise ConfigError(f"$.policy.{prefix}blueprints: must name at least one blueprint")
        _check_blueprint_names(blueprints, f"{prefix}blueprints")
        if tempo not in TEMPOS:
            raise ConfigError(f"$.policy.{prefix}tempo: must be one of {list(TEMPOS)}, got {tempo}")
        if alpha_target not in ALPHA_TARGETS:
            raise ConfigError(
                f"$.policy.{prefix}alpha_target: must be one of {list(ALPHA_TARGETS)}, "
                f"got {alpha_target}"
            )
    order = policy.eager.slot_order
    for i, slot in enumerate(order):
        if slot in order[:i]:
            raise ConfigError(f"$.policy.eager.slot_order[{i}]: {slot!r} listed twice")


def _check_finite(cfg: Config) -> None:
    """TOML accepts ``inf`` and ``nan``; no setting means anything with them."""
    for section in type(cfg).__struct_fields__:
        values = getattr(cfg, section)
        for name in type(values).__struct_fields__:
            value = getattr(values, name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"$.{section}.{name}: must be a finite number, got {value}")
