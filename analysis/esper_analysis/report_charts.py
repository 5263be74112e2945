"""The report's charts of one run: learning curve with the spread over envs, reward
components, the seed-lifecycle timeline (every round, in pages), actions, PPO health,
throughput. Per-round charts share one x axis: rounds, or env-steps (:class:`XAxis`).
"""

from __future__ import annotations

import dataclasses
import html
import re
from collections.abc import Sequence
from typing import Final

import polars as pl

from esper.telemetry.events import REWARD_COMPONENTS
from esper_analysis.actions import Actions
from esper_analysis.lifecycles import TIMELINE_STAGES, Lifecycles
from esper_analysis.loader import Run
from esper_analysis.ppo import PpoHealth
from esper_analysis.rewards import RewardBreakdown
from esper_analysis.svg import Series, bar_chart, color, empty_plot, line_chart, stacked_bars
from esper_analysis.svg_timeline import Marker, Segment, timeline
from esper_analysis.throughput import Throughput

#: Rounds per page of the lifecycle timeline (every round is on a page).
TIMELINE_ROUNDS: Final = 6
#: Pages shown open; beyond this many, only the last page is open (the others one click).
OPEN_PAGES: Final = 4
#: Rounds are grouped into at most this many columns in the action chart.
ACTION_BINS: Final = 60
#: Said under the component charts: the name is the CLI's and TensorBoard's, and a
#: negative bonus otherwise reads like a sign bug.
COMPONENT_NOTE: Final = (
    "fossilize_bonus is positive when the fossilized seed helps and negative when it "
    "hurts (or adds nothing); each chart has its own scale."
)
#: Small multiples of the reward components: charts per row and their size.
SMALL_W: Final = 272
SMALL_H: Final = 150
_POINTS: Final = re.compile(r'data-points="(\d+)"')
#: Event types whose ``round`` says which rounds a run reached (a crashed run's last
#: round has step events but no ``round_finished``).
_ROUND_SOURCES: Final = ("round_started", "round_finished", "env_step", "episode_finished")


@dataclasses.dataclass(frozen=True)
class XAxis:
    """The x axis of the per-round charts: the round, or the env-steps done by the end
    of it (``steps_per_round``: every env of every rank, one episode each)."""

    kind: str = "round"
    steps_per_round: int | None = None
    span: tuple[float, float] | None = None

    @property
    def label(self) -> str:
        return "env-steps (at each round's end)" if self._steps else "round"

    @property
    def _steps(self) -> bool:
        return self.kind == "env-steps" and bool(self.steps_per_round)

    def x(self, rounds: Sequence[int | float]) -> list[float]:
        if self._steps:
            assert self.steps_per_round is not None
            return [float((r + 1) * self.steps_per_round) for r in rounds]
        return [float(r) for r in rounds]

    @property
    def range(self) -> tuple[float, float] | None:
        if self.span is None:
            return None
        lo, hi = self.x(list(self.span))
        return lo, hi


def round_span(run: Run) -> tuple[float, float] | None:
    """First and last round any event reached: the shared x axis of the per-round charts."""
    frames = [run.scan(t).select(pl.col("round")) for t in _ROUND_SOURCES if run.rows_on_disk(t)]
    if not frames:
        return None
    rounds = pl.concat(frames).select("round")
    lo, hi = rounds.select(lo=pl.col("round").min(), hi=pl.col("round").max()).collect().row(0)
    return None if lo is None else (float(lo), float(hi))


