"""Paired statistics of the host-family benchmark (``_family.py``) over its stored
parts: each policy's episodes by (round, env), gains over the static host per member,
the rules table, the per-member oracle, and policy-minus-policy differences paired by
(seed, round) with their standard errors and intervals over seeds, and their tables.

Apart from ``_family.py`` (which runs the stages and stores the parts) because these
are pure functions of the parts: the summary and the tests call them on stored data.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from _common import print_table
from esper_analysis.stats import mean_ci

#: The static host's name among the rules (no seed is ever grown).
STATIC = "static"


def rule_name(blueprint: str, slot: str) -> str:
    return f"{blueprint}@{slot}"


def episodes_of(part: dict[str, Any], name: str) -> dict[tuple[int, int], dict[str, Any]]:
    """(round, env) -> episode of one policy in one seed's part."""
    return {
        (e["round"], e["env"]): e for run in part["runs"].get(name, []) for e in run["episodes"]
    }


def mean_se(xs: list[float]) -> tuple[float, float, int]:
    xs = [x for x in xs if math.isfinite(x)]
    if not xs:
        return math.nan, math.nan, 0
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan
    return statistics.fmean(xs), se, len(xs)


def gains(parts: dict[int, dict[str, Any]], name: str, rounds: range) -> dict[str, list[float]]:
    """Per member: each episode's accuracy minus the static host's (same seed, round, env)."""
    out: dict[str, list[float]] = {}
    for part in parts.values():
        base, rule = episodes_of(part, STATIC), episodes_of(part, name)
        for key, e in rule.items():
            if key[0] in rounds and key in base:
                out.setdefault(e["host"], []).append(e["acc"] - base[key]["acc"])
    return out


def rules_table(
    parts: dict[int, dict[str, Any]], rules: list[str], rounds: range
) -> dict[str, Any]:
    """Gain over static per rule and member, each member's best rule, the best fixed rule."""
    table: dict[str, dict[str, list[float]]] = {}
    for name in rules:
        per = gains(parts, name, rounds)
        if per:
            table[name] = {m: list(mean_se(v)) for m, v in per.items()}
    members = sorted({m for row in table.values() for m in row})
    family = {
        name: statistics.fmean(row[m][0] for m in members) if set(row) == set(members) else math.nan
        for name, row in table.items()
    }
    family[STATIC] = 0.0
    best_fixed = max(family, key=lambda k: family[k] if math.isfinite(family[k]) else -math.inf)
    best = {m: max(table, key=lambda k: table[k].get(m, [-math.inf])[0]) for m in members}
    return {"table": table, "family_mean": family, "members": members, "best_fixed": best_fixed,
            "best_per_member": best}  # fmt: skip


def margins(
    parts: dict[int, dict[str, Any]], best: dict[str, str], rounds: range
) -> list[dict[str, Any]]:
    """For each member whose best rule differs from another member's: the gain of its best
    rule over that other rule on it, paired by episode, with its standard error."""
    out = []
    for member, rule in best.items():
        for other in sorted(set(best.values()) - {rule}):
            a, b = _paired(parts, rule, other, rounds, member)
            mean, se, n = mean_se([x - y for x, y in zip(a, b, strict=True)])
            out.append(
                {"member": member, "best": rule, "other": other, "margin": mean, "se": se, "n": n}
            )
    return out


def _paired(
    parts: dict[int, dict[str, Any]], a: str, b: str, rounds: range, member: str
) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for part in parts.values():
        ea, eb = episodes_of(part, a), episodes_of(part, b)
        for key, e in ea.items():
            if key[0] in rounds and key in eb and e["host"] == member:
                xs.append(e["acc"])
                ys.append(eb[key]["acc"])
    return xs, ys


def round_means(
    episodes: dict[tuple[int, int], dict[str, Any]], key: str, rounds: range
) -> dict[int, float]:
    by: dict[int, list[float]] = {}
    for (rnd, _), e in episodes.items():
        if rnd in rounds:
            by.setdefault(rnd, []).append(e[key])
    return {r: statistics.fmean(v) for r, v in by.items()}


