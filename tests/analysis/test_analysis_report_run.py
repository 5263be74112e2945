"""What a researcher reads first (issue 49): the report says what was run, omits with a
reason what cannot apply, and its charts do not lie (flat looks flat, identical curves
stay visible, the spread over envs is a band, every round of the lifecycle timeline is
drawn with a gap between episodes, x in rounds or env-steps)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest
from _analysis_support import run_started
from esper_analysis.loader import load_run
from esper_analysis.report import build_report
from esper_analysis.svg import Series, line_chart

from esper.config import Config, with_overrides
from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run

ROUNDS, ENVS, LENGTH = 8, 2, 5
ARGV = ["/usr/local/bin/esper", "train", "--policy", "static", "--seed", "7", "--set", "a b=1"]
#: A static host's reward: the same level every round, up to noise in the 4th digit.
FLAT_REWARD = (0.04835, 0.04855, 0.0484, 0.04845, 0.0485, 0.04838, 0.04852, 0.04841)


def _config() -> Config:
    family = {"members": [{"name": "w2-4-8", "block_channels": [2, 4, 8]}]}
    cfg = with_overrides(Config(), {"family": family, "policy.kind": "static"})
    return with_overrides(cfg, {"run.seed": 7, "run.n_envs": ENVS, "run.rounds": ROUNDS})


def _emit_run(
    root: Path, run_id: str, *, policy: str, eval_checkpoint: str = "", eval_sampled: bool = False
) -> Path:
    """``ROUNDS`` rounds; in every round env 0 grows a seed in r0c0 alive to the end."""
    hub = open_run(root, run_id, level=TelemetryLevel.NORMAL, flush_interval_s=0.05)
    hub.emit(
        msgspec.structs.replace(
            run_started(),
            config_json=_config().to_json(),
            argv=json.dumps(ARGV),
            policy_kind=policy,
            eval_checkpoint=eval_checkpoint,
            eval_sampled=eval_sampled,
            n_envs=ENVS,
            rounds=ROUNDS,
            episode_length=LENGTH,
            seed=7,
        )
    )
    for r in range(ROUNDS):
        hub.emit(
            ev.SeedGerminated(
                round=r, env=0, step=0, slot="r0c0", seed_id=f"s{r}", blueprint="norm",
                style=0, blend_op="ADD", tempo=5, alpha_target=1.0, params=10,
                acc_at_germination=50.0,
            )
        )  # fmt: skip
        for e in range(ENVS):
            hub.emit(
                ev.EpisodeFinished(
                    round=r, env=e, step=LENGTH - 1, final_val_acc=90.0 + e + 0.01 * r,
                    final_val_loss=0.3, host_params=100, params_added=0, seeds_germinated=1,
                    seeds_fossilized=0, seeds_pruned=0,
                    episode_reward=FLAT_REWARD[r] + 0.0001 * e, rollbacks=0,
                    rollback_penalty=0.0, host="w2-4-8",
                )
            )  # fmt: skip
        hub.emit(
            ev.RoundFinished(
                round=r, wall_s=1.0, eps=10.0, mean_episode_reward=FLAT_REWARD[r],
                mean_final_accuracy=90.5, rollbacks=0, train_ms=1.0, val_ms=1.0,
                policy_ms=1.0, action_ms=1.0, ppo_ms=0.0,
            )
        )  # fmt: skip
    hub.close(RunStatus.FINISHED)
    return root / run_id


@pytest.fixture(scope="module")
def static_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _emit_run(tmp_path_factory.mktemp("static"), "static-s7", policy="static")


def _plots(text: str) -> dict[str, str]:
    found = re.findall(r'(<svg class="plot" data-plot="([^"]+)".*?</svg>)', text, re.S)
    return {name: svg for svg, name in found}


def _y_ticks(svg: str) -> list[float]:
    found = re.findall(r'<text class="tick" x="[\d.]+" y="[\d.]+" text-anchor="end">([^<]*)<', svg)
    return [float(v) for v in found]


def test_the_report_opens_with_what_was_run(static_run: Path) -> None:
    text = build_report(load_run(static_run))
    what = text[text.index("<h2>What was run</h2>") : text.index("<h2>Learning curve</h2>")]
    for row, value in {
        "policy": "static",
        "task": "digits",
        "seed": "7",
        "envs": str(ENVS),
        "rounds": f"{ROUNDS} of {ROUNDS}",
        "episode length": f"{LENGTH} steps",
        "hosts": "family of 1: w2-4-8",
        "esper": "0.1.0",
    }.items():
        assert re.search(rf"<th>{row}</th><td>{re.escape(value)}", what), row
    # the command line as typed (quoted where the shell needs it), and the whole config
    assert "esper train --policy static --seed 7 --set &#x27;a b=1&#x27;" in what
    assert "<details><summary>Full resolved config" in what
    config = re.search(r"<pre class='config'>(.*?)</pre>", what, re.S)
    assert config is not None
    assert json.loads(config.group(1).replace("&quot;", '"')) == json.loads(_config().to_json())


def test_sections_that_cannot_apply_say_why(static_run: Path, tmp_path: Path) -> None:
    text = build_report(load_run(static_run))
    assert "<h2>PPO health</h2>" in text
    assert "Not applicable: the static policy does not learn, so there are no PPO updates" in text
    assert "Not applicable: the static policy never germinates a seed" in text
    assert 'data-plot="ppo-entropy"' not in text and "Per-blueprint outcomes" not in text
    frozen = _emit_run(tmp_path, "eval-s7", policy="ppo", eval_checkpoint="runs/a/checkpoint.pt")
    text = build_report(load_run(frozen))
    assert "Not applicable: an evaluation of a frozen policy makes no PPO updates" in text
    assert "ppo (eval), frozen from runs/a/checkpoint.pt" in text
    sampled = _emit_run(tmp_path, "eval-sample-s7", policy="ppo", eval_checkpoint="c.pt",
                        eval_sampled=True)  # fmt: skip
    assert "ppo (eval, sampled), frozen from c.pt" in build_report(load_run(sampled))


def test_a_flat_reward_looks_flat_and_says_how_little_it_varies(static_run: Path) -> None:
    """The issue's case: 0.04835-0.04855 was autoscaled into a V over the whole height."""
    plots = _plots(build_report(load_run(static_run)))
    ticks = _y_ticks(plots["learning-reward"])
    assert min(ticks) == 0 and max(ticks) >= 0.0485  # drawn from zero: a level, not a V
    assert re.search(r"varies 0\.\d+ %: 0\.048\d+ to 0\.048\d+", plots["learning-reward"])
    # without a zero to read against (accuracy), a nearly constant series gets an axis
    # of at least a tenth of its size, and says so too
    svg = line_chart("a", "a", [Series("a", [0, 1, 2], [95.1, 95.3, 95.2])], x_label="r",
                     y_label="acc")  # fmt: skip
    ticks = _y_ticks(svg)
    assert max(ticks) - min(ticks) >= 9.5 and "varies 0.21 %" in svg
    constant = line_chart("c", "c", [Series("c", [0, 1], [0.5, 0.5])], x_label="r", y_label="v")
    assert "constant: 0.5" in constant


