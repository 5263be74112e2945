"""The host-family benchmark (``python benchmarks/learning.py --family STAGE``).

On ``configs/learning_family.toml`` (docs/training.md, "Host families") it measures, in
stages that each write their results as they go (a stage run again skips what is done):

* ``rules``: every eager rule (each blueprint x slot, the eager grower's style, tempo
  and alpha target) and the static host over a window of rounds (default the first
  rounds of PPO's last third);
* ``ppo``: PPO trained for ``run.rounds`` rounds; its checkpoint is kept for transfer;
  its final policy frozen, greedy and sampled, on the table's rounds;
* ``pair``: the best fixed rule (highest mean gain over the family), each member's best
  rule (the per-host oracle) and the static host over the rest of PPO's last third;
* ``transfer``: the frozen PPO policy (``esper evaluate``: deterministic, no updates;
  ``--variant NAME``: that variant's) on the held-out members
  (``configs/learning_family_holdout.toml``) against the best fixed rule of the
  training family, each held-out member's best rule and the static host;
* ``descriptors``: which host descriptors the final policy uses (``_descriptors.py``);
* ``summary``: the tables, ``benchmarks/results/learning_family.json``.

Every run is ``esper train --policy ...`` or ``esper evaluate`` through the Python API:
runs with the same seed train the same hosts (and family members) in every round, so
everything is paired by (seed, round, env). Stages run one seed each with ``--seeds S``
so two seeds can run side by side as separate processes.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import _descriptors
from _common import CACHE_DIR, REPO_ROOT, RESULTS_DIR, machine_info, print_table, write_results
from _family_stats import (
    STATIC,
    choices,
    episodes_of,
    gains,
    gains_vs,
    margins,
    mean_se,
    oracle_episodes,
    paired_rounds,
    print_minus,
    print_rules,
    round_means,
    rule_name,
    rules_table,
)

from esper.config import Config, load_config, with_overrides
from esper.core.constants import CNN_BLUEPRINTS
from esper.core.enums import TelemetryLevel
from esper.data.tasks import TaskData, load_task
from esper.telemetry import events as ev
from esper.telemetry.memory_hub import MemoryHub
from esper.training.loop.evaluate import evaluate
from esper.training.run import train

FAMILY_CONFIG = REPO_ROOT / "configs" / "learning_family.toml"
HOLDOUT_CONFIG = REPO_ROOT / "configs" / "learning_family_holdout.toml"
PARTS_DIR = RESULTS_DIR / "learning_family"
CHECKPOINTS = CACHE_DIR / "learning_family"
#: The final policy frozen on the table's rounds: greedy, and sampled (``--sample``).
FROZEN, FROZEN_SAMPLE = "frozen", "frozen_sample"
#: A variant's sampled frozen policy in the transfer stage: ``<variant><SAMPLED>``.
SAMPLED = ":sample"
SEEDS = (0, 1, 2, 3, 4)
#: Rounds of the rules table, from the start of PPO's last third.
TABLE_ROUNDS = 4
#: Rounds each frozen policy and rule plays on the held-out members.
TRANSFER_ROUNDS = 4
QUICK: dict[str, Any] = {
    "run.rounds": 3,
    "run.episode_length": 14,
    "task.train_samples_per_env": 64,
    "task.val_samples": 64,
    "policy.feature_dim": 16,
    "policy.lstm_hidden": 16,
}


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


#: The blueprints of the rules table (the quick smoke test: one).
TABLE_BLUEPRINTS: tuple[str, ...] = CNN_BLUEPRINTS


def all_rules(cfg: Config) -> list[str]:
    return [rule_name(b, s) for b in TABLE_BLUEPRINTS for s in cfg.host.slots]


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


def run_ppo(cfg: Config, seed: int, data: TaskData, variant: str) -> dict[str, Any]:
    run_cfg = with_overrides(cfg, {"run.seed": seed, "telemetry.level": "lifecycle"})
    hub = MemoryHub(run_id=f"{variant}-s{seed}", level=TelemetryLevel.LIFECYCLE)
    CHECKPOINTS.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    train(run_cfg, telemetry=hub, data=data, save=checkpoint_path(seed, variant))
    wall = time.perf_counter() - t0
    return {"episodes": _episodes(hub), "updates": _updates(hub), "wall_s": wall}


def run_frozen(
    cfg: Config, seed: int, data: TaskData, variant: str, window: range, sample: bool = False
) -> dict[str, Any]:
    """The trained policy, frozen, on rounds ``window`` of ``cfg``'s hosts (``sample``:
    ``esper evaluate --sample``, actions drawn as in training)."""
    run_cfg = with_overrides(
        cfg, {"run.seed": seed, "run.rounds": window.stop, "telemetry.level": "lifecycle"}
    )
    hub = MemoryHub(run_id=f"{variant}-eval-s{seed}", level=TelemetryLevel.LIFECYCLE)
    t0 = time.perf_counter()
    path = checkpoint_path(seed, variant)
    evaluate(run_cfg, path, telemetry=hub, data=data, first_round=window.start, sample=sample)
    return {"episodes": _episodes(hub), "wall_s": time.perf_counter() - t0}


def checkpoint_path(seed: int, variant: str = "ppo") -> Path:
    return CHECKPOINTS / f"{variant}-s{seed}.pt"


# --------------------------------------------------------------------------- storage
def part_path(stage: str, seed: int) -> Path:
    return PARTS_DIR / f"{stage}-s{seed}.json"


def load_part(stage: str, seed: int) -> dict[str, Any]:
    path = part_path(stage, seed)
    return json.loads(path.read_text()) if path.is_file() else {"runs": {}}


def save_part(stage: str, seed: int, part: dict[str, Any]) -> None:
    """Atomically, compact (a part holds every episode of its runs)."""
    part["machine"] = machine_info()
    write_results(PARTS_DIR, f"{stage}-s{seed}", part, compact=True)


@contextlib.contextmanager
def _part_lock(stage: str, seed: int) -> Iterator[None]:
    """An exclusive lock on one part file's read-modify-write: the stages of two
    variants run at once share ``transfer-s<seed>.json`` (each adds its own runs)."""
    PARTS_DIR.mkdir(parents=True, exist_ok=True)
    with open(PARTS_DIR / f".{stage}-s{seed}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
        with _part_lock(stage, seed):  # another process may have added its runs meanwhile
            stored_part = load_part(stage, seed)
            stored_part["runs"][name] = runs
            save_part(stage, seed, stored_part)
        print(f"{stage} {name} seed {seed} rounds {todo[0]}-{todo[-1]}: "
              f"{result['wall_s']:.0f} s", flush=True)  # fmt: skip


# --------------------------------------------------------------------------- tables
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
    """Every seed's part of a stage found on disk (``<stage>-s<seed>.json`` exactly: the
    parts of variant ``ent0.01-sparse`` are not those of ``ent0.01``)."""
    out = {}
    for path in sorted(PARTS_DIR.glob(f"{stage}-s*.json")):
        name, seed = path.stem.rsplit("-s", 1)
        if name == stage and seed.isdigit():
            out[int(seed)] = json.loads(path.read_text())
    return out


def chosen_rules(cfg: Config) -> dict[str, Any]:
    """The best fixed rule and each member's best rule, from the stored rules table."""
    window, rules = table_window(cfg), all_rules(cfg)
    parts = {
        seed: part
        for seed, part in stored("rules").items()
        if all(set(window) <= {k[0] for k in episodes_of(part, n)} for n in [STATIC, *rules])
    }  # the seeds with the whole table: every rule compared on the same episodes
    if not parts:
        raise SystemExit("--family pair/transfer/summary: run --family rules first")
    table = rules_table(parts, rules, window)
    table["seeds"] = sorted(parts)
    return table


