"""``esper analyze compare`` and the report's compared-runs section, on known runs."""

from __future__ import annotations

import io
import json
import math
import statistics
from pathlib import Path

import msgspec
import polars as pl
import pytest
from _analysis_support import run_started
from esper_analysis.cli import main
from esper_analysis.compare import compare_runs
from esper_analysis.loader import load_run

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run

ROUNDS, ENVS = 3, 2


def _run(
    root: Path,
    run_id: str,
    reward: float,
    acc: float,
    *,
    episodes: bool = True,
    seed: int = 0,
    envs: int = ENVS,
    policy: str = "ppo",
    started: bool = True,
) -> Path:
    """Episode reward ``reward + round + env`` and final accuracy ``acc + env``."""
    hub = open_run(root, run_id, level=TelemetryLevel.NORMAL, flush_interval_s=0.05)
    if started:
        hub.emit(
            msgspec.structs.replace(
                run_started(), seed=seed, n_envs=envs, policy_kind=policy, rounds=ROUNDS
            )
        )
    for r in range(ROUNDS if episodes else 0):
        for e in range(envs):
            hub.emit(
                ev.EpisodeFinished(
                    round=r,
                    env=e,
                    step=9,
                    final_val_acc=acc + e,
                    final_val_loss=0.5,
                    host_params=100,
                    params_added=10 * e,
                    seeds_germinated=1,
                    seeds_fossilized=e,
                    seeds_pruned=0,
                    episode_reward=reward + r + e,
                    rollbacks=0,
                    rollback_penalty=0.0,
                )
            )
    hub.close(RunStatus.FINISHED)
    return root / run_id


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("compare")
    return (
        _run(root, "ref", 1.0, 70.0),
        _run(root, "better", 1.5, 71.0),
        _run(root, "empty", 0.0, 0.0, episodes=False),
    )


def test_paired_differences_and_late_window(runs: tuple[Path, Path, Path]) -> None:
    result = compare_runs([load_run(runs[0]), load_run(runs[1])])
    paired = {row["metric"]: row for row in result.paired.to_dicts()}
    assert paired["reward"]["mean_diff"] == pytest.approx(0.5)
    assert paired["reward"]["std_err"] == pytest.approx(0.0)
    assert paired["reward"]["n"] == ROUNDS * ENVS and paired["reward"]["rounds_ahead"] == 3
    assert paired["reward"]["pairing"] == "paired by (round, env)"
    assert paired["reward"]["ci_low"] == pytest.approx(0.5) == paired["reward"]["ci_high"]
    assert paired["final_acc"]["mean_diff"] == pytest.approx(1.0)
    ref = result.runs.to_dicts()[0]
    assert ref["late_from_round"] == 2 and ref["late_reward"] == pytest.approx(3.5)
    assert result.curves.height == 2 * ROUNDS
    curve = result.curves.filter(pl.col("run") == "ref").row(0, named=True)  # round 0
    assert (curve["episode_reward_low"], curve["episode_reward_high"]) == (1.0, 2.0)


def test_cli_table_json_and_exit_codes(runs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["compare", str(runs[0]), str(runs[1])], stdout=out, stderr=err) == 0
    assert "Each run minus the reference" in out.getvalue() and "better" in out.getvalue()
    out = io.StringIO()
    assert main(["compare", str(runs[0]), str(runs[1]), "--json"], stdout=out) == 0
    data = json.loads(out.getvalue())
    assert data["summary"]["reference"] == "ref" and len(data["paired"]) == 2
    assert data["summary"]["pairing"] == "paired by (round, env)"
    err = io.StringIO()
    assert main(["compare", str(runs[0]), str(runs[2])], stdout=io.StringIO(), stderr=err) == 2
    assert "no finished episodes" in err.getvalue()
    err = io.StringIO()
    assert main(["compare", str(runs[0]), str(runs[0])], stderr=err) == 2
    assert "given twice" in err.getvalue()
    assert main(["compare", str(tmp_path / "nope")], stderr=io.StringIO()) == 2
    assert main(["compare"], stderr=io.StringIO()) == 2