def learning_curve(run: Run, axis: XAxis) -> str:
    """Mean episode reward and final accuracy per round, the envs' spread as a band."""
    if run.rows_on_disk("episode_finished"):
        df = (
            run.scan("episode_finished")
            .unique(subset=["round", "env", "rank"], keep="last")
            .group_by("round")
            .agg(
                *(
                    expr
                    for name, col in (("reward", "episode_reward"), ("accuracy", "final_val_acc"))
                    for expr in (
                        pl.col(col).mean().alias(name),
                        pl.col(col).min().alias(f"{name}_low"),
                        pl.col(col).max().alias(f"{name}_high"),
                    )
                )
            )
            .sort("round")
            .collect()
        )
    else:
        df = (
            run.scan("round_finished")
            .select("round", reward="mean_episode_reward", accuracy="mean_final_accuracy")
            .sort("round")
            .collect()
        )
    xs = axis.x(df["round"].to_list())
    charts = []
    for key, title, y_label, c in (
        ("reward", "Mean episode reward per round", "reward", ""),
        ("accuracy", "Mean final accuracy per round", "accuracy (%)", "#009E73"),
    ):
        band = f"{key}_low" in df.columns
        series = Series(
            key,
            xs,
            df[key].to_list(),
            color=c,
            low=df[f"{key}_low"].to_list() if band else None,
            high=df[f"{key}_high"].to_list() if band else None,
        )
        charts.append(
            line_chart(
                f"learning-{key}",
                title,
                [series],
                x_label=axis.label,
                y_label=y_label,
                x_range=axis.range,
                zero_based=key == "reward",
            )
        )
    note = "line: mean over envs; band: lowest to highest env" if "reward_low" in df.columns else ""
    return "".join(charts) + (f"<p class='note'>{note}.</p>" if note else "")


def reward_components(rewards: RewardBreakdown, axis: XAxis) -> str:
    """One small chart per active component (own y scale), then the total.

    Ten lines on one axis overlap near zero and cannot be told apart; small multiples
    with a shared round axis can.
    """
    df = rewards.by_round
    if df.height == 0:
        return empty_plot(
            "reward-components",
            "Reward components per round",
            "no reward_computed events (telemetry level below normal)",
        )
    xs = axis.x(df["round"].to_list())
    active = [c for c in REWARD_COMPONENTS if df[c].abs().sum() > 0]
    charts = [
        line_chart(
            f"reward-{c}",
            c,
            [Series(c, xs, df[c].to_list(), color=color(i))],
            x_label=axis.label,
            y_label="mean per step",
            width=SMALL_W,
            height=SMALL_H,
            x_range=axis.range,
            zero_based=True,
        )
        for i, c in enumerate(active)
    ]
    total = line_chart(
        "reward-total",
        "total",
        [Series("total", xs, df["total"].to_list(), color="#000000")],
        x_label=axis.label,
        y_label="mean per step",
        width=SMALL_W,
        height=SMALL_H,
        x_range=axis.range,
        zero_based=True,
    )
    points = sum(int(v) for v in _POINTS.findall("".join([*charts, total])))
    body = "".join([*charts, total])
    note = (
        f"<p class='note'>{html.escape(COMPONENT_NOTE)}</p>" if "fossilize_bonus" in active else ""
    )
    return (
        f'<div class="row" data-plot="reward-components" data-points="{points}">{body}</div>' + note
    )


def _episode_length(run: Run, segments: pl.DataFrame) -> int:
    if run.rows_on_disk("run_started"):
        value = run.scan("run_started").select("episode_length").collect().item(0, 0)
        if isinstance(value, int) and value > 0:
            return value
    last = segments["end_step"].max()
    return max(last if isinstance(last, int) else 0, 0) + 1  # >= 1: it divides