def oracle_episodes(
    part: dict[str, Any], best: dict[str, str]
) -> dict[tuple[int, int], dict[str, Any]]:
    """The per-host oracle: on each env, the episode of its member's best rule."""
    out = {}
    per_rule = {name: episodes_of(part, name) for name in set(best.values())}
    anchor = per_rule[next(iter(best.values()))]
    for key, e in anchor.items():
        rule = best.get(e["host"])
        if rule is not None and key in per_rule[rule]:
            out[key] = per_rule[rule][key]
    return out


def paired_rounds(
    ours: dict[int, dict[tuple[int, int], dict[str, Any]]],
    theirs: dict[int, dict[tuple[int, int], dict[str, Any]]],
    rounds: range,
) -> dict[str, Any]:
    """Ours minus theirs, per (seed, round) mean over the round's envs: accuracy, reward;
    its s.e. over (seed, round) pairs, and ``seeds``: each seed's mean difference with a
    95 % t interval over seeds (the rounds of one run are not independent samples)."""
    out: dict[str, Any] = {}
    for key in ("acc", "reward"):
        diffs, per_seed = [], []
        for seed, eps in ours.items():
            a, b = round_means(eps, key, rounds), round_means(theirs.get(seed, {}), key, rounds)
            mine = [a[r] - b[r] for r in a if r in b]
            diffs += mine
            per_seed += [statistics.fmean(mine)] if mine else []
        mean, se, n = mean_se(diffs)
        est = mean_ci(per_seed)
        seeds = {"mean": est.mean, "low": est.low, "high": est.high, "n": est.n}
        z = mean / se if se and se > 0 else math.nan
        out[key] = {"mean": mean, "se": se, "n": n, "z": z, "seeds": seeds}
    return out


def choices(eps: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per member: share of episodes growing each "bp@slot" first (or nothing)."""
    count: dict[str, dict[str, int]] = {}
    for e in eps:
        first = rule_name(e["grown"][0][1], e["grown"][0][0]) if e["grown"] else "none"
        row = count.setdefault(e["host"], {})
        row[first] = row.get(first, 0) + 1
    return {
        m: {k: v / sum(row.values()) for k, v in sorted(row.items(), key=lambda kv: -kv[1])}
        for m, row in sorted(count.items())
    }


def print_rules(rt: dict[str, Any]) -> None:
    members = rt["members"]
    rows = []
    for name, row in sorted(rt["table"].items(), key=lambda kv: -rt["family_mean"][kv[0]]):
        rows.append(
            [name, rt["family_mean"][name]]
            + [f"{row[m][0]:+.2f} ({row[m][1]:.2f})" for m in members]
        )
    print_table(
        "accuracy gain over the static host, pp (s.e.)", ["rule", "family mean", *members], rows
    )


def gains_vs(
    ours: dict[int, dict[tuple[int, int], dict[str, Any]]],
    base: dict[int, dict[tuple[int, int], dict[str, Any]]],
    rounds: range,
) -> dict[str, list[float]]:
    """Per member: our episode's accuracy minus the static host's."""
    out: dict[str, list[float]] = {}
    for seed, eps in ours.items():
        for key, e in eps.items():
            if key[0] in rounds and key in base.get(seed, {}):
                out.setdefault(e["host"], []).append(e["acc"] - base[seed][key]["acc"])
    return out


def ci(stat: dict[str, Any]) -> str:
    """The 95 % interval over seeds, as printed."""
    seeds = stat["seeds"]
    return f"[{seeds['low']:+.2f}, {seeds['high']:+.2f}]"


def print_minus(title: str, minus: dict[str, Any]) -> None:
    rows = [
        [k, v["acc"]["mean"], v["acc"]["se"], ci(v["acc"]), v["reward"]["mean"],
         v["reward"]["se"], ci(v["reward"]), v["acc"]["seeds"]["n"], v["acc"]["n"]]
        for k, v in minus.items()
    ]  # fmt: skip
    print_table(
        title,
        ["other", "acc pp", "s.e.", "95% CI (seeds)", "reward", "s.e.", "95% CI", "seeds", "n"],
        rows,
    )
