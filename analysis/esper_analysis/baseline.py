"""Event-count baselines: capture a run's counts, check another run against them.

With a fixed seed on CPU a run is deterministic, so counts must match exactly: the
total per type, and the per-round and per-env breakdowns (an extra event in round 3 is
drift even if one went missing in round 4). Types whose counts are stochastic by
nature get a declared rule instead (:data:`DEFAULT_RULES`); only their totals are
compared. The baseline file records the rules it was captured with, so a hand-tuned
baseline keeps its tolerances; types it does not list fall back to the defaults.

Drift of the configuration fingerprint (config hash, seed, sizes) is drift too: counts
from another configuration are not comparable.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, ClassVar, Final, Literal

import polars as pl

import esper
from esper.telemetry.events import SCHEMA_VERSION
from esper_analysis.counts import Counts, event_counts
from esper_analysis.errors import BaselineError
from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult

BASELINE_FORMAT: Final = "esper-event-baseline"
BASELINE_VERSION: Final = 1
RuleKind = Literal["exact", "tolerance", "presence"]


@dataclasses.dataclass(frozen=True)
class Rule:
    """How one event type's count is compared.

    ``exact``: total, per round and per env must be equal. ``tolerance``: the total may
    differ by ``max(abs_tol, rel_tol * expected)``. ``presence``: only whether the type
    occurs at all must match.
    """

    kind: RuleKind
    rel_tol: float = 0.0
    abs_tol: int = 0
    why: str = "deterministic with a fixed seed on CPU"

    def describe(self) -> str:
        if self.kind == "tolerance":
            return f"tolerance (±max({self.abs_tol}, {self.rel_tol:g}×expected))"
        return self.kind

    def allows(self, expected: int, got: int) -> bool:
        if self.kind == "presence":
            return (expected > 0) == (got > 0)
        if self.kind == "tolerance":
            return abs(got - expected) <= max(self.abs_tol, self.rel_tol * expected)
        return got == expected


EXACT: Final = Rule("exact")
#: Event types whose counts depend on timing or on escalation windows, not on the seed.
DEFAULT_RULES: Final[dict[str, Rule]] = {
    "writer_stats": Rule("presence", why="emitted per writer flush/close: timing-driven"),
    "anomaly_detected": Rule(
        "tolerance", rel_tol=0.5, abs_tol=2, why="thresholds on timing-sensitive signals"
    ),
    "telemetry_level_changed": Rule(
        "tolerance", rel_tol=0.5, abs_tol=2, why="follows anomaly escalations"
    ),
    "layer_grad_stats": Rule(
        "tolerance", rel_tol=0.5, abs_tol=0, why="volume follows debug escalation windows"
    ),
}
#: run_started fields that make up the configuration fingerprint.
FINGERPRINT_FIELDS: Final = (
    "config_hash",
    "seed",
    "task",
    "policy_kind",
    "n_envs",
    "episode_length",
    "rounds",
    "telemetry_level",
    "deterministic",
)


def rule_for(event_type: str, rules: dict[str, Rule] | None = None) -> Rule:
    if rules and event_type in rules:
        return rules[event_type]
    return DEFAULT_RULES.get(event_type, EXACT)


def fingerprint(run: Run) -> dict[str, Any]:
    """Configuration fingerprint: run_started fields (manifest config hash as fallback)."""
    fp: dict[str, Any] = {"config_hash": run.config_hash or None}
    fp["world_size"] = run.manifest.world_size if run.manifest else 1  # processes (ranks)
    if run.rows_on_disk("run_started"):
        row = run.scan("run_started").select(FINGERPRINT_FIELDS).collect().row(0, named=True)
        fp.update({k: v for k, v in row.items() if v is not None and v != ""})
    return fp


def capture_baseline(run: Run, counts: Counts | None = None) -> dict[str, Any]:
    """The JSON-ready baseline of a run."""
    counts = counts or event_counts(run)
    totals = dict(zip(counts.by_type["type"], counts.by_type["events"], strict=True))
    return {
        "format": BASELINE_FORMAT,
        "version": BASELINE_VERSION,
        "schema_version": SCHEMA_VERSION,
        "esper_version": esper.__version__,
        "run_id": run.run_id,
        "status": run.status.value,
        "fingerprint": fingerprint(run),
        "counts": {t: int(n) for t, n in totals.items()},
        **counts.nested,
        "rules": {t: dataclasses.asdict(r) for t, r in sorted(DEFAULT_RULES.items())},
    }


def write_baseline(run: Run, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Capture and write a baseline atomically (tmp file + rename)."""
    data = capture_baseline(run)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return data


