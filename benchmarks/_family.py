"""The host-family benchmark (``python benchmarks/learning.py --family STAGE``).

On ``configs/learning_family.toml`` (docs/training.md, "Host families") it measures, in
stages that each write their results as they go (a stage run again skips what is done):

* ``rules``: every eager rule (each blueprint x slot, the eager grower's style, tempo
  and alpha target) and the static host over a window of rounds (default the first
  rounds of PPO's last third);
* ``ppo``: PPO trained for ``run.rounds`` rounds; its checkpoint is kept for transfer;
* ``pair``: the best fixed rule (highest mean gain over the family), each member's best
  rule (the per-host oracle) and the static host over the rest of PPO's last third;
* ``transfer``: the frozen PPO policy (``esper evaluate``: deterministic, no updates) on
  the held-out members (``configs/learning_family_holdout.toml``) against the best
  fixed rule of the training family, each held-out member's best rule and the static host;
* ``summary``: the tables, ``benchmarks/results/learning_family.json``.

Every run is ``esper train --policy ...`` or ``esper evaluate`` through the Python API:
runs with the same seed train the same hosts (and family members) in every round, so
everything is paired by (seed, round, env). Stages run one seed each with ``--seeds S``
so two seeds can run side by side as separate processes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from _common import CACHE_DIR, REPO_ROOT, RESULTS_DIR, machine_info, print_table, write_results

from esper.config import Config, load_config, with_overrides
from esper.core.constants import CNN_BLUEPRINTS
from esper.core.enums import TelemetryLevel
from esper.data.tasks import TaskData, load_task
from esper.telemetry import events as ev
from esper.telemetry.hub import MemoryHub
from esper.training.evaluate import evaluate
from esper.training.run import train

FAMILY_CONFIG = REPO_ROOT / "configs" / "learning_family.toml"
HOLDOUT_CONFIG = REPO_ROOT / "configs" / "learning_family_holdout.toml"
PARTS_DIR = RESULTS_DIR / "learning_family"
CHECKPOINTS = CACHE_DIR / "learning_family"
STATIC = "static"
SEEDS = (0, 1, 2, 3, 4)
#: Rounds of the rules table, from the start of PPO's last third.
TABLE_ROUNDS = 4
#: Rounds each frozen policy and rule plays on the held-out members.
TRANSFER_ROUNDS = 8
QUICK: dict[str, Any] = {
    "run.rounds": 3,
    "run.episode_length": 14,
    "task.train_samples_per_env": 64,
    "task.val_samples": 64,
    "policy.feature_dim": 16,
    "policy.lstm_hidden": 16,
}


def rule_name(blueprint: str, slot: str) -> str:
    return f"{blueprint}@{slot}"


def rule_overrides(name: str) -> dict[str, Any]:
    """``esper train --policy eager|static`` settings of a rule ("bp@slot" or "static")."""
    if name == STATIC:
        return {"policy.kind": "static"}
    blueprint, slot = name.split("@")
    return {
        "policy.kind": "eager",
        "policy.blueprints": [],  # PPO's menu does not bind the rules
        "policy.eager.blueprints": [blueprint],
        "policy.eager.slot_order": [slot],
    }


def all_rules(cfg: Config) -> list[str]:
    slots = cfg.host.slots
    return [rule_name(b, s) for b in CNN_BLUEPRINTS for s in slots]


def last_third(rounds: int) -> range:
    return range(rounds - max(rounds // 3, 1), rounds)


# --------------------------------------------------------------------------- running
def _episodes(hub: MemoryHub) -> list[dict[str, Any]]:
    """Per episode: host, final accuracy, reward, parameters added, what was grown."""
    grown: dict[tuple[int, int], list[list[Any]]] = {}
    out = []
    for e in hub.events:
        if isinstance(e, ev.SeedGerminated):
            grown.setdefault((e.round, e.env), []).append([e.slot, e.blueprint, e.step])
        elif isinstance(e, ev.EpisodeFinished):
            out.append(
                {
                    "round": e.round,
                    "env": e.env,
                    "host": e.host,
                    "acc": e.final_val_acc,
                    "reward": e.episode_reward,
                    "params": e.params_added,
                    "fossilized": e.seeds_fossilized,
                    "pruned": e.seeds_pruned,
                }
            )
    for row in out:
        row["grown"] = grown.get((row["round"], row["env"]), [])
    return out


def _updates(hub: MemoryHub) -> list[dict[str, float]]:
    return [
        {"round": e.round, "ev": e.explained_variance, "kl": e.approx_kl, "clip": e.clip_frac}
        for e in hub.events
        if isinstance(e, ev.PpoUpdate)
    ]


def run_rule(cfg: Config, name: str, seed: int, window: range, data: TaskData) -> dict[str, Any]:
    """One rule over rounds ``window`` of seed ``seed``."""
    run_cfg = with_overrides(
        cfg,
        {"run.seed": seed, "run.rounds": window.stop, "telemetry.level": "lifecycle",
         **rule_overrides(name)},
    )  # fmt: skip
    hub = MemoryHub(run_id=f"{name.replace('@', '.')}-s{seed}", level=TelemetryLevel.LIFECYCLE)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        train(run_cfg, telemetry=hub, data=data, save=Path(tmp) / "c.pt", first_round=window.start)
    return {"episodes": _episodes(hub), "wall_s": time.perf_counter() - t0}


def run_ppo(cfg: Config, seed: int, data: TaskData) -> dict[str, Any]:
    run_cfg = with_overrides(cfg, {"run.seed": seed, "telemetry.level": "lifecycle"})
    hub = MemoryHub(run_id=f"ppo-s{seed}", level=TelemetryLevel.LIFECYCLE)
    CHECKPOINTS.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    train(run_cfg, telemetry=hub, data=data, save=checkpoint_path(seed))
    return {
        "episodes": _episodes(hub),
        "updates": _updates(hub),
        "wall_s": time.perf_counter() - t0,
    }


def run_frozen(cfg: Config, seed: int, data: TaskData) -> dict[str, Any]:
    run_cfg = with_overrides(cfg, {"run.seed": seed, "telemetry.level": "lifecycle"})
    hub = MemoryHub(run_id=f"ppo-eval-s{seed}", level=TelemetryLevel.LIFECYCLE)
    t0 = time.perf_counter()
    evaluate(run_cfg, checkpoint_path(seed), telemetry=hub, data=data)
    return {"episodes": _episodes(hub), "wall_s": time.perf_counter() - t0}


def checkpoint_path(seed: int) -> Path:
    return CHECKPOINTS / f"ppo-s{seed}.pt"


# --------------------------------------------------------------------------- storage
def part_path(stage: str, seed: int) -> Path:
    return PARTS_DIR / f"{stage}-s{seed}.json"


def load_part(stage: str, seed: int) -> dict[str, Any]:
    path = part_path(stage, seed)
    return json.loads(path.read_text()) if path.is_file() else {"runs": {}}


def save_part(stage: str, seed: int, part: dict[str, Any]) -> None:
    part["machine"] = machine_info()
    write_results(PARTS_DIR, f"{stage}-s{seed}", part)


def _add_runs(stage: str, seed: int, names: Iterable[str], window: range, play: Any) -> None:
    """Play each name's rounds of ``window`` not stored yet; save after every run."""
    part = load_part(stage, seed)
    for name in names:
        runs = part["runs"].setdefault(name, [])
        done = {r["round"] for run in runs for r in run["episodes"]}
        todo = [r for r in window if r not in done]
        if not todo:
            continue
        result = play(name, range(min(todo), max(todo) + 1))
        result["episodes"] = [e for e in result["episodes"] if e["round"] not in done]
        runs.append(result)
        save_part(stage, seed, part)
        print(f"{stage} {name} seed {seed} rounds {todo[0]}-{todo[-1]}: "
              f"{result['wall_s']:.0f} s", flush=True)  # fmt: skip


