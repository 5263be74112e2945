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
MARGIN_L, _MARGIN_R, _MARGIN_T, MARGIN_B = 58, 16, 30, 40
_TICKS: Final = 5
LEGEND_ROW: Final = 14
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
    """A line; ``low``/``high`` (optional, same length) draw a band around it."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str = ""
    low: Sequence[float] | None = None
    high: Sequence[float] | None = None


def text_el(klass: str, x: float, y: float, text: str, anchor: str = "start") -> str:
    return (
        f'<text class="{klass}" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">'
        f"{html.escape(text)}</text>"
    )


def grid_line(x1: float, y1: float, x2: float, y2: float) -> str:
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
    if abs(v) >= 1e6 or abs(v) < 1e-3:
        return f"{v:.1e}"
    if abs(v) >= 1e4:
        return f"{v:.0f}"  # 25000, not 2.5e+04
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


class Frame:
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
        self.left = max(MARGIN_L, math.ceil(_Y_TITLE_ROOM + widest + _TICK_GAP))
        self.right = width - _MARGIN_R - legend
        self.top, self.bottom = _MARGIN_T, height - MARGIN_B

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
            out.append(grid_line(x, self.top, x, self.bottom))
            out.append(text_el("tick", x, self.bottom + 14, fmt(t), "middle"))
        if y_ticks:
            for t in self.yt:
                y = self.py(t)
                out.append(grid_line(self.left, y, self.right, y))
                out.append(text_el("tick", self.left - _TICK_GAP, y + 4, fmt(t), "end"))
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


def svg_doc(name: str, points: int, width: int, height: int, body: list[str]) -> str:
    return (
        f'<svg class="plot" data-plot="{html.escape(name)}" data-points="{points}" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
        + "".join(body)
        + "</svg>"
    )


def empty_plot(name: str, title: str, message: str, *, width: int = WIDTH, height: int = 80) -> str:
    body = [
        f'<text class="title" x="{MARGIN_L}" y="18">{html.escape(title)}</text>',
        f'<text class="empty" x="{MARGIN_L}" y="48">{html.escape(message)}</text>',
    ]
    return svg_doc(name, 0, width, height, body)


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
    return 0 if legend_w else len(names) * LEGEND_ROW + 4


def _legend(names: Sequence[str], colors: Sequence[str], frame: Frame) -> list[str]:
    """Beside the plot area when it has a legend margin, else in rows under the x axis
    title, so no name is cut at the chart's edge."""
    beside = frame.width - _MARGIN_R > frame.right
    out = []
    for i, (name, c) in enumerate(zip(names, colors, strict=True)):
        if beside:
            x, y = frame.right + 10, frame.top + 4 + i * LEGEND_ROW
        else:
            x, y = frame.left, frame.bottom + MARGIN_B + i * LEGEND_ROW
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
    zero_based: bool = False,
) -> str:
    """Lines (one path per series, broken at non-finite values), their bands, a legend.

    ``zero_based``: the values read against zero (a reward): a level far from zero that
    varies little is drawn on an axis down to zero, so noise does not fill the chart.

    ``x_range`` widens the x axis to at least that span, so charts of one run share
    their round axis even where a series stops early (a crashed run's last round).
    Several series are told apart by dash and marker as well as colour (a curve hidden
    under an identical one still shows through its gaps, and the legend names the
    twin); the legend lists them top to bottom by their last value.
    """
    drawn = [_Drawn(i, s, *downsample(s.xs, s.ys)) for i, s in enumerate(series) if len(s.xs)]
    values = [(x, y) for d in drawn for x, y in zip(d.xs, d.ys, strict=True) if _finite(y)]
    if not values:
        return empty_plot(name, title, "no data")
    xs_all = [v[0] for v in values] + (list(x_range) if x_range else [])
    ys_all = [v[1] for v in values] + [y for d in drawn for y in d.band_values()]
    several = len(drawn) > 1
    order = sorted(drawn, key=_last_value, reverse=True) if several else []
    names = [_legend_name(d, drawn) for d in order]
    legend_w = legend_width(names, width) if names else 0
    height += legend_rows(names, legend_w) if names else 0
    lo, hi, note = honest_range(min(ys_all), max(ys_all), zero_based=zero_based)
    frame = Frame(
        (min(xs_all), max(xs_all)),
        (lo, hi),
        width=width,
        height=height,
        legend=legend_w,
        integer_x=all(float(x).is_integer() for x in xs_all),
    )
    frame.bottom -= legend_rows(names, legend_w) if names else 0
    body = frame.axes(title, x_label, y_label)
    if note:  # where the line is not: under it when it runs along the top
        low_note = lo >= 0 and hi > 0 and frame.py(min(v for _, v in values)) < frame.top + 20
        y = frame.bottom - 6 if low_note else frame.top + 12
        body.append(text_el("note", frame.left + 6, y, note))
    twins = {d.index for d in drawn if _twin_of(d, drawn) is not None}
    for d in drawn:
        if d.index not in twins:  # an identical band drawn twice only darkens it
            body += _band(d, frame)
    for d in drawn:
        body += _line(d, frame, styled=several)
    if names:
        body += _line_legend(order, names, frame)
    return svg_doc(name, len(values), width, height, body)