def frozen_config(base: Config, overrides: dict[str, Any]) -> Config:
    """Where a variant's final policy is evaluated: the base family's envs, rounds and
    reward (those of the stored rules table, so every variant pairs with the same rule
    episodes), with the variant's own ``policy.*`` settings (masks and menus act there)."""
    return with_overrides(base, {k: v for k, v in overrides.items() if k.startswith("policy.")})


def stage(
    name: str,
    seed: int,
    cfg: Config,
    holdout: Config,
    data: TaskData,
    variant: str = "ppo",
    frozen: Config | None = None,
) -> None:
    """One stage for one seed; ``frozen``: where the final policy is evaluated (default
    ``cfg``)."""
    frozen = frozen or cfg
    if name == "rules":
        play = lambda rule, window: run_rule(cfg, rule, seed, window, data)  # noqa: E731
        _add_runs("rules", seed, [STATIC, *all_rules(cfg)], table_window(cfg), play)
    elif name == "ppo":  # train; then the final policy, frozen, on the table's rounds
        part = load_part(variant, seed)
        if "ppo" not in part["runs"] or not checkpoint_path(seed, variant).is_file():
            part = {"runs": {"ppo": [run_ppo(cfg, seed, data, variant)]}, "variant": variant}
            save_part(variant, seed, part)
        for key, sample in ((FROZEN, False), (FROZEN_SAMPLE, True)):
            if key not in part["runs"]:
                window = table_window(frozen)
                part["runs"][key] = [run_frozen(frozen, seed, data, variant, window, sample)]
                save_part(variant, seed, part)
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
        policy_settings = load_part(variant, seed).get("overrides", {})
        held = frozen_config(with_overrides(holdout, {"run.rounds": window.stop}), policy_settings)

        def play(rule: str, w: range) -> dict[str, Any]:
            if rule in (variant, variant + SAMPLED):  # a PPO variant's final policy, frozen
                return run_frozen(held, seed, data, variant, w, sample=rule != variant)
            return run_rule(held, rule, seed, w, data)

        policies = [variant, variant + SAMPLED]
        _add_runs("transfer", seed, dict.fromkeys([*policies, *names]), window, play)
    elif name == "descriptors":
        path = checkpoint_path(seed, variant)
        if not path.is_file():
            raise SystemExit(f"--family descriptors: no checkpoint {path} (run --family ppo)")
        probe = _descriptors.probe_seed(frozen, path, data, table_window(frozen))
        part = {"seed": seed, "variant": variant, "probe": probe, "machine": machine_info()}
        write_results(PARTS_DIR, _descriptors.part_name(variant, seed), part)
    else:
        raise SystemExit(f"--family {name}: unknown stage")