# --------------------------------------------------------------------------- tables
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
    """Ours minus theirs, per (seed, round) mean over the round's envs: accuracy, reward."""
    out: dict[str, Any] = {}
    for key in ("acc", "reward"):
        diffs = []
        for seed, eps in ours.items():
            a, b = round_means(eps, key, rounds), round_means(theirs.get(seed, {}), key, rounds)
            diffs += [a[r] - b[r] for r in a if r in b]
        mean, se, n = mean_se(diffs)
        out[key] = {"mean": mean, "se": se, "n": n, "z": mean / se if se and se > 0 else math.nan}
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


# --------------------------------------------------------------------------- stages
def configs(quick: bool) -> tuple[Config, Config]:
    over = dict(QUICK) if quick else {}
    return with_overrides(load_config(FAMILY_CONFIG), over), with_overrides(
        load_config(HOLDOUT_CONFIG), over
    )


def table_window(cfg: Config) -> range:
    start = last_third(cfg.run.rounds).start
    return range(start, min(start + TABLE_ROUNDS, cfg.run.rounds))


def stored(stage: str) -> dict[int, dict[str, Any]]:
    """Every seed's part of a stage found on disk."""
    out = {}
    for path in sorted(PARTS_DIR.glob(f"{stage}-s*.json")):
        out[int(path.stem.rsplit("-s", 1)[1])] = json.loads(path.read_text())
    return out


