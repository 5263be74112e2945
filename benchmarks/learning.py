"""Learning benchmark: PPO vs heuristic vs a random valid policy vs the static host.

Every policy runs the same task (``configs/learning.toml`` unless ``--config``), with the
same run seeds, so round ``r`` of seed ``s`` starts from the same freshly seeded hosts
whatever the policy. Per policy it reports the mean episode reward per round, and over
the last third of rounds: final accuracy, parameters added, accuracy gained per 1k added
parameters (against the static host of the same seed and round), fossilized and pruned
seeds; for PPO also explained variance, approx KL and clip fraction per update. The
statistics are ``esper analyze compare --group``'s (``esper_analysis.groups``): the mean
over seeds of each run's last-third mean with a 95 % t interval over seeds, and the
differences (PPO minus each other policy, each policy minus the static host) paired by
seed. Every policy is one of ``esper train --policy ppo|heuristic|eager|random|static``
(``esper.policy``): the static host always WAITs; the random policy draws every head
uniformly among the valid choices; ``eager_heavy`` is the eager grower with
``policy.eager.blueprints = ["conv_heavy"]``.

    python benchmarks/learning.py                 # 3 seeds, full preset (see README)
    python benchmarks/learning.py --quick         # seconds: a smoke test, numbers mean nothing
    python benchmarks/learning.py --family rules|ppo|pair|transfer|summary [--seeds S]
                                                  # the host family (benchmarks/_family.py)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, RESULTS_DIR, machine_info, print_table, write_results
from esper_analysis.groups import group_curves, group_difference, group_summary, seed_means
from esper_analysis.stats import Estimate, mean_ci

from esper.config import Config, load_config, with_overrides
from esper.core.enums import TelemetryLevel
from esper.data.tasks import load_task
from esper.telemetry import events as ev
from esper.telemetry.memory_hub import MemoryHub
from esper.training.run import train

POLICIES = ("ppo", "heuristic", "eager", "random", "static")
#: Optional policies (not in the default set): the eager grower with the largest CNN seed.
EXTRA_POLICIES = ("eager_heavy",)
#: Each policy is ``esper train --policy NAME`` (``policy.kind``), plus these overrides.
POLICY_OVERRIDES: dict[str, dict[str, Any]] = {
    **{name: {"policy.kind": name} for name in POLICIES},
    "eager_heavy": {"policy.kind": "eager", "policy.eager.blueprints": ["conv_heavy"]},
}
DEFAULT_CONFIG = REPO_ROOT / "configs" / "learning.toml"
DEFAULT_SEEDS = (0, 1, 2)
#: The quick mode: a smoke test of the whole pipeline, in seconds.
QUICK: dict[str, Any] = {
    "run.rounds": 3,
    "run.episode_length": 4,
    "run.n_envs": 2,
    "task.train_samples_per_env": 64,
    "task.val_samples": 64,
    "policy.feature_dim": 16,
    "policy.lstm_hidden": 16,
}
PARAMS_PER_K = 1000.0
#: ``--config defaults``: no preset, the built-in defaults (``esper train`` with no config).
DEFAULTS = "defaults"
#: Override keys that change only what PPO does (the other policies ignore them).
PPO_ONLY_KEYS = (
    "ppo.",
    "policy.op_prior",
    "policy.feature_dim",
    "policy.lstm_hidden",
    "policy.blueprint_embed_dim",
)


#: Per-round series of a run's results (one value per round).
ROUND_SERIES = ("reward", "acc", "params", "fossilized", "pruned", "germinated")


def run_policy(cfg: Config, name: str, seed: int, data: Any) -> dict[str, Any]:
    """One run; per round the env means of the episode numbers, PPO's update stats."""
    run_cfg = with_overrides(
        cfg,
        {"run.seed": seed, "telemetry.level": "lifecycle", **POLICY_OVERRIDES.get(name, {})},
    )
    hub = MemoryHub(run_id=f"{name}-s{seed}", level=TelemetryLevel.LIFECYCLE)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        train(run_cfg, telemetry=hub, data=data, save=Path(tmp) / "ckpt.pt")
    wall = time.perf_counter() - t0
    rounds = run_cfg.run.rounds
    per: dict[str, list[list[float]]] = {k: [[] for _ in range(rounds)] for k in ROUND_SERIES}
    ppo: dict[str, list[float]] = {"ev": [], "kl": [], "clip": [], "value_loss": []}
    for e in hub.events:
        if isinstance(e, ev.EpisodeFinished):
            r = e.round
            per["reward"][r].append(e.episode_reward)
            per["acc"][r].append(e.final_val_acc)
            per["params"][r].append(float(e.params_added))
            per["fossilized"][r].append(float(e.seeds_fossilized))
            per["pruned"][r].append(float(e.seeds_pruned))
            per["germinated"][r].append(float(e.seeds_germinated))
        elif isinstance(e, ev.PpoUpdate):
            ppo["ev"].append(e.explained_variance)
            ppo["kl"].append(e.approx_kl)
            ppo["clip"].append(e.clip_frac)
            ppo["value_loss"].append(e.value_loss)
    out: dict[str, Any] = {k: [statistics.fmean(v) for v in rows] for k, rows in per.items()}
    out["wall_s"] = wall
    if name == "ppo":
        out["ppo"] = ppo
    return out


