"""Fault injection: a documented testing aid that makes failure paths observable.

Syntax (``--inject-fault``, repeatable)::

    nan:env=1,round=0,step=3        # host training loss of env 1 becomes NaN at that step
    policy_nan:round=1              # the PPO loss of that round's update becomes NaN
    data_error:round=0,step=2       # the data loader raises at that step

Faults are matched exactly; unspecified ``env`` matches env 0. They never fire unless
asked for, and parsing errors name the bad spec.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

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
    return Fault(kind=kind, **values)


class FaultPlan:
    """The set of faults for a run; lookups are O(1) and cost nothing when empty."""

    def __init__(self, faults: list[Fault] | None = None) -> None:
        self._faults = {(f.kind, f.round, f.step, f.env) for f in faults or []}
        self.faults = list(faults or [])

    def __bool__(self) -> bool:
        return bool(self._faults)

    def nan_loss(self, rnd: int, step: int, env: int) -> bool:
        return bool(self._faults) and (FaultKind.NAN, rnd, step, env) in self._faults

    def policy_nan(self, rnd: int) -> bool:
        return bool(self._faults) and (FaultKind.POLICY_NAN, rnd, -1, 0) in self._faults

    def data_error(self, rnd: int, step: int) -> bool:
        return bool(self._faults) and (FaultKind.DATA_ERROR, rnd, step, 0) in self._faults