#: Dash patterns and point markers of the 1st, 2nd, ... series of a chart.
DASHES: Final = ("", "7 3", "2 3", "9 3 2 3", "4 4")
MARKERS: Final = ("circle", "square", "triangle", "diamond", "cross")
#: Markers drawn per series at most (evenly spaced; each series starts at its own offset).
_MARKS_PER_SERIES: Final = 12
_MARK_R: Final = 3.0
#: Band fill opacity: the line over it stays readable.
_BAND_OPACITY: Final = 0.16
#: A series whose values spread less than this share of their magnitude is nearly
#: constant: its axis spans at least :data:`_MIN_SPAN_SHARE` of the magnitude, so noise
#: in the 4th digit is not stretched into a V over the whole height.
NEAR_CONSTANT: Final = 0.01
_MIN_SPAN_SHARE: Final = 0.1
#: A zero-based series (a reward) varying less than this share of its level is drawn
#: from zero: a static host's reward of 0.0483-0.0486 is flat, not a V.
SMALL_VARIATION: Final = 0.2


@dataclass(frozen=True)
class _Drawn:
    index: int
    series: Series
    xs: list[float]
    ys: list[float]

    @property
    def color(self) -> str:
        return self.series.color or color(self.index)

    def band(self) -> tuple[list[float], list[float]] | None:
        s = self.series
        if s.low is None or s.high is None:
            return None
        return downsample(s.xs, s.low)[1], downsample(s.xs, s.high)[1]

    def band_values(self) -> list[float]:
        band = self.band()
        return [] if band is None else [v for vs in band for v in vs if _finite(v)]


def honest_range(lo: float, hi: float, *, zero_based: bool = False) -> tuple[float, float, str]:
    """The y range to draw and a note: a constant series says so; a level far from zero
    that varies by less than :data:`SMALL_VARIATION` of itself is drawn from zero when
    ``zero_based``, else a nearly constant one (:data:`NEAR_CONSTANT`) gets an axis of
    at least a tenth of its magnitude; both say by how much they vary."""
    magnitude = max(abs(lo), abs(hi))
    if hi == lo:
        return lo, hi, f"constant: {fmt(lo)}"
    share = (hi - lo) / magnitude if magnitude > 0 else math.inf
    varies = f"varies {share * 100:.2g} %: {fmt(lo)} to {fmt(hi)}"
    if zero_based and lo * hi > 0 and share < SMALL_VARIATION:
        return min(lo, 0.0), max(hi, 0.0), varies
    if share < NEAR_CONSTANT:
        mid, half = (lo + hi) / 2, _MIN_SPAN_SHARE * magnitude / 2
        return mid - half, mid + half, varies
    return lo, hi, ""


def _last_value(d: _Drawn) -> float:
    finite = [y for y in d.ys if _finite(y)]
    return finite[-1] if finite else -math.inf


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(
        x == y or not (_finite(x) or _finite(y)) for x, y in zip(a, b, strict=True)
    )


def _line_twin(d: _Drawn, drawn: Sequence[_Drawn]) -> _Drawn | None:
    """The first earlier series whose line ``d``'s line lies on exactly."""
    for other in drawn:
        if other.index >= d.index:
            break
        if _same(other.xs, d.xs) and _same(other.ys, d.ys):
            return other
    return None


def _twin_of(d: _Drawn, drawn: Sequence[_Drawn]) -> _Drawn | None:
    """An earlier series with the same line and the same band as ``d``."""
    twin = _line_twin(d, drawn)
    if twin is None:
        return None
    a, b = twin.band(), d.band()
    if a is None or b is None:
        return twin if a is b else None
    return twin if _same(a[0], b[0]) and _same(a[1], b[1]) else None


