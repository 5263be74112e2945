"""Report legibility (issue 39): y tick labels clear of the rotated axis title, every chart
scaled to its data (a constant series too), legends that never cut a run's name, one
name per reward component, no stray "none" under a green verdict.

The geometry is checked where it is drawn: in headless Chromium, from the boxes the
browser lays the text out in (a test page wraps the report's charts with a script that
measures them; the report itself has no scripts).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from esper_analysis.baseline import capture_baseline, check_baseline
from esper_analysis.loader import load_run
from esper_analysis.report import _baseline, _reward_check, _rollbacks, build_report
from esper_analysis.rewards import reward_breakdown
from esper_analysis.rollbacks import rollback_audit
from esper_analysis.svg import WIDTH, Series, line_chart, stacked_bars
from test_analysis_report import _chromium

LONG_NAMES = ("digits-ppo-s0-20251127-171538", "digits-eager-s0-20251127-171538-a-long-tail")
#: Tick labels as long as a run's numbers make them (a narrow span far from zero).
TRICKY = {
    "narrow": [0.002418, 0.002428, 0.002421],
    "small": [-0.0025, -0.0005, 0.0],
    "big": [-12000.5, 250000.0, 1.0],
}
_MEASURE = """
<script>
const out = [];
for (const svg of document.querySelectorAll('svg.plot')) {
  const box = svg.getBoundingClientRect();
  const title = svg.querySelector('text.label[transform]');
  const t = title ? title.getBoundingClientRect() : null;
  for (const tick of svg.querySelectorAll('text.tick[text-anchor="end"]')) {
    const r = tick.getBoundingClientRect();
    if (t && r.left < t.right && r.top < t.bottom && r.bottom > t.top) {
      out.push(['overlap', svg.dataset.plot, tick.textContent]);
    }
    if (r.left < box.left) out.push(['cut', svg.dataset.plot, tick.textContent]);
  }
  for (const note of svg.querySelectorAll('text.note')) {
    const r = note.getBoundingClientRect();
    if (r.right > box.right || r.left < box.left) out.push(['note cut', svg.dataset.plot]);
  }
  for (const name of svg.querySelectorAll('text.legend')) {
    const r = name.getBoundingClientRect();
    if (r.right > box.right || r.bottom > box.bottom) {
      out.push(['legend cut', svg.dataset.plot, name.textContent]);
    }
  }
}
document.body.setAttribute('data-problems', JSON.stringify(out));
</script>
"""


def _charts() -> str:
    """Charts whose labels are the hard cases: long tick labels, long legend names."""
    charts = [
        line_chart(f"tricky-{k}", k, [Series(k, [0, 1, 2], v)], x_label="round", y_label="reward")
        for k, v in TRICKY.items()
    ]
    charts += [
        line_chart(
            f"tricky-small-{k}",
            k,
            [Series(k, [0, 1, 2], v)],
            x_label="round",
            y_label="mean per step",
            width=272,
            height=150,
        )
        for k, v in TRICKY.items()
    ]
    flat = [0.002418, 0.002428, 0.002421]  # a nearly constant component: a note says so
    charts += [
        line_chart(f"flat-{z}", "terminal", [Series("t", [0, 1, 2], flat)], x_label="round",
                   y_label="mean per step", width=272, height=150, zero_based=z)
        for z in (True, False)
    ]  # fmt: skip
    two = [Series(n, [0, 1, 2], [0.1 * i, 0.2, 0.3]) for i, n in enumerate(LONG_NAMES)]
    charts.append(line_chart("long-legend", "t", two, x_label="round", y_label="reward"))
    ops = {n: [0.5, 0.5, 0.5] for n in ("WAIT", "SET_ALPHA_TARGET", "FOSSILIZE")}
    charts.append(stacked_bars("ops", "t", [0, 1, 2], ops, x_label="round", y_label="share"))
    return "".join(charts)


@pytest.mark.browser
def test_no_tick_label_overlaps_the_axis_title_and_no_legend_is_cut(
    scripted_run: Path, tmp_path: Path
) -> None:
    page = build_report(load_run(scripted_run)).replace(
        "</body>", f"<div class='row'>{_charts()}</div>{_MEASURE}</body>"
    )
    target = tmp_path / "page.html"
    target.write_text(page)
    dom = _chromium(tmp_path, "--dump-dom", "--window-size=1280,4000", target.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'data-problems="([^"]*)"', dom.stdout)
    assert found, "the measuring script did not run"
    problems = json.loads(found.group(1).replace("&quot;", '"'))
    assert problems == []
    assert len(re.findall(r'<svg class="plot"', dom.stdout)) > 10


def _y_ticks(svg: str) -> list[tuple[float, float]]:
    """(value, pixel y) of each y tick label."""
    found = re.findall(
        r'<text class="tick" x="[\d.]+" y="([\d.]+)" text-anchor="end">([^<]*)<', svg
    )
    return [(float(label), float(y) - 4) for y, label in found]


def test_a_constant_series_is_drawn_on_an_axis_around_its_value() -> None:
    """germinate_cost is -0.01 at every step: on a -0.2..1 axis it looked like 0."""
    svg = line_chart("c", "germinate_cost", [Series("c", [0, 1, 2], [-0.01] * 3)],
                     x_label="round", y_label="mean per step")  # fmt: skip
    ticks = _y_ticks(svg)
    values = [v for v, _ in ticks]
    assert min(values) <= -0.01 <= max(values) and max(values) - min(values) <= 0.02
    assert max(values) < 0  # zero is not even on the axis: the line cannot read as zero
    path = re.search(r'd="M[\d.]+,([\d.]+)', svg)
    assert path is not None
    top, bottom = min(y for _, y in ticks), max(y for _, y in ticks)
    assert top < float(path.group(1)) < bottom
    zero = line_chart("z", "z", [Series("z", [0, 1], [0.0, 0.0])], x_label="r", y_label="v")
    assert {v for v, _ in _y_ticks(zero)} >= {-1.0, 0.0, 1.0}


def test_long_run_names_go_in_rows_under_the_plot() -> None:
    two = [Series(n, [0, 1], [0.0, 1.0 + i]) for i, n in enumerate(LONG_NAMES)]
    svg = line_chart("l", "t", two, x_label="round", y_label="reward")
    names = re.findall(r'<text class="legend" x="([\d.]+)" y="([\d.]+)">([^<]*)<', svg)
    assert [n for _, _, n in names] == list(reversed(LONG_NAMES))  # by last value
    height = float(re.search(r'height="(\d+)"', svg).group(1))  # type: ignore[union-attr]
    assert all(float(y) < height for _, y, _ in names)
    # Whole within the chart's width (at a generous 7 px per character).
    assert all(float(x) + 7 * len(n) <= WIDTH for x, _, n in names)
    short = line_chart(
        "s", "t", [Series(n, [0, 1], [0, 1]) for n in "ab"], x_label="r", y_label="v"
    )
    assert 'height="260"' in short  # short names stay beside the plot


def test_green_verdicts_have_no_stray_none(scripted_run: Path) -> None:
    run = load_run(scripted_run)
    rewards = reward_breakdown(run)
    clean = dataclasses.replace(rewards, flagged_rows=0, flagged=rewards.flagged.clear())
    audit = rollback_audit(run)
    quiet = dataclasses.replace(
        audit, count=0, rollbacks=audit.rollbacks.clear(), all_reached_buffer=None,
        all_reached_episode=None,
    )  # fmt: skip
    matched = check_baseline(run, capture_baseline(run))
    for text in (_reward_check(clean), _rollbacks(quiet), _baseline(matched, "b.json")):
        assert "none</p>" not in text, text
    assert "<table" in _rollbacks(audit)  # a run with rollbacks lists them


def test_report_tables_carry_the_legend_of_their_missing_values(scripted_run: Path) -> None:
    from esper_analysis.lifecycles import seed_lifecycles
    from esper_analysis.tables import COLUMN_LEGENDS

    run = load_run(scripted_run)
    by_blueprint = seed_lifecycles(run).by_blueprint
    text = build_report(run)
    shown = []
    for column in ("mean_contribution_pp", "mean_contribution_fossilized_pp"):
        missing = bool(by_blueprint[column].null_count() or by_blueprint[column].is_nan().any())
        assert (COLUMN_LEGENDS[column] in text) == missing, column
        shown.append(missing)
    assert any(shown)  # the scripted run has a blueprint with no fossilized seed
