"""``esper train``: PPO training with telemetry. Torch is imported only inside ``run``."""

from __future__ import annotations

import argparse
import os
from typing import Any, Final

import msgspec

from esper.config import Config, RunConfig, load_config, parse_assignment, with_overrides
from esper.core.enums import AmpMode, PolicyKind, TelemetryLevel
from esper.errors import ConfigError, UserError

HELP = "train the seed policy with vectorized PPO (telemetry to Parquet)"
#: Built-in defaults shown in ``--help``; a ``--config`` file replaces them, flags override both.
_D: Final = Config()


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{parser.description or HELP}. Defaults shown are the built-in config's; "
        "a --config file replaces them and flags override both."
    )
    _add_workload_flags(parser)
    _add_execution_flags(parser)


def _add_workload_flags(parser: argparse.ArgumentParser) -> None:
    """What runs: config, policy, task, sizes, seed, telemetry."""
    parser.add_argument(
        "--config", metavar="FILE", help="TOML or JSON config, strict (default: none, built-ins)"
    )
    parser.add_argument(
        "--policy",
        metavar="KIND",
        help="who decides: ppo (learns) or a baseline through the same loop and telemetry: "
        "heuristic (rules, grows on a plateau), eager (the heuristic's rules, grows whenever "
        "a slot is free; [policy.eager] keys), random (uniform over valid actions), static "
        f"(always waits) (default: {_D.policy.kind.value}, or the --config file's policy.kind)",
    )
    parser.add_argument(
        "--task",
        metavar="NAME",
        help=f"digits | cifar10 | synthetic | text (default: {_D.task.name.value})",
    )
    parser.add_argument(
        "--data-path",
        metavar="PATH",
        help="local dataset directory (cifar10) or text file (text) (default: none)",
    )
    parser.add_argument(
        "--envs",
        type=int,
        metavar="N",
        help=f"parallel envs, one host network each (default: {_D.run.n_envs})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        metavar="R",
        help=f"rounds of one episode per env, PPO updates once per round "
        f"(default: {_D.run.rounds})",
    )
    parser.add_argument(
        "--episode-length",
        type=int,
        metavar="T",
        help=f"steps (host epochs) per episode (default: {_D.run.episode_length})",
    )
    parser.add_argument(
        "--seed",
        type=int,
        metavar="S",
        help=f"run seed: hosts, data order, policy (default: {_D.run.seed})",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help=f"per-env batch size (default: {_D.task.batch_size})",
    )
    parser.add_argument(
        "--telemetry-dir",
        metavar="DIR",
        help=f"parent of the run directory <DIR>/<run id> (default: {_D.telemetry.dir})",
    )
    parser.add_argument(
        "--run-id",
        metavar="ID",
        help="run directory name, [A-Za-z0-9._-] (default: <task>-<policy>-s<seed>-<time>)",
    )
    parser.add_argument(
        "--telemetry-level",
        choices=[lv.name.lower() for lv in TelemetryLevel],
        help=f"events written: {' < '.join(lv.name.lower() for lv in TelemetryLevel)} "
        f"(default: {_D.telemetry.level})",
    )
    add_set_flag(parser)