def test_report_overlays_compared_runs(runs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    target = tmp_path / "r.html"
    args = ["report", str(runs[0]), "-o", str(target), "--compare", str(runs[1])]
    assert main(args, stdout=io.StringIO(), stderr=io.StringIO()) == 0
    text = target.read_text()
    assert "Compared runs" in text and 'data-series="better"' in text
    assert 'class="band" data-series="better"' in text  # the envs' spread


# --- runs that must not be paired (issue 49) -------------------------------------------


@pytest.fixture(scope="module")
def unpairable(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Runs that train other hosts than ``ref`` (seed, envs) or say nothing of theirs."""
    root = tmp_path_factory.mktemp("unpairable")
    return {
        "ref": _run(root, "ref-s0", 1.0, 70.0),
        "seed1": _run(root, "static-s1", 1.2, 69.0, seed=1, policy="static"),
        "envs8": _run(root, "family-s0", 1.1, 50.0, envs=8),
        "unknown": _run(root, "no-start", 1.1, 50.0, started=False),
    }


@pytest.mark.parametrize(
    ("other", "named"),
    [
        ("seed1", "seed 1 vs 0"),
        ("envs8", "envs 8 vs 2"),
        ("unknown", "no-start recorded no run_started"),
    ],
)
def test_compare_refuses_runs_that_do_not_train_the_same_hosts(
    unpairable: dict[str, Path], other: str, named: str
) -> None:
    """Seed 0 against seed 1, or against an 8-env run, is no pair: exit 2 naming why,
    nothing on stdout (also with --json), and the same for the report's --compare."""
    for extra in ([], ["--json"]):
        out, err = io.StringIO(), io.StringIO()
        argv = ["compare", str(unpairable["ref"]), str(unpairable[other]), *extra]
        assert main(argv, stdout=out, stderr=err) == 2
        assert out.getvalue() == ""
        assert named in err.getvalue() and "--unpaired" in err.getvalue()
        assert len(err.getvalue().strip().splitlines()) == 1
    err = io.StringIO()
    argv = ["report", str(unpairable["ref"]), "--compare", str(unpairable[other])]
    assert main([*argv, "-o", "/dev/null"], stdout=io.StringIO(), stderr=err) == 2
    assert named in err.getvalue()


def test_unpaired_compare_says_welch_in_table_and_json(unpairable: dict[str, Path]) -> None:
    argv = ["compare", str(unpairable["ref"]), str(unpairable["seed1"]), "--unpaired"]
    out = io.StringIO()
    assert main([*argv, "--json"], stdout=out) == 0
    data = json.loads(out.getvalue())
    assert data["summary"]["pairing"] == "unpaired (Welch)"
    reward = next(r for r in data["paired"] if r["metric"] == "reward")
    assert reward["pairing"] == "unpaired (Welch)" and reward["n"] == 2 * ROUNDS * ENVS
    # ref: 1 + round + env; other: 1.2 + round + env: the same spread, 0.2 apart
    assert reward["mean_diff"] == pytest.approx(0.2)
    se = math.sqrt(2 * statistics.variance([1.0 + r + e for r in range(3) for e in range(2)]) / 6)
    assert reward["std_err"] == pytest.approx(se)
    assert reward["ci_low"] < 0.2 < reward["ci_high"]
    text = io.StringIO()
    assert main(argv, stdout=text) == 0
    assert "unpaired (Welch)" in " ".join(text.getvalue().split())


# --- groups of seeds ------------------------------------------------------------------

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def seed_groups(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ppo: late reward 3.5, 3.6, 3.7 over seeds 0-2; static: 3.0, 3.2, 3.4."""
    root = tmp_path_factory.mktemp("groups")
    for s in SEEDS:
        _run(root / "ppo", f"ppo-s{s}", 1.0 + 0.1 * s, 70.0 + s, seed=s)
        _run(root / "static", f"static-s{s}", 0.5 + 0.2 * s, 69.0 + s, seed=s, policy="static")
    return root


T2 = 4.303  # the 97.5 % quantile of t with 2 degrees of freedom


def test_groups_mean_and_ci_over_seeds_paired_by_seed(seed_groups: Path) -> None:
    """--group policy and directories of runs give the same groups: mean over seeds
    with a t interval, and static minus ppo paired seed by seed."""
    runs = [str(p) for p in sorted(seed_groups.glob("*/*"))]
    by_policy, by_dir = io.StringIO(), io.StringIO()
    assert main(["compare", *runs, "--group", "policy", "--json"], stdout=by_policy) == 0
    dirs = [str(seed_groups / "ppo"), str(seed_groups / "static")]
    assert main(["compare", *dirs, "--json"], stdout=by_dir) == 0
    for text, reference in ((by_policy, "ppo"), (by_dir, "ppo")):
        data = json.loads(text.getvalue())
        assert data["summary"]["reference"] == reference
        assert data["summary"]["pairing"] == "paired by seed"
        groups = {(r["group"], r["metric"]): r for r in data["groups"]}
        ppo = groups[("ppo", "reward")]
        assert ppo["seeds"] == 3 and ppo["mean"] == pytest.approx(3.6)
        half = T2 * 0.1 / math.sqrt(3)
        assert (ppo["ci_low"], ppo["ci_high"]) == pytest.approx((3.6 - half, 3.6 + half))
        diff = next(
            r for r in data["differences"] if r["group"] == "static" and r["metric"] == "reward"
        )
        assert diff["pairing"] == "paired by seed" and diff["seeds"] == 3
        assert diff["mean_diff"] == pytest.approx(-0.4)
        assert (diff["ci_low"], diff["ci_high"]) == pytest.approx((-0.4 - half, -0.4 + half))
        curves = [r for r in data["curves"] if r["group"] == "static"]
        assert len(curves) == ROUNDS and all(r["seeds"] == 3 for r in curves)


def test_groups_refuse_what_seeds_cannot_average_or_pair(
    seed_groups: Path, unpairable: dict[str, Path], tmp_path: Path
) -> None:
    ppo = [str(seed_groups / "ppo" / f"ppo-s{s}") for s in SEEDS]
    err = io.StringIO()  # two runs of seed 0 in one group
    argv = ["compare", *ppo, str(unpairable["ref"]), "--group", "policy"]
    assert main(argv, stdout=io.StringIO(), stderr=err) == 2
    assert "seed 0 twice" in err.getvalue()
    err = io.StringIO()  # an 8-env run among 2-env seeds
    argv = ["compare", *ppo[1:], str(unpairable["envs8"]), "--group", "policy"]
    assert main(argv, stdout=io.StringIO(), stderr=err) == 2
    assert "more than its seed" in err.getvalue() and "envs 8 vs 2" in err.getvalue()
    only1 = tmp_path / "only1"
    _run(only1, "static-s7", 1.0, 70.0, seed=7, policy="static")
    err = io.StringIO()  # no shared seed: no pairs; Welch only when asked for
    argv = ["compare", str(seed_groups / "ppo"), str(only1)]
    assert main(argv, stdout=io.StringIO(), stderr=err) == 2
    assert "share no seed" in err.getvalue()
    out = io.StringIO()
    assert main([*argv, "--unpaired", "--json"], stdout=out) == 0
    assert json.loads(out.getvalue())["summary"]["pairing"] == "unpaired (Welch)"
    err = io.StringIO()
    assert main(["compare", *ppo, "--group", "ppo.nope"], stderr=err) == 2
    assert "records no 'ppo.nope'" in err.getvalue()


def test_report_draws_groups_with_ci_bands(seed_groups: Path, tmp_path: Path) -> None:
    target = tmp_path / "g.html"
    own = seed_groups / "ppo" / "ppo-s0"
    argv = ["report", str(own), "-o", str(target), "--compare", str(seed_groups / "ppo")]
    argv += [str(seed_groups / "static"), "--group", "policy"]
    assert main(argv, stdout=io.StringIO(), stderr=io.StringIO()) == 0
    text = target.read_text()
    assert "95 % confidence interval over seeds" in text
    assert 'class="band" data-series="static"' in text and "paired by seed" in text


def test_intervals_are_student_t_and_welch() -> None:
    from esper_analysis.stats import mean_ci, t_quantile, welch_ci

    assert t_quantile(1) == 12.706 and t_quantile(30) == 2.042
    assert t_quantile(40) == pytest.approx(2.021, abs=1e-3)
    assert t_quantile(120) == pytest.approx(1.980, abs=1e-3)
    est = mean_ci([1, 2, 3, 4, 5])  # s.e. sqrt(2.5 / 5); t(4) = 2.776
    assert (est.mean, est.low, est.high) == pytest.approx((3, 3 - 1.963, 3 + 1.963), abs=1e-3)
    assert math.isnan(mean_ci([4.0]).low)  # one seed: no interval
    # var 4 (n 3) and 10 (n 5): s.e. sqrt(4/3 + 2), Welch df 5.88 -> t(5) = 2.571
    welch = welch_ci([10, 12, 14], [20, 22, 24, 26, 28])
    half = 2.571 * math.sqrt(4 / 3 + 2)
    assert (welch.mean, welch.low, welch.high) == pytest.approx((12, 12 - half, 12 + half))


def test_pairing_facts_are_the_hosts_not_where_the_data_lies(runs: tuple[Path, Path, Path]) -> None:
    """The same data at another path pairs; another host width does not."""
    import dataclasses

    from esper_analysis.run_info import pairing_differences, run_info

    from esper.config import Config

    config = json.loads(Config().to_json())
    ref = dataclasses.replace(run_info(load_run(runs[0])), config=config)
    moved = {**config, "task": {**config["task"], "data_path": "/elsewhere/cifar"}}
    assert pairing_differences(ref, dataclasses.replace(ref, config=moved)) == []
    wider = {**config, "host": {**config["host"], "base_channels": 32}}
    diffs = pairing_differences(ref, dataclasses.replace(ref, config=wider))
    assert diffs == ["host.base_channels 32 vs 4"]
