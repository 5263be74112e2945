"""The HTML report: self-contained, every section present, plots drawn in a real browser."""

from __future__ import annotations

import io
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from _analysis_png import read_png
from _analysis_support import ROUNDS
from conftest import Crashed
from esper_analysis.baseline import capture_baseline
from esper_analysis.cli import main
from esper_analysis.loader import load_run
from esper_analysis.report import build_report, write_report
from esper_analysis.svg import PALETTE

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
WINDOW = (1280, 2000)
PLOTS = (
    "learning-reward",
    "learning-accuracy",
    "reward-components",
    "seed-timeline",
    "action-totals",
    "action-rounds",
    "ppo-entropy",
    "ppo-kl",
    "throughput",
)
SECTIONS = (
    "Learning curve",
    "Reward components over time",
    "Seed lifecycles",
    "Action distribution",
    "Rollbacks",
    "Event counts",
    "Baseline status",
)


def _plot_points(text: str) -> dict[str, int]:
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r'data-plot="([^"]+)" data-points="(\d+)"', text)
    }


def test_report_is_self_contained_with_every_section(scripted_run: Path) -> None:
    run = load_run(scripted_run)
    text = build_report(run, baseline=capture_baseline(run), baseline_source="b.json")
    for forbidden in ("http:", "https:", "<script", "<link", "src=", "@import", "url("):
        assert forbidden not in text, forbidden
    for section in SECTIONS:
        assert f"<h2>{section}</h2>" in text
    points = _plot_points(text)
    assert set(PLOTS) <= set(points)
    assert points["learning-reward"] == ROUNDS
    assert points["seed-timeline"] == 11  # A: 5 stages, B: 2, C: 2, D: 1; B's prune marker
    assert all(points[p] > 0 for p in PLOTS), points
    assert "matches baseline" in text
    assert "1 of 24 reward rows differ from the sum of their components" in text


def test_report_of_a_crashed_run_says_it_is_partial(crashed: Crashed, tmp_path: Path) -> None:
    out = write_report(load_run(crashed.path), tmp_path / "crashed.html")
    text = out.read_text()
    assert "Partial run." in text and "recovered" in text
    assert "no baseline given" in text


def test_cli_report_with_baseline(scripted_run: Path, tmp_path: Path) -> None:
    baseline = tmp_path / "b.json"
    assert (
        main(["baseline", "capture", str(scripted_run), "-o", str(baseline)], stdout=io.StringIO())
        == 0
    )
    out = tmp_path / "report.html"
    err = io.StringIO()
    code = main(
        ["report", str(scripted_run), "-o", str(out), "--baseline", str(baseline)],
        stdout=io.StringIO(),
        stderr=err,
    )
    assert code == 0, err.getvalue()
    assert "matches baseline" in out.read_text()


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "chromium-profile"
    cmd = [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    env = {**os.environ, "HOME": str(tmp_path)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)


def _hex_rgb(color: str) -> np.ndarray:
    return np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)])


@pytest.mark.browser
def test_report_renders_with_plots_in_headless_chromium(scripted_run: Path, tmp_path: Path) -> None:
    report = write_report(load_run(scripted_run), tmp_path / "report.html")
    url = report.as_uri()
    dom = _chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    points = _plot_points(dom.stdout)
    assert set(PLOTS) <= set(points)
    paths = re.findall(r'<path class="series" data-series="[^"]*" d="([^"]*)"', dom.stdout)
    assert paths and all(re.fullmatch(r"M[\d.]+,[\d.]+( L[\d.]+,[\d.]+)*", d) for d in paths)
    segments = len(re.findall(r'class="segment"', dom.stdout))
    markers = re.findall(r'class="marker" data-marker="([^"]+)"', dom.stdout)
    assert (segments, markers) == (points["seed-timeline"] - 1, ["pruned"])
    shot = tmp_path / "report.png"
    result = _chromium(
        tmp_path, f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", url
    )
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    pixels = read_png(shot)[..., :3].astype(np.int64)
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    non_white = (pixels < 245).any(axis=2)
    assert non_white.mean() > 0.02, "screenshot is (nearly) blank"
    # The plot colours (series, bars, timeline stages) must actually be painted.
    for color in PALETTE[:5]:
        close = (np.abs(pixels - _hex_rgb(color)).sum(axis=2) <= 30).sum()
        assert close > 50, f"colour {color} is not drawn ({close} pixels)"
    top = pixels[: WINDOW[1] // 3]
    assert top.std() > 10, "the top third (learning curve) shows no variation"


def test_integer_axes_get_whole_number_ticks() -> None:
    from esper_analysis.svg import nice_ticks

    assert nice_ticks(0, 2, integer=True) == [0, 1, 2]
    assert all(float(t).is_integer() for t in nice_ticks(0, 29, integer=True))
    assert 0.5 in nice_ticks(0, 2)  # continuous axes keep fine ticks
