"""A small inline-SVG plotting kit for the HTML report (no JS, no network, no deps).

Charts are strings of ``<svg>`` markup to embed directly in HTML. Each carries
``class="plot"``, a ``data-plot`` name and ``data-points`` (points actually drawn), so
a test can check in a browser that real data was plotted. Long series are reduced to
at most :data:`MAX_POINTS` bucket means; non-finite values break a line rather than
being drawn as zeros.
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

MAX_POINTS: Final = 600
WIDTH: Final = 560
HEIGHT: Final = 260
_MARGIN_L, _MARGIN_R, _MARGIN_T, _MARGIN_B = 58, 16, 30, 40
_TICKS: Final = 5
_LEGEND_ROW: Final = 14
#: Extra right margin that holds a legend beside the plot area (at least this wide, at
#: most :data:`_LEGEND_MAX_SHARE` of the chart: longer names go in rows under the plot).
_LEGEND_W: Final = 130
_LEGEND_MAX_SHARE: Final = 0.4
#: A legend entry: colour swatch and gap before its name, and space after it.
_LEGEND_SWATCH: Final = 24
#: Room left of the y tick labels for the rotated axis title (centred at x = 12).
_Y_TITLE_ROOM: Final = 22
#: Gap between a y tick label and the plot area.
_TICK_GAP: Final = 6
#: A constant series is drawn on an axis this fraction of its value above and below it
#: (a zero series on +-1), so a flat line reads as its value, not as zero.
_FLAT_PAD: Final = 0.5
#: Share of its slot a bar fills (the rest is the gap between bars).
_BAR_FILL: Final = 0.9
#: Bar labels longer than fit their slot are drawn at this angle, with this much more
#: room under the axis, in full (a label cut to ``SET_ALPHA_TA`` says nothing).
_LABEL_ANGLE: Final = -35
_ROTATED_ROOM: Final = 60
_CHAR_PX: Final = 6.5
#: Colour-blind-friendly categorical palette (Okabe-Ito, then greys).
PALETTE: Final = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#999999",
    "#7F3C8D",
    "#882255",
    "#332288",
)


@dataclass(frozen=True)
class Series:
    name: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str = ""


@dataclass(frozen=True)
class Segment:
    """One bar of a timeline: lane index, start and end on the x axis, category."""

    lane: int
    x0: float
    x1: float
    category: str


@dataclass(frozen=True)
class Marker:
    """A point event on a timeline lane (e.g. where a seed was pruned)."""

    lane: int
    x: float
    category: str


#: Colour and half-size of timeline markers (a cross: it reads as "removed").
MARKER_COLOR: Final = "#B00020"
_MARKER_R: Final = 4.5


def _text(klass: str, x: float, y: float, text: str, anchor: str = "start") -> str:
    return (
        f'<text class="{klass}" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">'
        f"{html.escape(text)}</text>"
    )


def _grid_line(x1: float, y1: float, x2: float, y2: float) -> str:
    return f'<line class="grid" x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}"/>'


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def nice_ticks(lo: float, hi: float, n: int = _TICKS, *, integer: bool = False) -> list[float]:
    """Round tick values covering ``[lo, hi]`` (1, 2, 2.5 or 5 times a power of ten).

    ``integer`` keeps ticks on whole numbers (rounds, steps): no "round 0.5".
    """
    if not (_finite(lo) and _finite(hi)):
        return []
    if hi <= lo:  # one value: an axis around it, scaled to it
        pad = abs(lo) * _FLAT_PAD or 1.0
        lo, hi = lo - pad, lo + pad
    raw = (hi - lo) / max(1, n)
    if not (math.isfinite(raw) and raw > 0):  # a span too wide or too narrow for floats
        return []
    power = 10.0 ** math.floor(math.log10(raw))  # a float: ticks must format as floats
    if power == 0:  # subnormal span
        return []
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    if integer:
        step = max(1.0, float(math.ceil(step)))
    first = math.floor(lo / step + 1e-9)
    last = math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.1e}"
    return f"{v:.4g}"


def downsample(
    xs: Sequence[float], ys: Sequence[float], limit: int = MAX_POINTS
) -> tuple[list[float], list[float]]:
    """Bucket means down to ``limit`` points (NaN buckets stay NaN, breaking the line)."""
    n = len(xs)
    if n <= limit:
        return list(map(float, xs)), [float(y) if y is not None else math.nan for y in ys]
    out_x, out_y = [], []
    for b in range(limit):
        lo, hi = b * n // limit, (b + 1) * n // limit
        bx = [float(x) for x in xs[lo:hi]]
        by = [float(y) for y in ys[lo:hi] if _finite(y)]
        out_x.append(sum(bx) / len(bx))
        out_y.append(sum(by) / len(by) if by else math.nan)
    return out_x, out_y


class _Frame:
    """Maps data coordinates to pixels and draws axes, ticks, labels and a title."""

    def __init__(
        self,
        x_range: tuple[float, float],
        y_range: tuple[float, float],
        *,
        width: int,
        height: int,
        legend: int = 0,
        integer_x: bool = False,
    ) -> None:
        """``legend``: the width of a legend beside the plot area (0: none there)."""
        self.width, self.height = width, height
        self.xt = nice_ticks(*x_range, integer=integer_x)
        self.yt = nice_ticks(*y_range)
        self.x0, self.x1 = (self.xt[0], self.xt[-1]) if len(self.xt) > 1 else x_range
        self.y0, self.y1 = (self.yt[0], self.yt[-1]) if len(self.yt) > 1 else y_range
        if not self.x1 > self.x0:  # one value, or a span floats cannot resolve
            self.x1 = self.x0 + max(1.0, abs(self.x0))
        if not self.y1 > self.y0:
            self.y1 = self.y0 + max(1.0, abs(self.y0))
        # The y tick labels stand between the rotated axis title and the plot area.
        widest = max((_text_px(fmt(t)) for t in self.yt), default=0.0)
        self.left = max(_MARGIN_L, math.ceil(_Y_TITLE_ROOM + widest + _TICK_GAP))
        self.right = width - _MARGIN_R - legend
        self.top, self.bottom = _MARGIN_T, height - _MARGIN_B

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def py(self, y: float) -> float:
        return self.bottom - (y - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)

    def axes(self, title: str, x_label: str, y_label: str, *, y_ticks: bool = True) -> list[str]:
        out = [
            f'<text class="title" x="{self.left}" y="18">{html.escape(title)}</text>',
            f'<rect class="area" x="{self.left}" y="{self.top}" width="{self.right - self.left}" '
            f'height="{self.bottom - self.top}"/>',
        ]
        for t in self.xt:
            x = self.px(t)
            out.append(_grid_line(x, self.top, x, self.bottom))
            out.append(_text("tick", x, self.bottom + 14, fmt(t), "middle"))
        if y_ticks:
            for t in self.yt:
                y = self.py(t)
                out.append(_grid_line(self.left, y, self.right, y))
                out.append(_text("tick", self.left - _TICK_GAP, y + 4, fmt(t), "end"))
        out.append(
            f'<text class="label" x="{(self.left + self.right) / 2:.0f}" y="{self.bottom + 32}" '
            f'text-anchor="middle">{html.escape(x_label)}</text>'
        )
        mid = (self.top + self.bottom) / 2
        out.append(
            f'<text class="label" transform="translate(12,{mid:.0f}) rotate(-90)" '
            f'text-anchor="middle">{html.escape(y_label)}</text>'
        )
        return out


def _svg(name: str, points: int, width: int, height: int, body: list[str]) -> str:
    return (
        f'<svg class="plot" data-plot="{html.escape(name)}" data-points="{points}" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
        + "".join(body)
        + "</svg>"
    )


def empty_plot(name: str, title: str, message: str, *, width: int = WIDTH, height: int = 80) -> str:
    body = [
        f'<text class="title" x="{_MARGIN_L}" y="18">{html.escape(title)}</text>',
        f'<text class="empty" x="{_MARGIN_L}" y="48">{html.escape(message)}</text>',
    ]
    return _svg(name, 0, width, height, body)


def _text_px(text: str) -> float:
    """Approximate width of a tick or legend label (10 px sans-serif)."""
    return len(text) * _CHAR_PX


def legend_width(names: Sequence[str], width: int) -> int:
    """The right margin a legend of ``names`` needs beside the plot; 0 when a name is too
    long for :data:`_LEGEND_MAX_SHARE` of the chart (the legend then goes under it)."""
    need = max(_LEGEND_W, math.ceil(max(map(_text_px, names), default=0.0) + _LEGEND_SWATCH))
    return need if need <= width * _LEGEND_MAX_SHARE else 0


def legend_rows(names: Sequence[str], legend_w: int) -> int:
    """Extra chart height for a legend under the plot (none beside it)."""
    return 0 if legend_w else len(names) * _LEGEND_ROW + 4


def _legend(names: Sequence[str], colors: Sequence[str], frame: _Frame) -> list[str]:
    """Beside the plot area when it has a legend margin, else in rows under the x axis
    title, so no name is cut at the chart's edge."""
    beside = frame.width - _MARGIN_R > frame.right
    out = []
    for i, (name, c) in enumerate(zip(names, colors, strict=True)):
        if beside:
            x, y = frame.right + 10, frame.top + 4 + i * _LEGEND_ROW
        else:
            x, y = frame.left, frame.bottom + _MARGIN_B + i * _LEGEND_ROW
        out.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{c}"/>')
        out.append(f'<text class="legend" x="{x + 14}" y="{y + 9}">{html.escape(name)}</text>')
    return out


