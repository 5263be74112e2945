"""The seed-lifecycle timeline of the report: one lane per env and slot, one column per
round (episode), a seed's stages as bars, prunes as crosses.

Each round is drawn in its own column with a gap on both sides, so the seeds of
consecutive episodes in one slot never run together into one bar; the round number
stands under its column.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from esper_analysis.svg import (
    LEGEND_ROW,
    MARGIN_B,
    MARGIN_L,
    WIDTH,
    Frame,
    color,
    empty_plot,
    grid_line,
    svg_doc,
    text_el,
)

#: Colour and half-size of timeline markers (a cross: it reads as "removed").
MARKER_COLOR: Final = "#B00020"
_MARKER_R: Final = 4.5
#: Share of a round's column left empty on each side (the gap between episodes).
EPISODE_GAP: Final = 0.06
#: Narrowest bar drawn, in pixels (a one-step stage stays visible).
_MIN_BAR_PX: Final = 2.0
#: Width of one legend entry.
_LEGEND_ENTRY: Final = 110


@dataclass(frozen=True)
class Segment:
    """One bar of a timeline: lane index, round, start and end as fractions of the
    round's episode (0..1), category."""

    lane: int
    round: int
    start: float
    end: float
    category: str


@dataclass(frozen=True)
class Marker:
    """A point event on a timeline lane (e.g. where a seed was pruned)."""

    lane: int
    round: int
    at: float
    category: str


def episode_x(rnd: int, fraction: float) -> float:
    """Where a point ``fraction`` of the way through round ``rnd``'s episode is drawn."""
    return rnd + EPISODE_GAP + (1 - 2 * EPISODE_GAP) * fraction


def timeline(
    name: str,
    title: str,
    lanes: Sequence[str],
    segments: Sequence[Segment],
    categories: Sequence[str],
    *,
    rounds: tuple[int, int],
    x_label: str,
    width: int = WIDTH * 2,
    lane_height: int = 16,
    markers: Sequence[Marker] = (),
) -> str:
    """Horizontal bars per lane over ``rounds`` (first, last), with markers."""
    if not segments:
        return empty_plot(name, title, "no seeds germinated")
    first, last = rounds
    height = MARGIN_B + 30 + lane_height * len(lanes) + LEGEND_ROW + 4
    frame = Frame((first, last + 1), (0, len(lanes)), width=width, height=height)
    frame.x0, frame.x1 = float(first), float(last + 1)
    frame.xt = []  # round numbers are drawn under their columns instead
    frame.left = MARGIN_L + 40
    frame.bottom = frame.top + lane_height * len(lanes)
    body = frame.axes(title, x_label, "", y_ticks=False)
    for rnd in range(first, last + 2):
        body.append(grid_line(frame.px(rnd), frame.top, frame.px(rnd), frame.bottom))
    for rnd in range(first, last + 1):
        body.append(text_el("tick", frame.px(rnd + 0.5), frame.bottom + 14, str(rnd), "middle"))
    for i, lane in enumerate(lanes):
        y = frame.top + i * lane_height
        body.append(text_el("tick", frame.left - 6, y + lane_height - 4, lane, "end"))
    palette = {c: color(i) for i, c in enumerate(categories)}
    for s in segments:
        x0, x1 = frame.px(episode_x(s.round, s.start)), frame.px(episode_x(s.round, s.end))
        y = frame.top + s.lane * lane_height + 2
        body.append(
            f'<rect class="segment" data-stage="{html.escape(s.category)}" '
            f'data-round="{s.round}" x="{x0:.1f}" y="{y}" '
            f'width="{max(x1 - x0, _MIN_BAR_PX):.1f}" height="{lane_height - 4}" '
            f'fill="{palette.get(s.category, "#999")}"/>'
        )
    body += _markers(frame, markers, lane_height)
    body += _legend(frame, categories, palette, sorted({m.category for m in markers}))
    return svg_doc(name, len(segments) + len(markers), width, height, body)


def _markers(frame: Frame, markers: Sequence[Marker], lane_height: int) -> list[str]:
    r = _MARKER_R
    out = []
    for m in markers:
        cx = frame.px(episode_x(m.round, m.at))
        cy = frame.top + m.lane * lane_height + lane_height / 2
        out.append(
            f'<path class="marker" data-marker="{html.escape(m.category)}" '
            f'd="M{cx - r:.1f},{cy - r:.1f} L{cx + r:.1f},{cy + r:.1f} '
            f'M{cx - r:.1f},{cy + r:.1f} L{cx + r:.1f},{cy - r:.1f}" '
            f'stroke="{MARKER_COLOR}" stroke-width="2.2"/>'
        )
    return out


def _legend(
    frame: Frame, categories: Sequence[str], palette: dict[str, str], marks: Sequence[str]
) -> list[str]:
    y = frame.bottom + MARGIN_B - 4
    out = []
    for i, c in enumerate(categories):
        x = frame.left + i * _LEGEND_ENTRY
        out.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{palette[c]}"/>')
        out.append(f'<text class="legend" x="{x + 14}" y="{y + 9}">{html.escape(c)}</text>')
    for i, c in enumerate(marks):
        x = frame.left + (len(categories) + i) * _LEGEND_ENTRY + 5
        out.append(
            f'<path d="M{x - 4},{y + 1} L{x + 4},{y + 9} M{x - 4},{y + 9} L{x + 4},{y + 1}" '
            f'stroke="{MARKER_COLOR}" stroke-width="2.2"/>'
        )
        out.append(f'<text class="legend" x="{x + 9}" y="{y + 9}">{html.escape(c)}</text>')
    return out