def _ppo_block(
    part_by_seed: dict[int, dict[str, Any]],
    rules: dict[int, dict[str, Any]],
    rt: dict[str, Any],
    cfg: Config,
    window: range,
) -> dict[str, Any]:
    """One PPO variant (``cfg``: its own settings): its training's last third and its
    final policy frozen on the table's rounds ``window``, each minus the best fixed rule,
    the per-host oracle and static (training rounds without rule episodes pair with none)."""
    last = last_third(cfg.run.rounds)
    seeds = sorted(s for s in part_by_seed if s in rules)
    others = {
        "best_fixed": {s: episodes_of(rules[s], rt["best_fixed"]) for s in seeds},
        "oracle": {s: oracle_episodes(rules[s], rt["best_per_member"]) for s in seeds},
        "static": {s: episodes_of(rules[s], STATIC) for s in seeds},
    }
    out: dict[str, Any] = {"seeds": seeds, "last_third": [last.start, last.stop - 1]}
    for key, rounds in (("ppo", last), (FROZEN, window), (FROZEN_SAMPLE, window)):
        ours = {s: episodes_of(part_by_seed[s], key) for s in seeds}
        if not any(ours.values()):
            continue
        eps = [e for by in ours.values() for e in by.values() if e["round"] in rounds]
        out[key] = {
            "minus": {k: paired_rounds(ours, v, rounds) for k, v in others.items()},
            "acc": mean_se([e["acc"] for e in eps])[0],
            "reward": mean_se([e["reward"] for e in eps])[0],
            "params": mean_se([float(e["params"]) for e in eps])[0],
            "choices": choices(eps),
            "gains": {
                m: list(mean_se(v)) for m, v in gains_vs(ours, others["static"], rounds).items()
            },
        }
    train = {s: episodes_of(part_by_seed[s], "ppo") for s in seeds}
    first = range(max(cfg.run.rounds // 3, 1))
    out["choices_first_third"] = choices(
        e for by in train.values() for e in by.values() if e["round"] in first
    )
    out["per_round"] = {
        k: [statistics.fmean(round_means(by, k, range(r, r + 1))[r] for by in train.values())
            for r in range(cfg.run.rounds)]
        for k in ("acc", "reward")
    }  # fmt: skip
    updates = [u for s in seeds for u in part_by_seed[s]["runs"]["ppo"][0]["updates"]]
    out["updates_last_third"] = {
        k: mean_se([u[k] for u in updates if u["round"] in last])[0] for k in ("ev", "kl", "clip")
    }
    # the value function's quality as training goes: explained variance per round
    out["ev_per_round"] = [
        mean_se([u["ev"] for u in updates if u["round"] == r])[0] for r in range(cfg.run.rounds)
    ]
    out["wall_minutes_per_seed"] = [part_by_seed[s]["runs"]["ppo"][0]["wall_s"] / 60 for s in seeds]
    return out


def _transfer_block(transfer: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Each frozen PPO variant on the held-out members minus each rule there (``ppo``'s
    at the top level, the others under ``variants``), and every policy's gains."""
    played = {n for p in transfer.values() for n in p["runs"]}
    policies = sorted(
        (n for n in played if n.startswith("ppo")), key=lambda n: (n.split(SAMPLED)[0] != "ppo", n)
    )
    names = sorted(played - set(policies))
    everything = range(10**6)

    def minus(policy: str) -> dict[str, Any]:
        ours = {s: episodes_of(p, policy) for s, p in transfer.items() if policy in p["runs"]}
        out: dict[str, Any] = {
            "seeds": sorted(ours),
            "minus": {
                n: paired_rounds(
                    ours, {s: episodes_of(p, n) for s, p in transfer.items()}, everything
                )
                for n in names
            },
            "choices": choices(e for eps in ours.values() for e in eps.values()),
        }
        print_minus(f"held-out members: frozen {policy} minus", out["minus"])
        return out

    blocks = {policy: minus(policy) for policy in policies}
    return {
        **blocks.get("ppo", {}),
        "gains": {
            n: {m: list(mean_se(v)) for m, v in gains(transfer, n, everything).items()}
            for n in [*policies, *names]
            if n != STATIC
        },
        "variants": {k: v for k, v in blocks.items() if k != "ppo"},
    }


def variants() -> list[str]:
    """The PPO variants with stored parts (``ppo`` first)."""
    names = {p.stem.rsplit("-s", 1)[0] for p in PARTS_DIR.glob("ppo*-s*.json")}
    return sorted(names, key=lambda n: (n != "ppo", n))


def summary(cfg: Config, out: Path, out_name: str) -> dict[str, Any]:
    """Every table of the benchmark from the stored parts."""
    rules, transfer = stored("rules"), stored("transfer")
    rt = chosen_rules(cfg)
    window = table_window(cfg)
    print_rules(rt)
    result: dict[str, Any] = {
        "config": str(FAMILY_CONFIG.relative_to(REPO_ROOT)),
        "table_rounds": [window.start, window.stop - 1],
        "rules": rt,
        "margins": margins({s: rules[s] for s in rt["seeds"]}, rt["best_per_member"], window),
        "ppo": {},
    }
    for variant in variants():
        overrides = next(iter(stored(variant).values())).get("overrides", {})
        block = _ppo_block(stored(variant), rules, rt, with_overrides(cfg, overrides), window)
        block["overrides"] = overrides
        result["ppo"][variant] = block
        for key, what in (
            ("ppo", "training, last third"),
            (FROZEN, "final policy frozen"),
            (FROZEN_SAMPLE, "final policy frozen, sampled"),
        ):
            if key in block:
                rounds = block["last_third"] if key == "ppo" else result["table_rounds"]
                print_minus(
                    f"{variant} ({what}, rounds {rounds[0]}-{rounds[1]}) minus", block[key]["minus"]
                )
    if transfer:
        result["transfer"] = _transfer_block(transfer)
    use = _descriptors.summarize(PARTS_DIR, "ppo")
    if use:
        result["descriptor_use"] = use
        rows = [[g, use[g]["op"], use[g]["growth"]] for g in _descriptors.GROUPS]
        print_table(
            f"the final policy, frozen, with one descriptor group from the partner member "
            f"(seeds {use['seeds']}): share of steps whose greedy op changes, and of "
            "germinations whose op, slot or blueprint changes",
            ["swapped", "op changed", "germination changed"],
            rows,
        )
    result["wall_minutes_runs"] = (
        sum(
            run["wall_s"]
            for stage_parts in [rules, transfer, *(stored(v) for v in variants())]
            for p in stage_parts.values()
            for runs in p["runs"].values()
            for run in runs
        )
        / 60
    )
    result["machine"] = machine_info()
    write_results(out, out_name, result)
    return result


def main_family(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    """``learning.py --family STAGE [--seeds S,..] [--variant NAME --set K=V] [--quick]``."""
    global PARTS_DIR, CHECKPOINTS, TABLE_BLUEPRINTS
    if args.quick:  # a smoke test: its files never mix with the real ones
        PARTS_DIR = args.out / "learning_family_quick"
        CHECKPOINTS = PARTS_DIR / "checkpoints"
        TABLE_BLUEPRINTS = ("conv_heavy",)
    cfg, holdout = configs(args.quick)
    if args.family == "summary":
        summary(
            cfg,
            args.out,
            "learning_family_quick" if args.quick else (args.name or "learning_family"),
        )
        return 0
    variant = "ppo" if not args.variant else f"ppo-{args.variant}"
    if overrides and args.family != "ppo":
        raise SystemExit("--set: only with --family ppo (a PPO variant)")
    if args.variant and args.family not in ("ppo", "transfer", "descriptors"):
        raise SystemExit("--variant: only with --family ppo, transfer or descriptors")
    if overrides and not args.variant:
        raise SystemExit("--set: name the variant (--variant NAME): its results are its own")
    frozen = frozen_config(cfg, overrides)
    cfg = with_overrides(cfg, overrides)
    data = load_task(cfg.task, seed=0)
    for seed in args.seeds or ([0] if args.quick else list(SEEDS)):
        stage(args.family, seed, cfg, holdout, data, variant, frozen)
        if overrides:
            part = load_part(variant, seed)
            part["overrides"] = overrides
            save_part(variant, seed, part)
    return 0