def _last_third(rounds: int) -> range:
    return range(rounds - max(rounds // 3, 1), rounds)


def _per_round(runs: dict[str, dict[int, dict[str, Any]]], rounds: int) -> pl.DataFrame:
    """One row per (policy, seed, round): the round's env means of every series."""
    rows = [
        {"group": name, "seed": s, "round": r, **{k: run[k][r] for k in ROUND_SERIES}}
        for name, by_seed in runs.items()
        for s, run in by_seed.items()
        for r in range(rounds)
    ]
    schema = {"group": pl.String, "seed": pl.Int64, "round": pl.Int64}
    return pl.DataFrame(rows, schema={**schema, **dict.fromkeys(ROUND_SERIES, pl.Float64)})


def _ppo_per_round(by_seed: dict[int, dict[str, Any]], rounds: int) -> pl.DataFrame:
    keys = ("ev", "kl", "clip", "value_loss")
    rows = [
        {"group": "ppo", "seed": s, "round": r, **{k: run["ppo"][k][r] for k in keys}}
        for s, run in by_seed.items()
        for r in range(rounds)
    ]
    schema = {"group": pl.String, "seed": pl.Int64, "round": pl.Int64}
    return pl.DataFrame(rows, schema={**schema, **dict.fromkeys(keys, pl.Float64)})


def _estimate(est: Estimate) -> dict[str, Any]:
    """A difference as the results file stores it: mean, 95 % CI over seeds, n seeds."""
    return {
        "mean": est.mean,
        "se": est.std_err,
        "ci_low": est.low,
        "ci_high": est.high,
        "n": est.n,
        "method": est.method,
    }


def summarise(runs: dict[str, dict[int, dict[str, Any]]], rounds: int) -> dict[str, Any]:
    """Per policy the mean over seeds of the last third's means, with 95 % intervals
    over seeds; differences paired by seed (``esper_analysis.groups``, the statistics
    of ``esper analyze compare --group``)."""
    last = _last_third(rounds)
    per_round = _per_round(runs, rounds)
    per_seed = seed_means(per_round, ROUND_SERIES)
    table = {
        (g, m): row for g, m, row in ((r["group"], r["metric"], r) for r in
                                      group_summary(per_seed, ROUND_SERIES).to_dicts())
    }  # fmt: skip
    curves = group_curves(per_round, ["reward"])
    summary: dict[str, Any] = {
        "last_third_rounds": [last.start, last.stop - 1],
        "statistics": "mean over seeds of each run's last-third mean; 95 % t interval over "
        "seeds; differences paired by seed",
    }
    for name, by_seed in runs.items():
        row: dict[str, Any] = {}
        for key in ROUND_SERIES:
            row[key] = table[(name, key)]["mean"]
            row[f"{key}_ci"] = [table[(name, key)]["ci_low"], table[(name, key)]["ci_high"]]
        row["seeds"] = len(by_seed)
        row["reward_per_round"] = curves.filter(pl.col("group") == name)["reward"].to_list()
        if "static" in runs and row["params"] > 0:
            gain = row["acc"] - table[("static", "acc")]["mean"]
            row["acc_gain_per_1k_params"] = gain / (row["params"] / PARAMS_PER_K)
        else:
            row["acc_gain_per_1k_params"] = math.nan
        if name == "ppo":
            ppo = seed_means(_ppo_per_round(by_seed, rounds), ["ev", "kl", "clip", "value_loss"])
            for key in ("ev", "kl", "clip", "value_loss"):
                row[f"{key}_last_third"] = mean_ci(ppo[key].to_list()).mean
        summary[name] = row
    paired: dict[str, Any] = {}
    if "ppo" in runs:
        for other in (p for p in runs if p != "ppo"):
            for key in ("reward", "acc"):
                est = group_difference(per_seed, other, "ppo", key, paired=True)
                paired[f"ppo-{other}:{key}"] = _estimate(est)
    summary["paired"] = paired
    summary["vs_static"] = _vs_static(runs, per_seed, last)
    return summary


def _vs_static(
    runs: dict[str, dict[int, dict[str, Any]]], per_seed: pl.DataFrame, last: range
) -> dict[str, Any]:
    """Each policy minus the static host, paired by seed (95 % interval over seeds).

    ``agree`` counts the (seed, round) pairs of the last third where the policy
    out-earned the static host if and only if it ended more accurate: how well the
    reward tracks accuracy.
    """
    out: dict[str, Any] = {}
    if "static" not in runs:
        return out
    base = runs["static"]
    for name in (p for p in runs if p != "static"):
        reward = group_difference(per_seed, "static", name, "reward", paired=True)
        acc = group_difference(per_seed, "static", name, "acc", paired=True)
        pairs = [
            (
                runs[name][s]["reward"][r] - base[s]["reward"][r],
                runs[name][s]["acc"][r] - base[s]["acc"][r],
            )
            for s in sorted(set(runs[name]) & set(base))
            for r in last
        ]
        out[name] = {
            "reward": reward.mean,
            "reward_se": reward.std_err,
            "reward_ci": [reward.low, reward.high],
            "acc": acc.mean,
            "acc_se": acc.std_err,
            "acc_ci": [acc.low, acc.high],
            "n": reward.n,
            "agree": sum(1 for d, a in pairs if (d > 0) == (a > 0)),
            "pairs": len(pairs),
        }
    return out


def _ci(low: float, high: float) -> str:
    return "—" if not (math.isfinite(low) and math.isfinite(high)) else f"{low:.3g} to {high:.3g}"


def _print(summary: dict[str, Any], policies: list[str]) -> None:
    cols = ["policy", "seeds", "reward", "final acc %", "params added", "acc pp / 1k params"]
    cols += ["fossilized", "pruned", "germinated"]
    rows = [
        [
            p,
            summary[p]["seeds"],
            summary[p]["reward"],
            summary[p]["acc"],
            summary[p]["params"],
            summary[p]["acc_gain_per_1k_params"],
            summary[p]["fossilized"],
            summary[p]["pruned"],
            summary[p]["germinated"],
        ]
        for p in policies
    ]
    print_table("last third of rounds, mean over seeds", cols, rows)
    pairs = [
        [k, v["mean"], _ci(v["ci_low"], v["ci_high"]), v["n"]] for k, v in summary["paired"].items()
    ]
    print_table("differences paired by seed", ["pair", "mean", "95% CI", "seeds"], pairs)
    vs = summary.get("vs_static", {})
    if vs:
        cols = ["policy", "reward", "95% CI", "acc pp", "95% CI", "reward sign = acc sign"]
        rows = [
            [p, v["reward"], _ci(*v["reward_ci"]), v["acc"], _ci(*v["acc_ci"]),
             f"{v['agree']}/{v['pairs']}"]
            for p, v in vs.items()
        ]  # fmt: skip
        print_table("minus the static host, paired by seed", cols, rows)
    if "ppo" in summary:
        s = summary["ppo"]
        print(
            f"PPO updates, last third: explained variance {s['ev_last_third']:.3f}, "
            f"approx KL {s['kl_last_third']:.4f}, clip fraction {s['clip_last_third']:.3f}"
        )


def preset(path: str | Path) -> Config:
    """The config a run of this benchmark starts from (``--config``)."""
    return Config() if str(path) == DEFAULTS else load_config(path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help=f"a preset (default {DEFAULT_CONFIG.relative_to(REPO_ROOT)}); '{DEFAULTS}': the "
        "built-in defaults, what esper train runs with no --config",
    )
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument(
        "--policies",
        type=lambda s: s.split(","),
        default=None,
        help=f"default {','.join(POLICIES)}; with --merge: keep only these from the files",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override (JSON)"
    )
    parser.add_argument("--quick", action="store_true", help="seconds; numbers mean nothing")
    parser.add_argument(
        "--family",
        choices=["rules", "ppo", "pair", "transfer", "descriptors", "summary"],
        help="the host-family benchmark (configs/learning_family.toml), one stage "
        "(benchmarks/_family.py; --seeds picks the seeds)",
    )
    parser.add_argument(
        "--variant",
        metavar="NAME",
        help="with --family ppo: a PPO variant (an ablation, with --set), stored apart",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default=None, help="results file name (default: learning)")
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="summarise earlier results files together (e.g. one per seed, run in parallel)",
    )
    parser.add_argument(
        "--baselines",
        nargs="+",
        type=Path,
        default=[],
        metavar="JSON",
        help="with --merge: take the policies other than PPO that the --merge files lack "
        "from these files (e.g. a PPO-only variant against baselines run once)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="with --merge: keep each run's first N rounds (parts may differ in run.rounds)",
    )
    args = parser.parse_args(argv)
    if args.baselines and not args.merge:
        parser.error("--baselines: only with --merge")
    if args.rounds is not None and (not args.merge or args.rounds < 1):
        parser.error(
            "--rounds: a positive count, only with --merge (to run N rounds: --set run.rounds=N)"
        )
    bad = [p for p in args.policies or () if p not in POLICIES + EXTRA_POLICIES]
    if bad:
        parser.error(f"--policies: unknown {bad}; choose from {list(POLICIES + EXTRA_POLICIES)}")
    return args


def _overrides(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _payload(
    args: argparse.Namespace, cfg: Config, overrides: dict[str, Any], runs: Any, wall: float
) -> dict[str, Any]:
    seeds = sorted({int(s) for by in runs.values() for s in by})
    return {
        "config": str(args.config),
        "quick": bool(args.quick),
        "overrides": overrides,
        "seeds": seeds,
        "rounds": cfg.run.rounds,
        "n_envs": cfg.run.n_envs,
        "episode_length": cfg.run.episode_length,
        "wall_minutes": wall / 60,
        "machine": machine_info(),
        "summary": summarise(runs, cfg.run.rounds),
        "runs": {p: {str(s): r for s, r in by.items()} for p, by in runs.items()},
    }


def _truncated(run: dict[str, Any], rounds: int) -> dict[str, Any]:
    """A run's first ``rounds`` rounds (per-round series and one PPO update per round)."""
    out = {k: v[:rounds] if k in ROUND_SERIES else v for k, v in run.items()}
    if "ppo" in run:
        out["ppo"] = {k: v[:rounds] for k, v in run["ppo"].items()}
    return out


def _ppo_only(key: str) -> bool:
    return key.startswith(PPO_ONLY_KEYS)


def _merge_key(part: dict[str, Any], rounds: int | None) -> str:
    """What must match between merged files: the resolved config (the preset file plus
    the file's overrides), so an override equal to the preset's value matches the
    preset; ``run.rounds`` may differ when truncating.

    PPO-only keys (``ppo.*`` and the policy network's) are left out: they change only
    the PPO runs, so a PPO variant can be summarised with baselines run once (the PPO
    files themselves must agree on them, :func:`_ppo_overrides`).
    """
    overrides = {k: v for k, v in part["overrides"].items() if not _ppo_only(k)}
    if rounds is not None and part["rounds"] < rounds:
        raise SystemExit(f"--rounds {rounds}: a results file has only {part['rounds']} rounds")
    resolved = msgspec.to_builtins(with_overrides(preset(part["config"]), overrides))
    resolved.pop("ppo")
    for key in PPO_ONLY_KEYS:
        section, _, name = key.partition(".")
        if name:
            resolved[section].pop(name, None)
    if rounds is not None:
        resolved["run"].pop("rounds")
    return json.dumps(resolved, sort_keys=True)


def _ppo_overrides(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The PPO-only overrides of the files holding PPO runs (which must agree)."""
    found = [
        {k: v for k, v in part["overrides"].items() if _ppo_only(k)}
        for part in parts
        if "ppo" in part["runs"]
    ]
    if any(f != found[0] for f in found):
        raise SystemExit("--merge: the PPO runs come from different PPO-only settings")
    return found[0] if found else {}


def _merge(args: argparse.Namespace) -> int:
    """One summary over several results files (same config, disjoint seeds).

    With ``--rounds N`` every run is cut to its first N rounds, so runs of different
    lengths can be compared: nothing in a run's round r depends on ``run.rounds`` (the
    lr and entropy schedules count their own rounds), so the first N rounds of a longer
    run are the rounds an N-round run would have played.
    """
    parts = [json.loads(Path(p).read_text()) for p in args.merge]
    merged = {policy for part in parts for policy in part["runs"]}
    bases = [json.loads(Path(p).read_text()) for p in args.baselines]
    for base in bases:
        base["runs"] = {k: v for k, v in base["runs"].items() if k != "ppo" and k not in merged}
    parts += bases
    if args.policies:
        for part in parts:
            part["runs"] = {k: v for k, v in part["runs"].items() if k in args.policies}
    first = parts[0]
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for path, part in zip([*args.merge, *args.baselines], parts, strict=True):
        if _merge_key(part, args.rounds) != _merge_key(first, args.rounds):
            raise SystemExit(f"--merge: {path} comes from a different configuration")
        for policy, by_seed in part["runs"].items():
            for s, r in by_seed.items():
                if int(s) in runs.setdefault(policy, {}):
                    raise SystemExit(f"--merge: {path}: {policy} seed {s} is in two files")
                runs[policy][int(s)] = _truncated(r, args.rounds) if args.rounds else r
    wall = sum(p["wall_minutes"] for p in parts) * 60
    overrides = {k: v for k, v in first["overrides"].items() if not _ppo_only(k)}
    overrides.update(_ppo_overrides(parts))
    if args.rounds is not None:
        overrides["run.rounds"] = args.rounds
    cfg = with_overrides(preset(first["config"]), overrides)
    payload = _payload(args, cfg, overrides, runs, wall)
    payload["config"], payload["quick"] = first["config"], first.get("quick", False)
    payload["wall_minutes_note"] = "sum of the merged parts' wall times (they may have overlapped)"
    experiments = sorted({part["experiment"] for part in parts if "experiment" in part})
    if experiments:  # provenance a part's producer recorded (e.g. a patched run)
        payload["experiment"] = "; ".join(experiments)
    if args.rounds is not None:
        lengths = sorted({part["rounds"] for part in parts})
        payload["rounds_note"] = f"the first {args.rounds} rounds of runs of {lengths} rounds"
    _print(payload["summary"], list(runs))
    write_results(args.out, args.name or "learning", payload)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.family:
        from _family import main_family

        return main_family(args, _overrides(args.set))
    if args.merge:
        return _merge(args)
    cfg = preset(args.config)
    overrides = dict(QUICK) if args.quick else {}
    overrides.update(_overrides(args.set))
    cfg = with_overrides(cfg, overrides)
    seeds = args.seeds or ([0, 1] if args.quick else list(DEFAULT_SEEDS))
    data = load_task(cfg.task, seed=0)
    t0 = time.perf_counter()
    policies = args.policies or list(POLICIES)
    runs: dict[str, dict[int, dict[str, Any]]] = {p: {} for p in policies}
    for seed in seeds:
        for name in policies:
            runs[name][seed] = run_policy(cfg, name, seed, data)
            print(f"{name} seed {seed}: {runs[name][seed]['wall_s']:.0f} s", flush=True)
    wall = time.perf_counter() - t0
    payload = _payload(args, cfg, overrides, runs, wall)
    _print(payload["summary"], policies)
    print(f"total {wall / 60:.1f} minutes on {machine_info()['cores']} cores")
    write_results(args.out, args.name or ("learning_quick" if args.quick else "learning"), payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