def chosen_rules(cfg: Config) -> dict[str, Any]:
    """The best fixed rule and each member's best rule, from the stored rules table."""
    parts = stored("rules")
    if not parts:
        raise SystemExit("--family pair/transfer/summary: run --family rules first")
    return rules_table(parts, all_rules(cfg), table_window(cfg))


def stage(name: str, seed: int, cfg: Config, holdout: Config, data: TaskData) -> None:
    if name == "rules":
        play = lambda rule, window: run_rule(cfg, rule, seed, window, data)  # noqa: E731
        _add_runs("rules", seed, [STATIC, *all_rules(cfg)], table_window(cfg), play)
    elif name == "ppo":
        if "ppo" not in load_part("ppo", seed)["runs"] or not checkpoint_path(seed).is_file():
            part = {"runs": {"ppo": [run_ppo(cfg, seed, data)]}}
            save_part("ppo", seed, part)
    elif name == "pair":
        rt = chosen_rules(cfg)
        names = [STATIC, rt["best_fixed"], *sorted(set(rt["best_per_member"].values()))]
        play = lambda rule, window: run_rule(cfg, rule, seed, window, data)  # noqa: E731
        _add_runs("rules", seed, dict.fromkeys(names), last_third(cfg.run.rounds), play)
    elif name == "transfer":
        rt = chosen_rules(cfg)
        heavy = [rule_name("conv_heavy", s) for s in holdout.host.slots]
        names = [STATIC, rt["best_fixed"], *sorted(set(rt["best_per_member"].values())), *heavy]
        window = range(0, TRANSFER_ROUNDS if cfg.run.rounds > TRANSFER_ROUNDS else 1)
        held = with_overrides(holdout, {"run.rounds": window.stop})

        def play(rule: str, w: range) -> dict[str, Any]:
            if rule == "ppo":
                return run_frozen(held, seed, data)
            return run_rule(held, rule, seed, w, data)

        _add_runs("transfer", seed, dict.fromkeys(["ppo", *names]), window, play)
    else:
        raise SystemExit(f"--family {name}: unknown stage")