def line_chart(
    name: str,
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    width: int = WIDTH,
    height: int = HEIGHT,
    x_range: tuple[float, float] | None = None,
) -> str:
    """Lines (one path per series, broken at non-finite values) with a legend.

    ``x_range`` widens the x axis to at least that span, so charts of one run share
    their round axis even where a series stops early (a crashed run's last round).
    """
    drawn = [(s, *downsample(s.xs, s.ys)) for s in series if len(s.xs)]
    values = [(x, y) for _, xs, ys in drawn for x, y in zip(xs, ys, strict=True) if _finite(y)]
    if not values:
        return empty_plot(name, title, "no data")
    xs_all = [v[0] for v in values] + (list(x_range) if x_range else [])
    ys_all = [v[1] for v in values]
    names = [s.name for s, _, _ in drawn] if len(drawn) > 1 else []
    legend_w = legend_width(names, width) if names else 0
    height += legend_rows(names, legend_w) if names else 0
    frame = _Frame(
        (min(xs_all), max(xs_all)),
        (min(ys_all), max(ys_all)),
        width=width,
        height=height,
        legend=legend_w,
        integer_x=all(float(x).is_integer() for x in xs_all),
    )
    frame.bottom -= legend_rows(names, legend_w) if names else 0
    body = frame.axes(title, x_label, y_label)
    colors = []
    for i, (s, xs, ys) in enumerate(drawn):
        c = s.color or color(i)
        colors.append(c)
        cmds, pen_down = [], False
        for x, y in zip(xs, ys, strict=True):
            if not _finite(y):
                pen_down = False
                continue
            cmds.append(f"{'L' if pen_down else 'M'}{frame.px(x):.1f},{frame.py(y):.1f}")
            pen_down = True
        body.append(
            f'<path class="series" data-series="{html.escape(s.name)}" d="{" ".join(cmds)}" '
            f'stroke="{c}" fill="none"/>'
        )
        if len(cmds) == 1:
            cx, cy = cmds[0][1:].split(",")
            body.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{c}"/>')
    if names:
        body += _legend(names, colors, frame)
    return _svg(name, len(values), width, height, body)