def test_identical_curves_stay_visible_and_the_legend_names_the_twin() -> None:
    """Compared eager, static, random and heuristic runs: three identical accuracy
    curves hid each other (a legend of 5, 3 lines visible)."""
    same = [90.0, 91.0, 92.0]
    series = [
        Series("ppo", [0, 1, 2], [90.0, 93.0, 95.0]),
        Series("eager", [0, 1, 2], same, low=[89, 90, 91], high=[91, 92, 93]),
        Series("static", [0, 1, 2], same, low=[89, 90, 91], high=[91, 92, 93]),
        Series("random", [0, 1, 2], same, low=[89, 90, 91], high=[91, 92, 93]),
    ]
    svg = line_chart("cmp", "t", series, x_label="round", y_label="acc")
    dashes = re.findall(r'<path class="series" data-series="([^"]+)"[^>]*?(?:stroke-dasharray="'
                        r'([^"]*)")?/>', svg)  # fmt: skip
    assert len({d for _, d in dashes}) == 4  # a dash pattern each (solid included)
    markers = set(re.findall(r'class="mark" data-marker="([^"]+)"', svg))
    assert len(markers) == 4
    legend = re.findall(r'<text class="legend"[^>]*>([^<]*)<', svg)
    assert legend == ["ppo", "eager", "static (= eager)", "random (= eager)"]  # by last value
    assert len(re.findall(r'class="band"', svg)) == 1  # one band, not three stacked


def test_the_timeline_covers_every_round_with_gaps_between_episodes(static_run: Path) -> None:
    """It showed the last 6 rounds only, and one slot's seeds of consecutive episodes ran
    together into one bar."""
    run = load_run(static_run)
    text = build_report(run).replace("the static policy never germinates a seed", "")
    assert "Not applicable" in text  # static: no timeline; the same run as a ppo run:
    ppo = build_report(load_run(_as_ppo(static_run)))
    pages = re.findall(r"<details class='page'( open)?><summary>rounds (\d+)–(\d+)", ppo)
    assert [(int(a), int(b)) for _, a, b in pages] == [(0, 5), (6, 7)]
    bars = re.findall(r'class="segment" data-stage="GERMINATED" data-round="(\d+)" x="([\d.]+)" '
                      r'y="\d+" width="([\d.]+)"', ppo)  # fmt: skip
    assert sorted(int(r) for r, _, _ in bars) == list(range(ROUNDS))
    by_round = {int(r): (float(x), float(x) + float(w)) for r, x, w in bars}
    for r in range(5):  # one page: each episode's bar ends before the next one starts
        assert by_round[r][1] < by_round[r + 1][0] - 2


def _as_ppo(run: Path) -> Path:
    """A copy of ``run`` whose run_started says ppo (seed events are the same)."""
    target = run.parent / "as-ppo"
    if not target.exists():
        _emit_run(run.parent, "as-ppo", policy="ppo")
    return target


def test_x_axis_in_env_steps(static_run: Path) -> None:
    plots = _plots(build_report(load_run(static_run), x_axis="env-steps"))
    svg = plots["learning-accuracy"]
    assert "env-steps (at each round" in svg
    ticks = re.findall(r'<text class="tick" x="[\d.]+" y="[\d.]+" text-anchor="middle">([^<]*)<',
                       svg)  # fmt: skip
    assert max(float(t) for t in ticks) >= ROUNDS * ENVS * LENGTH  # 80 env-steps at the end
    with pytest.raises(ValueError, match="x_axis"):
        build_report(load_run(static_run), x_axis="seconds")
