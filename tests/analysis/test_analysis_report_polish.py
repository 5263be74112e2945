"""Report polish (issue 18 item 5): bars on their ticks, full labels, prune markers,
small multiples of reward components, no ``-0``, plain wording, one round axis."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from _analysis_png import read_png
from _analysis_support import LENGTH, N_ENVS, Script, _step_events, scripted_events
from esper_analysis.cli import main
from esper_analysis.loader import load_run
from esper_analysis.report import (
    _reward_check,
    _rollbacks,
    _table,
    build_report,
)
from esper_analysis.report_charts import COMPONENT_NOTE
from esper_analysis.rewards import reward_breakdown
from esper_analysis.rollbacks import rollback_audit
from esper_analysis.svg import bar_chart, stacked_bars
from esper_analysis.svg_timeline import MARKER_COLOR
from test_analysis_report import CHROMIUM, _chromium, _hex_rgb

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run

_TICK = re.compile(r'<text class="tick" x="([\d.]+)" y="([\d.]+)" text-anchor="middle">([^<]*)<')
_PER_ROUND = ("learning-reward", "learning-accuracy", "action-rounds", "ppo-kl", "throughput")


def _plots(text: str) -> dict[str, str]:
    found = re.findall(r'(<svg class="plot" data-plot="([^"]+)".*?</svg>)', text, re.S)
    return {name: svg for svg, name in found}


def _x_ticks(svg: str) -> dict[str, float]:
    return {label: float(x) for x, _, label in _TICK.findall(svg)}


def test_stacked_columns_sit_on_their_ticks() -> None:
    svg = stacked_bars(
        "s", "t", [0.0, 1.0, 2.0], {"a": [0.5, 1, 0.2], "b": [0.5, 0, 0.8]},
        x_label="round", y_label="share",
    )  # fmt: skip
    ticks = _x_ticks(svg)
    centres = {
        round(float(x) + float(w) / 2, 1)
        for x, w in re.findall(r'<rect class="bar" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', svg)
    }
    assert {"0", "1", "2"} <= set(ticks)
    assert centres == {round(ticks[k], 1) for k in ("0", "1", "2")}


def test_long_bar_labels_are_drawn_whole() -> None:
    ops = ["WAIT", "GERMINATE", "SET_ALPHA_TARGET", "PRUNE", "FOSSILIZE", "ADVANCE"]
    svg = bar_chart("b", "t", ops, [5, 4, 3, 2, 1, 1], y_label="n")
    labels = re.findall(r'class="tick bar-label"[^>]*>([^<]*)<', svg)
    assert labels == ops  # not cut to SET_ALPHA_TA
    assert 'transform="rotate(' in svg  # rotated so they do not overlap


def test_tables_print_zero_not_minus_zero() -> None:
    html = _table(pl.DataFrame({"x": [-0.0, 1.5], "name": ["a", "b"]}))
    assert "<td>-0</td>" not in html and "<td>0</td>" in html


def test_report_marks_prunes_and_draws_components_apart(scripted_run: Path) -> None:
    text = build_report(load_run(scripted_run))
    plots = _plots(text)
    assert re.findall(r'data-marker="([^"]+)"', plots["seed-timeline"]) == ["pruned"]
    # seed A fossilized at the last step: its fossilized piece covers that step
    fossil = re.search(
        r'data-stage="FOSSILIZED" data-round="\d+" x="[\d.]+" y="\d+" width="([\d.]+)"', text
    )
    assert fossil and float(fossil.group(1)) > 20
    components = [p for p in plots if p.startswith("reward-")]
    assert "reward-total" in components and len(components) >= 5
    # One name, the CLI's and TensorBoard's, with its sign explained once.
    assert re.search(
        r'class="title" x="\d+" y="18">fossilize_bonus<', plots["reward-fossilize_bonus"]
    )
    assert "fossilize:" not in text and COMPONENT_NOTE in text


def test_wording_of_checks(scripted_run: Path) -> None:
    run = load_run(scripted_run)
    rewards = reward_breakdown(run)
    clean = dataclasses.replace(rewards, flagged_rows=0, flagged=rewards.flagged.clear())
    assert "All 24 reward rows sum to their total" in _reward_check(clean)
    audit = rollback_audit(run)
    none = dataclasses.replace(
        audit, count=0, rollbacks=audit.rollbacks.clear(), all_reached_buffer=None,
        all_reached_episode=None,
    )  # fmt: skip
    text = _rollbacks(none)
    assert "not checked" not in text and "buffer: checked" in text
    no_rewards = dataclasses.replace(none, buffer_checked=False)
    assert "buffer: not checked (no reward_computed events)" in _rollbacks(no_rewards)


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rounds 0-1 complete, round 2 stopped after 3 steps (no round_finished): failed."""
    root = tmp_path_factory.mktemp("partial")
    script = Script()
    hub = open_run(root, "partial", level=TelemetryLevel.NORMAL, flush_interval_s=0.05)
    for event in scripted_events(script):
        if not isinstance(event, ev.RunFinished):
            hub.emit(event)
    hub.emit(ev.RoundStarted(round=2, n_envs=N_ENVS, episode_length=LENGTH, entropy_coef=0, lr=0))
    for s in range(3):
        for e in range(N_ENVS):
            for event in _step_events(2, e, s, script):
                hub.emit(event)
    hub.close(RunStatus.FAILED, error="data error")
    return root / "partial"


def test_a_stopped_run_has_one_round_axis(partial_run: Path) -> None:
    plots = _plots(build_report(load_run(partial_run)))
    for name in (*_PER_ROUND, "reward-total"):
        ticks = _x_ticks(plots[name])
        assert {"0", "1", "2"} <= set(ticks), (name, sorted(ticks))
        assert max(float(t) for t in ticks) == 2, (name, sorted(ticks))


def test_analyze_report_defaults_to_the_run_directory(partial_run: Path) -> None:
    out = io.StringIO()
    assert main(["report", str(partial_run)], stdout=out, stderr=io.StringIO()) == 0
    assert (partial_run / "report.html").is_file()
    assert str(partial_run / "report.html") in out.getvalue()


@pytest.mark.browser
def test_polished_report_in_headless_chromium(partial_run: Path, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip("needs /usr/bin/chromium")
    report = tmp_path / "report.html"
    report.write_text(build_report(load_run(partial_run)))
    dom = _chromium(tmp_path, "--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-marker="pruned"' in dom.stdout
    assert len(re.findall(r'data-plot="reward-', dom.stdout)) >= 5
    assert ">-0<" not in dom.stdout
    shot = tmp_path / "report.png"
    result = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", report.as_uri())
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    pixels = read_png(shot)[..., :3].astype(np.int64)
    marker = (np.abs(pixels - _hex_rgb(MARKER_COLOR)).sum(axis=2) <= 40).sum()
    assert marker > 10, f"the prune marker is not painted ({marker} pixels)"