def bar_chart(
    name: str,
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    *,
    y_label: str,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """Vertical bars, one per label, coloured by position."""
    pairs = [(lab, float(v)) for lab, v in zip(labels, values, strict=True) if _finite(v)]
    if not pairs:
        return empty_plot(name, title, "no data")
    top = max(0.0, *(v for _, v in pairs))
    low = min(0.0, *(v for _, v in pairs))
    frame = _Frame((0, len(pairs)), (low, top), width=width, height=height)
    frame.xt = []
    slot = (frame.right - frame.left) / len(pairs)
    rotate = any(len(label) * _CHAR_PX > slot for label, _ in pairs)
    if rotate:
        frame.bottom -= _ROTATED_ROOM
    body = frame.axes(title, "", y_label)
    for i, (label, v) in enumerate(pairs):
        x = frame.left + i * slot + slot * 0.15
        y0, y1 = sorted((frame.py(0), frame.py(v)))
        body.append(
            f'<rect class="bar" x="{x:.1f}" y="{y0:.1f}" width="{slot * 0.7:.1f}" '
            f'height="{max(y1 - y0, 1):.1f}" fill="{color(i)}">'
            f"<title>{html.escape(label)}: {fmt(v)}</title></rect>"
        )
        cx, ly = x + slot * 0.35, frame.bottom + 14
        turn = f' transform="rotate({_LABEL_ANGLE} {cx:.1f} {ly})"' if rotate else ""
        body.append(
            f'<text class="tick bar-label" x="{cx:.1f}" y="{ly}" '
            f'text-anchor="{"end" if rotate else "middle"}"{turn}>{html.escape(label)}</text>'
        )
    return _svg(name, len(pairs), width, height, body)


def stacked_bars(
    name: str,
    title: str,
    xs: Sequence[float],
    stacks: Mapping[str, Sequence[float]],
    *,
    x_label: str,
    y_label: str,
    width: int = WIDTH,
    height: int = HEIGHT,
    x_range: tuple[float, float] | None = None,
) -> str:
    """Stacked columns centred on each x (e.g. op shares per round), with a legend.

    The axis runs half a column beyond the first and last x, so every column sits
    over its tick; ``x_range`` widens it as in :func:`line_chart`.
    """
    if not xs or not stacks:
        return empty_plot(name, title, "no data")
    totals = [sum(float(stacks[k][i]) for k in stacks) for i in range(len(xs))]
    step = min((b - a for a, b in itertools.pairwise(xs)), default=1.0) or 1.0
    lo, hi = min(xs), max(xs)
    if x_range is not None:
        lo, hi = min(lo, x_range[0]), max(hi, x_range[1])
    names = list(stacks)
    legend_w = legend_width(names, width)
    height += legend_rows(names, legend_w)
    frame = _Frame(
        (lo - step / 2, hi + step / 2),
        (0.0, max(totals) or 1.0),
        width=width,
        height=height,
        legend=legend_w,
        integer_x=all(float(x).is_integer() for x in xs),
    )
    frame.bottom -= legend_rows(names, legend_w)
    frame.x0, frame.x1 = lo - step / 2, hi + step / 2  # not the rounded ticks' span
    frame.xt = [t for t in frame.xt if frame.x0 <= t <= frame.x1]
    body = frame.axes(title, x_label, y_label)
    bar_w = max((frame.px(xs[0] + step) - frame.px(xs[0])) * _BAR_FILL, 1.0)
    drawn = 0
    for i, x in enumerate(xs):
        base = 0.0
        for j, key in enumerate(stacks):
            v = float(stacks[key][i])
            if v <= 0:
                continue
            y_top, y_bot = frame.py(base + v), frame.py(base)
            body.append(
                f'<rect class="bar" x="{frame.px(x) - bar_w / 2:.1f}" y="{y_top:.1f}" '
                f'width="{bar_w:.1f}" '
                f'height="{max(y_bot - y_top, 0.5):.1f}" fill="{color(j)}"/>'
            )
            base += v
            drawn += 1
    body += _legend(names, [color(j) for j in range(len(stacks))], frame)
    return _svg(name, drawn, width, height, body)


def timeline(
    name: str,
    title: str,
    lanes: Sequence[str],
    segments: Sequence[Segment],
    categories: Sequence[str],
    *,
    x_label: str,
    width: int = WIDTH * 2,
    lane_height: int = 16,
    markers: Sequence[Marker] = (),
) -> str:
    """Horizontal bars per lane (e.g. a seed's stages per env and slot), with markers."""
    if not segments:
        return empty_plot(name, title, "no seeds germinated")
    height = _MARGIN_T + _MARGIN_B + lane_height * len(lanes) + _LEGEND_ROW + 4
    lo = min([s.x0 for s in segments] + [m.x for m in markers])
    hi = max([s.x1 for s in segments] + [m.x for m in markers])
    frame = _Frame((lo, hi), (0, len(lanes)), width=width, height=height)
    frame.left = _MARGIN_L + 40
    frame.bottom = frame.top + lane_height * len(lanes)
    body = frame.axes(title, x_label, "", y_ticks=False)
    for i, lane in enumerate(lanes):
        y = frame.top + i * lane_height
        body.append(_text("tick", frame.left - 6, y + lane_height - 4, lane, "end"))
    palette = {c: color(i) for i, c in enumerate(categories)}
    min_w = 2.0
    for s in segments:
        x0, x1 = frame.px(s.x0), frame.px(s.x1)
        y = frame.top + s.lane * lane_height + 2
        body.append(
            f'<rect class="segment" data-stage="{html.escape(s.category)}" x="{x0:.1f}" y="{y}" '
            f'width="{max(x1 - x0, min_w):.1f}" height="{lane_height - 4}" '
            f'fill="{palette.get(s.category, "#999")}"/>'
        )
    r = _MARKER_R
    for m in markers:
        cx, cy = frame.px(m.x), frame.top + m.lane * lane_height + lane_height / 2
        body.append(
            f'<path class="marker" data-marker="{html.escape(m.category)}" '
            f'd="M{cx - r:.1f},{cy - r:.1f} L{cx + r:.1f},{cy + r:.1f} '
            f'M{cx - r:.1f},{cy + r:.1f} L{cx + r:.1f},{cy - r:.1f}" '
            f'stroke="{MARKER_COLOR}" stroke-width="2.2"/>'
        )
    y = frame.bottom + _MARGIN_B - 4
    for i, c in enumerate(categories):
        x = frame.left + i * 110
        body.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{palette[c]}"/>')
        body.append(f'<text class="legend" x="{x + 14}" y="{y + 9}">{html.escape(c)}</text>')
    for i, c in enumerate(sorted({m.category for m in markers})):
        x = frame.left + (len(categories) + i) * 110 + 5
        body.append(
            f'<path d="M{x - 4},{y + 1} L{x + 4},{y + 9} M{x - 4},{y + 9} L{x + 4},{y + 1}" '
            f'stroke="{MARKER_COLOR}" stroke-width="2.2"/>'
        )
        body.append(f'<text class="legend" x="{x + 9}" y="{y + 9}">{html.escape(c)}</text>')
    return _svg(name, len(segments) + len(markers), width, height, body)