def add_set_flag(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` (repeatable): any config key, typed and checked like the TOML."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="set",
        help="set any config key (docs/config.md), repeatable, after --config and before "
        "the flags above: VALUE is a TOML value (1e-3, true, [8, 16], { prune = -3.0 }), "
        "a bare word a string, none clears an optional key; e.g. --set ppo.lr=1e-3 "
        "(default: none)",
    )


def _add_execution_flags(parser: argparse.ArgumentParser) -> None:
    """Where and how it runs: devices, precision, batching, checkpoints, faults, output."""
    parser.add_argument("--device", help=f"cpu | cuda | cuda:K (default: {_D.run.device})")
    parser.add_argument(
        "--env-devices",
        nargs="+",
        metavar="DEV",
        help="env devices, round-robin (default: all on --device)",
    )
    parser.add_argument(
        "--amp",
        choices=["off", "fp16", "bf16"],
        help=f"mixed precision, CUDA only (default: {_D.run.amp.value})",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help="torch.compile the policy (default: off)",
    )
    parser.add_argument(
        "--batch-envs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="train the envs' hosts as one batched graph, seeds grouped per slot (default: "
        "on for float32 CUDA runs without a host family, off on a CPU)",
    )
    parser.add_argument(
        "--save", metavar="PATH", help="checkpoint path (default: <run dir>/checkpoint.pt)"
    )
    parser.add_argument(
        "--resume", metavar="PATH", help="resume from a checkpoint (default: none, fresh start)"
    )
    parser.add_argument(
        "--continue-run",
        action="store_true",
        help="with --resume: continue the same run id and sequence (default: new linked run)",
    )
    parser.add_argument(
        "--inject-fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="testing aid, repeatable: nan:env=E,round=R,step=S | policy_nan:round=R | "
        "data_error:round=R,step=S (default: none)",
    )
    parser.add_argument(
        "--report",
        nargs="?",
        const="",
        metavar="PATH",
        help="after the run, write the analysis HTML report, same as `esper analyze report` "
        "(default: no report; PATH defaults to <run dir>/report.html)",
    )
    parser.add_argument(
        "--dist-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="multi-process runs (torchrun): seconds a rank waits for the others in a "
        "collective before the run fails; a dead rank ends all ranks (default: 300)",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (default: a bar when stderr is a terminal)",
    )


_OVERRIDES = {
    "policy": "policy.kind",
    "task": "task.name",
    "data_path": "task.data_path",
    "envs": "run.n_envs",
    "rounds": "run.rounds",
    "episode_length": "run.episode_length",
    "seed": "run.seed",
    "batch_size": "task.batch_size",
    "telemetry_dir": "telemetry.dir",
    "run_id": "run.run_id",
    "telemetry_level": "telemetry.level",
    "device": "run.device",
    "env_devices": "run.env_devices",
    "amp": "run.amp",
    "compile": "policy.compile",
    "batch_envs": "run.batch_envs",
}


def build_config(
    args: argparse.Namespace, kind: PolicyKind | None = None, base: Config | None = None
) -> Config:
    """Flags over ``--config`` (or over ``base``: a resumed checkpoint's own config).

    ``kind`` is the policy a command fixes (``esper heuristic``); otherwise ``--policy``
    or the config's ``policy.kind`` decides.
    """
    cfg = base or (load_config(args.config) if args.config else Config())
    overrides: dict[str, Any] = {"policy.kind": kind.value} if kind is not None else {}
    flags: dict[str, str] = {}  # config key -> the flag that set it, for errors
    for text in getattr(args, "set", None) or []:
        key, value = parse_assignment(text)
        overrides[key] = value
        flags[key] = f"--set {text}"
    for attr, path in _OVERRIDES.items():
        value = getattr(args, attr, None)
        if value is None:
            continue
        flag = "--" + attr.replace("_", "-")
        if path in flags:
            raise ConfigError(f"{flags[path]} and {flag} both set {path}: give one")
        overrides[path] = value
        flags[path] = flag
    try:
        return with_overrides(cfg, overrides)
    except ConfigError as exc:
        raise ConfigError(_name_flag(str(exc), flags)) from None


def _name_flag(message: str, flags: dict[str, str]) -> str:
    """Point at the command-line flag when the bad value came from one."""
    for path, flag in flags.items():
        if f"$.{path}`" in message or f"$.{path}:" in message or message.endswith(f"$.{path}"):
            return f"{flag}: {message.removeprefix('overrides: ')}"
    return message


def run(args: argparse.Namespace) -> int:
    return run_with_kind(args)


def run_with_kind(args: argparse.Namespace, kind: PolicyKind | None = None) -> int:
    """Train with the policy ``kind`` fixes, else the one ``--policy``/the config names."""
    if kind is not None and getattr(args, "policy", None) not in (None, kind.value):
        raise UserError(
            f"--policy {args.policy}: this command runs the {kind.value} policy; "
            f"use esper train --policy {args.policy}"
        )
    if args.continue_run and not args.resume:
        raise UserError("--continue-run needs --resume PATH (the checkpoint to continue from)")
    if args.continue_run and not os.path.exists(args.resume):
        raise UserError(
            f"checkpoint not found: {args.resume}; a run stopped before its first checkpoint "
            "completed no round: run the same command without --resume and --continue-run "
            "(the same --run-id) to restart it"
        )
    base = None
    if args.resume and not args.config:  # the checkpoint's own config; flags override it
        from esper.training.loop.checkpoint import checkpoint_config  # imports torch

        base = checkpoint_config(args.resume)
    cfg = build_config(args, kind, base)
    _check_cheap_inputs(cfg, args)
    from esper.commands.train_ui import run_training  # imports torch

    return run_training(cfg, args)


def _check_cheap_inputs(cfg: Config, args: argparse.Namespace) -> None:
    """Fail on a bad run id or fault spec before paying for the torch import."""
    from esper.telemetry.paths import validate_run_id
    from esper.training.loop.faults import check_faults, parse_fault

    if cfg.run.run_id:
        validate_run_id(cfg.run.run_id)
    if cfg.run.amp != AmpMode.OFF and not _any_cuda(cfg):
        raise UserError(
            f"--amp {cfg.run.amp.value}: mixed precision needs a CUDA device, "
            f"but the run is on {cfg.run.device} (use --amp off, or --device cuda)"
        )
    if not getattr(args, "dist_timeout", 1.0) > 0:
        raise UserError(f"--dist-timeout must be > 0 seconds, got {args.dist_timeout}")
    faults = [parse_fault(spec) for spec in args.inject_fault]
    check_faults(faults, _global_run(cfg))  # a resume re-checks against its first round


def _global_run(cfg: Config) -> RunConfig:
    """Under torchrun (``WORLD_SIZE`` ranks) fault specs name global envs."""
    raw = os.environ.get("WORLD_SIZE", "1")
    world = int(raw) if raw.isdigit() else 1  # a bad value is reported when ranks join
    if world <= 1:
        return cfg.run
    return msgspec.structs.replace(cfg.run, n_envs=cfg.run.n_envs * world)


def _any_cuda(cfg: Config) -> bool:
    return any(d.startswith("cuda") for d in [cfg.run.device, *cfg.run.env_devices])