def seed_timeline(run: Run, lc: Lifecycles, span: tuple[float, float] | None) -> str:
    """Every round's seeds, :data:`TIMELINE_ROUNDS` rounds per page (the last page open,
    all of them while there are at most :data:`OPEN_PAGES`)."""
    seg = lc.segments
    if seg.height == 0:
        return empty_plot("seed-timeline", "Seed lifecycles", "no seeds germinated")
    played = seg["round"].unique().to_list()
    first = int(span[0]) if span else min(played)
    last = int(span[1]) if span else max(played)
    length = _episode_length(run, seg)
    lanes_df = seg.select("rank", "env", "slot").unique().sort("rank", "env", "slot")
    multi_rank = lanes_df["rank"].n_unique() > 1
    lanes = [
        (f"r{r} " if multi_rank else "") + f"env {e} / {s}" for r, e, s in lanes_df.iter_rows()
    ]
    lane_of = {key: i for i, key in enumerate(lanes_df.iter_rows())}
    pruned = lc.seeds.filter(pl.col("outcome") == "pruned")
    starts = list(range(first, last + 1, TIMELINE_ROUNDS))
    pages = []
    for number, start in enumerate(starts, start=1):
        stop = min(start + TIMELINE_ROUNDS - 1, last)
        rounds = pl.col("round").is_between(start, stop)
        # A step occupies [step, step + 1): a piece that lasts to the episode's last step
        # (a fossilized seed, or one alive at the end) covers that step too.
        segments = [
            Segment(lane_of[(r, e, s)], rnd, a / length, _piece_end(a, b, length), stage)
            for r, e, s, rnd, stage, a, b in seg.filter(rounds)
            .select("rank", "env", "slot", "round", "stage", "start_step", "end_step")
            .iter_rows()
        ]
        markers = [
            Marker(lane_of[(r, e, s)], rnd, step / length, "pruned")
            for r, e, s, rnd, step in pruned.filter(rounds)
            .select("rank", "env", "slot", "round", "ended_step")
            .iter_rows()
            if (r, e, s) in lane_of and step is not None
        ]
        of = f", page {number} of {len(starts)}" if len(starts) > 1 else ""
        title = f"Seed lifecycle per env and slot, rounds {start}–{stop}{of}"
        name = "seed-timeline" if number == 1 else f"seed-timeline-{number}"
        chart = (
            timeline(
                name,
                title,
                lanes,
                segments,
                list(TIMELINE_STAGES),
                rounds=(start, stop),
                x_label="round (one episode per column)",
                markers=markers,
            )
            if segments
            else empty_plot(name, title, "no seeds in these rounds")
        )
        is_open = len(starts) <= OPEN_PAGES or number == len(starts)
        pages.append(
            f"<details class='page'{' open' if is_open else ''}><summary>rounds {start}–{stop}"
            f" ({len(segments)} stage pieces)</summary>{chart}</details>"
        )
    return "".join(pages)


def _piece_end(start: int, end: int, length: int) -> float:
    """End of a timeline piece as a fraction of the episode (the last step included)."""
    return min(end + 1, length) / length if end >= length - 1 else max(end, start) / length


def _binned_ops(actions: Actions) -> tuple[list[float], dict[str, list[float]]]:
    df = actions.by_round
    rounds = sorted(df["round"].unique().to_list())
    width = max(1, -(-len(rounds) // ACTION_BINS))
    binned = (
        df.with_columns(bin=(pl.col("round") // width) * width)
        .group_by("bin", "op")
        .agg(pl.col("actions").sum())
        .with_columns(share=pl.col("actions") / pl.col("actions").sum().over("bin"))
        .pivot(on="op", index="bin", values="share")
        .fill_null(0.0)
        .sort("bin")
    )
    ops = [c for c in actions.by_op["op"].to_list() if c in binned.columns]
    return binned["bin"].cast(pl.Float64).to_list(), {op: binned[op].to_list() for op in ops}


def actions_chart(actions: Actions, span: tuple[float, float] | None) -> str:
    if actions.actions == 0:
        return empty_plot("actions", "Action distribution", "no action_taken events")
    xs, stacks = _binned_ops(actions)
    return bar_chart(
        "action-totals",
        "Ops chosen (whole run)",
        actions.by_op["op"].to_list(),
        actions.by_op["actions"].to_list(),
        y_label="actions",
    ) + stacked_bars(
        "action-rounds",
        "Op share per round",
        xs,
        stacks,
        x_label="round",
        y_label="share",
        x_range=span,
    )


def ppo_charts(ppo: PpoHealth, axis: XAxis) -> str:
    df = ppo.updates
    xs = axis.x(df["round"].to_list())

    def s(name: str, col: str) -> Series:
        return Series(name, xs, df[col].to_list())

    return line_chart(
        "ppo-entropy",
        "PPO entropy and explained variance",
        [s("entropy", "entropy"), s("explained variance", "explained_variance")],
        x_label=axis.label,
        y_label="value",
        x_range=axis.range,
    ) + line_chart(
        "ppo-kl",
        "PPO approx KL and clip fraction",
        [s("approx KL", "approx_kl"), s("clip fraction", "clip_frac")],
        x_label=axis.label,
        y_label="value",
        x_range=axis.range,
    )


def throughput_chart(tp: Throughput, axis: XAxis) -> str:
    df = tp.rounds
    if df.height == 0:
        return empty_plot("throughput", "Throughput", "no round data")
    return line_chart(
        "throughput",
        "Env-steps per second per round",
        [Series("EPS", axis.x(df["round"].to_list()), df["eps"].to_list())],
        x_label=axis.label,
        y_label="env-steps / s",
        x_range=axis.range,
    )