def _legend_name(d: _Drawn, drawn: Sequence[_Drawn]) -> str:
    """The series' name, and the earlier series its line coincides with."""
    twin = _line_twin(d, drawn)
    return d.series.name if twin is None else f"{d.series.name} (= {twin.series.name})"


def _band(d: _Drawn, frame: Frame) -> list[str]:
    """The series' band (low to high) as filled polygons, one per finite stretch."""
    band = d.band()
    if band is None:
        return []
    out, run = [], []
    for x, lo, hi in [*zip(d.xs, *band, strict=True), (math.nan, math.nan, math.nan)]:
        if _finite(lo) and _finite(hi) and _finite(x):
            run.append((frame.px(x), frame.py(lo), frame.py(hi)))
            continue
        if len(run) > 1:
            top = " L".join(f"{x:.1f},{y:.1f}" for x, _, y in run)
            bottom = " L".join(f"{x:.1f},{y:.1f}" for x, y, _ in reversed(run))
            out.append(
                f'<path class="band" data-series="{html.escape(d.series.name)}" '
                f'd="M{top} L{bottom} Z" fill="{d.color}" fill-opacity="{_BAND_OPACITY}" '
                'stroke="none"/>'
            )
        run = []
    return out


def _line(d: _Drawn, frame: Frame, *, styled: bool) -> list[str]:
    cmds, points, pen_down = [], [], False
    for x, y in zip(d.xs, d.ys, strict=True):
        if not _finite(y):
            pen_down = False
            continue
        px, py = frame.px(x), frame.py(y)
        cmds.append(f"{'L' if pen_down else 'M'}{px:.1f},{py:.1f}")
        points.append((px, py))
        pen_down = True
    dash = DASHES[d.index % len(DASHES)] if styled else ""
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    out = [
        f'<path class="series" data-series="{html.escape(d.series.name)}" d="{" ".join(cmds)}" '
        f'stroke="{d.color}" fill="none"{dash_attr}/>'
    ]
    if styled:
        step = max(1, math.ceil(len(points) / _MARKS_PER_SERIES))
        chosen = points[(d.index * step // len(DASHES)) % step :: step] or points[:1]
        out += [marker(MARKERS[d.index % len(MARKERS)], px, py, d.color) for px, py in chosen]
    elif len(points) == 1:
        out.append(marker("circle", *points[0], d.color))
    return out


def marker(kind: str, x: float, y: float, fill: str, r: float = _MARK_R) -> str:
    """One point marker (circle, square, triangle, diamond or cross) centred on (x, y)."""
    if kind == "circle":
        shape = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}"'
    elif kind == "square":
        shape = f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r}" height="{2 * r}"'
    else:
        pts = {
            "triangle": [(0, -r * 1.2), (r * 1.1, r), (-r * 1.1, r)],
            "diamond": [(0, -r * 1.3), (r * 1.3, 0), (0, r * 1.3), (-r * 1.3, 0)],
            "cross": [(-r, -r), (r, r), (0, 0), (r, -r), (-r, r), (0, 0)],
        }[kind]
        d = " L".join(f"{x + dx:.1f},{y + dy:.1f}" for dx, dy in pts)
        stroke = f' stroke="{fill}" stroke-width="1.6"' if kind == "cross" else ""
        shape = f'<path d="M{d} Z"{stroke}'
    return f'{shape} class="mark" data-marker="{kind}" fill="{fill}"/>'


def _line_legend(order: Sequence[_Drawn], names: Sequence[str], frame: Frame) -> list[str]:
    """Beside the plot area (or in rows under it): a line sample with the series' dash
    and marker, then its name."""
    beside = frame.width - _MARGIN_R > frame.right
    out = []
    for row, (d, label) in enumerate(zip(order, names, strict=True)):
        if beside:
            x, y = frame.right + 10, frame.top + 4 + row * LEGEND_ROW
        else:
            x, y = frame.left, frame.bottom + MARGIN_B + row * LEGEND_ROW
        dash = DASHES[d.index % len(DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<line x1="{x - 4}" y1="{y + 5}" x2="{x + 14}" y2="{y + 5}" stroke="{d.color}" '
            f'stroke-width="1.8"{dash_attr}/>'
        )
        out.append(marker(MARKERS[d.index % len(MARKERS)], x + 5, y + 5, d.color))
        out.append(f'<text class="legend" x="{x + 18}" y="{y + 9}">{html.escape(label)}</text>')
    return out


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
    frame = Frame((0, len(pairs)), (low, top), width=width, height=height)
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
    return svg_doc(name, len(pairs), width, height, body)


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
    frame = Frame(
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
    return svg_doc(name, drawn, width, height, body)