def read_baseline(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and validate a baseline file; raises :class:`BaselineError` (exit 2)."""
    source = Path(path)
    if not source.is_file():
        raise BaselineError(f"baseline file {source} does not exist")
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BaselineError(f"cannot read baseline {source}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != BASELINE_FORMAT:
        raise BaselineError(f"{source} is not an esper event baseline")
    if int(data.get("version", 0)) > BASELINE_VERSION:
        raise BaselineError(
            f"baseline {source} has format version {data.get('version')}, newer than "
            f"{BASELINE_VERSION}; upgrade esper"
        )
    if not isinstance(data.get("counts"), dict):
        raise BaselineError(f"baseline {source} has no counts")
    return data


def _rules_of(baseline: dict[str, Any]) -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    for event_type, spec in (baseline.get("rules") or {}).items():
        try:
            rules[event_type] = Rule(**spec)
        except TypeError as exc:
            raise BaselineError(f"baseline rule for {event_type!r} is malformed: {exc}") from None
    return rules


@dataclasses.dataclass(frozen=True)
class BaselineCheck(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "types": "Event counts against the baseline",
        "drift": "Drift (every mismatch, with the rule applied)",
    }

    types: pl.DataFrame
    drift: pl.DataFrame
    ok: bool
    drifted_types: list[str]
    fingerprint_drift: list[str]
    #: Ranks (processes) whose counts differ from the baseline's for that rank.
    drifted_ranks: list[int]
    run_id: str
    baseline_run_id: str

    def message(self) -> str:
        """One line for people: what matched or what drifted."""
        if self.ok:
            return f"run {self.run_id} matches baseline of {self.baseline_run_id}"
        parts = []
        if self.fingerprint_drift:
            parts.append(f"config fingerprint ({', '.join(self.fingerprint_drift)})")
        parts.extend(self.drifted_types)
        if self.drifted_ranks:
            parts.append(f"on rank(s) {', '.join(map(str, self.drifted_ranks))}")
        return f"run {self.run_id} drifted from baseline: {', '.join(parts)}"


_DRIFT_SCHEMA: Final = pl.Schema(
    {
        "type": pl.String,
        "dimension": pl.String,
        "key": pl.String,
        "expected": pl.String,
        "got": pl.String,
        "rule": pl.String,
    }
)
_TYPES_SCHEMA: Final = pl.Schema(
    {
        "type": pl.String,
        "expected": pl.Int64,
        "got": pl.Int64,
        "delta": pl.Int64,
        "rule": pl.String,
        "why": pl.String,
        "status": pl.String,
    }
)


#: Per-dimension count tables a baseline compares for exact types.
_BREAKDOWNS: Final = ("by_round", "by_env", "by_rank")


def _breakdown_drift(
    event_type: str, dim: str, expected: dict[str, int], got: dict[str, int], rule: str
) -> list[dict[str, str]]:
    if expected == got:  # the usual case, decided in C without listing the keys
        return []
    keys = sorted(set(expected) | set(got), key=lambda k: (len(k), k))
    return [
        {
            "type": event_type,
            "dimension": dim,
            "key": key,
            "expected": str(expected.get(key, 0)),
            "got": str(got.get(key, 0)),
            "rule": rule,
        }
        for key in keys
        if expected.get(key, 0) != got.get(key, 0)
    ]


def _fingerprint_drift(expected: dict[str, Any], got: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for key in sorted(set(expected) | set(got)):
        if expected.get(key) is not None and expected.get(key) != got.get(key):
            rows.append(
                {
                    "type": "(config)",
                    "dimension": "fingerprint",
                    "key": key,
                    "expected": str(expected.get(key)),
                    "got": str(got.get(key)),
                    "rule": "exact",
                }
            )
    return rows


def check_baseline(
    run: Run, baseline: dict[str, Any], counts: Counts | None = None
) -> BaselineCheck:
    """Compare a run with a baseline; ``ok`` is False on any drift.

    Pass the run's ``counts`` when they are already computed (the report does), so the
    event tables are not scanned twice.
    """
    rules = _rules_of(baseline)
    current = capture_baseline(run, counts)
    drift = _fingerprint_drift(baseline.get("fingerprint") or {}, current["fingerprint"])
    fingerprint_keys = [row["key"] for row in drift]
    type_rows = []
    drifted: list[str] = []
    exp_counts: dict[str, int] = baseline["counts"]
    order = list(exp_counts) + [t for t in current["counts"] if t not in exp_counts]
    for event_type in order:
        rule = rule_for(event_type, rules)
        exp, got = int(exp_counts.get(event_type, 0)), int(current["counts"].get(event_type, 0))
        rows = []
        if not rule.allows(exp, got):
            rows.append(
                {
                    "type": event_type,
                    "dimension": "total",
                    "key": "",
                    "expected": str(exp),
                    "got": str(got),
                    "rule": rule.describe(),
                }
            )
        if rule.kind == "exact":
            # by_rank: which process of a multi-rank run drifted (absent from baselines
            # captured before ranks were recorded: not compared there).
            for dim in [d for d in _BREAKDOWNS if d in baseline or d != "by_rank"]:
                expected = (baseline.get(dim) or {}).get(event_type, {})
                got_dim = current[dim].get(event_type, {})
                if dim == "by_rank" and set(expected) | set(got_dim) <= {"0"}:
                    continue  # one process: the total says it all
                rows += _breakdown_drift(
                    event_type, dim.removeprefix("by_"), expected, got_dim, rule.describe()
                )
        if rows:
            drifted.append(event_type)
        drift += rows
        type_rows.append(
            {
                "type": event_type,
                "expected": exp,
                "got": got,
                "delta": got - exp,
                "rule": rule.describe(),
                "why": rule.why,
                "status": "drift" if rows else "ok",
            }
        )
    return BaselineCheck(
        types=pl.DataFrame(type_rows, schema=_TYPES_SCHEMA),
        drift=pl.DataFrame(drift, schema=_DRIFT_SCHEMA),
        ok=not drift,
        drifted_types=drifted,
        fingerprint_drift=fingerprint_keys,
        drifted_ranks=sorted({int(r["key"]) for r in drift if r["dimension"] == "rank"}),
        run_id=run.run_id,
        baseline_run_id=str(baseline.get("run_id", "")),
    )