def summary(cfg: Config, out_name: str) -> dict[str, Any]:
    """Every table of the benchmark from the stored parts."""
    rules, ppo, transfer = stored("rules"), stored("ppo"), stored("transfer")
    rt = chosen_rules(cfg)
    window = table_window(cfg)
    print_rules(rt)
    result: dict[str, Any] = {"config": str(FAMILY_CONFIG.relative_to(REPO_ROOT)),
                              "table_rounds": [window.start, window.stop - 1], "rules": rt,
                              "margins": margins(rules, rt["best_per_member"], window)}  # fmt: skip
    last = last_third(cfg.run.rounds)
    if ppo:
        ours = {s: episodes_of(p, "ppo") for s, p in ppo.items()}
        vs = {
            "best_fixed": {s: episodes_of(rules[s], rt["best_fixed"]) for s in ppo if s in rules},
            "oracle": {
                s: oracle_episodes(rules[s], rt["best_per_member"]) for s in ppo if s in rules
            },
            "static": {s: episodes_of(rules[s], STATIC) for s in ppo if s in rules},
        }
        result["ppo"] = {
            "seeds": sorted(ppo),
            "last_third": [last.start, last.stop - 1],
            "minus": {k: paired_rounds(ours, v, last) for k, v in vs.items()},
            "choices_last_third": choices(
                e for eps in ours.values() for e in eps.values() if e["round"] in last
            ),
            "choices_first_third": choices(
                e
                for eps in ours.values()
                for e in eps.values()
                if e["round"] < max(cfg.run.rounds // 3, 1)
            ),
            "per_round": {
                k: [
                    statistics.fmean(
                        round_means(eps, k, range(cfg.run.rounds))[r] for eps in ours.values()
                    )
                    for r in range(cfg.run.rounds)
                ]
                for k in ("acc", "reward")
            },
            "updates_last_third": {
                k: mean_se(
                    [
                        u[k]
                        for p in ppo.values()
                        for u in p["runs"]["ppo"][0]["updates"]
                        if u["round"] in last
                    ]
                )[0]
                for k in ("ev", "kl", "clip")
            },
            "wall_minutes": sum(p["runs"]["ppo"][0]["wall_s"] for p in ppo.values()) / 60,
        }
        rows = [
            [
                k,
                v["acc"]["mean"],
                v["acc"]["se"],
                v["reward"]["mean"],
                v["reward"]["se"],
                v["acc"]["n"],
            ]
            for k, v in result["ppo"]["minus"].items()
        ]
        print_table(
            f"PPO minus, rounds {last.start}-{last.stop - 1}, paired (seed, round)",
            ["other", "acc pp", "s.e.", "reward", "s.e.", "n"],
            rows,
        )
    if transfer:
        ours = {s: episodes_of(p, "ppo") for s, p in transfer.items()}
        names = sorted({n for p in transfer.values() for n in p["runs"]} - {"ppo"})
        result["transfer"] = {
            "seeds": sorted(transfer),
            "minus": {
                n: paired_rounds(
                    ours, {s: episodes_of(p, n) for s, p in transfer.items()}, range(10**6)
                )
                for n in names
            },
            "gains": {
                n: {m: list(mean_se(v)) for m, v in gains(transfer, n, range(10**6)).items()}
                for n in ["ppo", *names]
                if n != STATIC
            },
            "choices": choices(e for eps in ours.values() for e in eps.values()),
        }
        rows = [
            [
                n,
                v["acc"]["mean"],
                v["acc"]["se"],
                v["reward"]["mean"],
                v["reward"]["se"],
                v["acc"]["n"],
            ]
            for n, v in result["transfer"]["minus"].items()
        ]
        print_table(
            "held-out members: frozen PPO minus",
            ["other", "acc pp", "s.e.", "reward", "s.e.", "n"],
            rows,
        )
    result["wall_minutes_runs"] = sum(
        run["wall_s"] for st in (rules, ppo, transfer) for p in st.values()
        for runs in p["runs"].values() for run in runs
    ) / 60  # fmt: skip
    result["machine"] = machine_info()
    write_results(RESULTS_DIR, out_name, result)
    return result


def main_family(args: argparse.Namespace) -> int:
    """``learning.py --family STAGE [--seeds S,..] [--quick]``."""
    global PARTS_DIR, CHECKPOINTS
    if args.quick:  # a smoke test: its files never mix with the real ones
        PARTS_DIR, CHECKPOINTS = (
            args.out / "learning_family_quick",
            CACHE_DIR / "learning_family_quick",
        )
    cfg, holdout = configs(args.quick)
    if args.family == "summary":
        summary(cfg, "learning_family_quick" if args.quick else (args.name or "learning_family"))
        return 0
    data = load_task(cfg.task, seed=0)
    for seed in args.seeds or ([0] if args.quick else list(SEEDS)):
        stage(args.family, seed, cfg, holdout, data)
    return 0
