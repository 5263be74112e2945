"""Fault injection: a documented testing aid that makes failure paths observable.

Syntax (``--inject-fault``, repeatable)::

    nan:env=1,round=0,step=3        # host training loss of env 1 becomes NaN at that step
    policy_nan:round=1              # the PPO loss of that round's update becomes NaN
    data_error:round=0,step=2       # the data loader raises at that step

Faults are matched exactly; unspecified ``env`` matches env 0. They never fire unless
asked for, and parsing errors name the bad spec. A fault that could never fire (an env,
round or step outside the run, or a field its kind does not use) is a usage error, not
a silent no-op: :func:`check_faults`.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

import msgspec

from esper.config import RunConfig
from esper.errors import UserError


class FaultKind(StrEnum):
    NAN = "nan"
    POLICY_NAN = "policy_nan"
    DATA_ERROR = "data_error"


_REQUIRED_KEYS: dict[FaultKind, frozenset[str]] = {
    FaultKind.NAN: frozenset({"round", "step"}),
    FaultKind.POLICY_NAN: frozenset({"round"}),
    FaultKind.DATA_ERROR: frozenset({"round", "step"}),
}
#: The fields each kind matches on (data and policy faults hit every env at once).
_USED_KEYS: dict[FaultKind, frozenset[str]] = {
    FaultKind.NAN: frozenset({"env", "round", "step"}),
    FaultKind.POLICY_NAN: frozenset({"round"}),
    FaultKind.DATA_ERROR: frozenset({"round", "step"}),
}


class Fault(msgspec.Struct, frozen=True):
    kind: FaultKind
    round: int
    step: int = -1
    env: int = 0


class InjectedDataError(RuntimeError):
    """Raised by the data path when a ``data_error`` fault fires."""


def parse_fault(spec: str) -> Fault:
    kind_text, _, params = spec.partition(":")
    try:
        kind = FaultKind(kind_text.strip())
    except ValueError:
        valid = ", ".join(k.value for k in FaultKind)
        raise UserError(
            f"--inject-fault {spec!r}: unknown kind {kind_text!r} (valid: {valid})"
        ) from None
    values: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in params.split(","))):
        key, sep, raw = part.partition("=")
        if not sep or key not in {"env", "round", "step"}:
            raise UserError(
                f"--inject-fault {spec!r}: bad field {part!r} (use env=, round=, step=)"
            )
        try:
            values[key] = int(raw)
        except ValueError:
            raise UserError(
                f"--inject-fault {spec!r}: {key} must be an integer, got {raw!r}"
            ) from None
        if values[key] < 0:
            raise UserError(f"--inject-fault {spec!r}: {key} must be >= 0")
    missing = _REQUIRED_KEYS[kind] - values.keys()
    if missing:
        raise UserError(f"--inject-fault {spec!r}: missing {', '.join(sorted(missing))}")
    unused = values.keys() - _USED_KEYS[kind]
    if unused:
        raise UserError(
            f"--inject-fault {spec!r}: {', '.join(sorted(unused))} does not apply to "
            f"{kind.value} (it uses {', '.join(sorted(_USED_KEYS[kind]))})"
        )
    return Fault(kind=kind, **values)


def check_faults(
    faults: FaultPlan | Iterable[Fault], run: RunConfig, *, start_round: int = 0
) -> None:
    """Refuse a fault that could never fire in this run (``run`` is ``config.run``)."""
    for f in faults.faults if isinstance(faults, FaultPlan) else faults:
        spec = _spec(f)
        if f.env >= run.n_envs:
            raise UserError(
                f"--inject-fault {spec!r}: env {f.env} does not exist "
                f"(--envs {run.n_envs}: envs 0..{run.n_envs - 1})"
            )
        if not start_round <= f.round < run.rounds:
            raise UserError(
                f"--inject-fault {spec!r}: round {f.round} is not run "
                f"(rounds {start_round}..{run.rounds - 1})"
            )
        if f.step >= run.episode_length:
            raise UserError(
                f"--inject-fault {spec!r}: step {f.step} is past the episode "
                f"(--episode-length {run.episode_length}: steps 0..{run.episode_length - 1})"
            )


def _spec(f: Fault) -> str:
    fields = [f"{k}={getattr(f, k)}" for k in ("env", "round", "step") if k in _USED_KEYS[f.kind]]
    return f"{f.kind.value}:{','.join(fields)}"


class FaultPlan:
    """The set of faults for a run; lookups are O(1) and cost nothing when empty."""

    def __init__(self, faults: list[Fault] | None = None) -> None:
        self._faults = {(f.kind, f.round, f.step, f.env) for f in faults or []}
        self.faults = list(faults or [])

    def __bool__(self) -> bool:
        return bool(self._faults)

    def nan_loss(self, rnd: int, step: int, env: int) -> bool:
        return bool(self._faults) and (FaultKind.NAN, rnd, step, env) in self._faults

    def nan_envs(self, rnd: int, step: int) -> frozenset[int]:
        """The (global) envs whose loss turns NaN at this step."""
        return frozenset(
            env for kind, r, s, env in self._faults if (kind, r, s) == (FaultKind.NAN, rnd, step)
        )

    def policy_nan(self, rnd: int) -> bool:
        return bool(self._faults) and (FaultKind.POLICY_NAN, rnd, -1, 0) in self._faults

    def data_error(self, rnd: int, step: int) -> bool:
        return bool(self._faults) and (FaultKind.DATA_ERROR, rnd, step, 0) in self._faults
