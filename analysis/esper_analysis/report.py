"""One self-contained HTML report of a run: plots as inline SVG, no scripts, no links.

The file opens offline in any browser: styles are inline, plots are drawn by
:mod:`esper_analysis.svg`, and nothing references the network or another file.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import polars as pl

from esper.core.records import REWARD_COMPONENTS
from esper_analysis.actions import Actions, action_distribution
from esper_analysis.baseline import BaselineCheck, check_baseline
from esper_analysis.compare import compare_section
from esper_analysis.counts import Counts, event_counts
from esper_analysis.lifecycles import TIMELINE_STAGES, Lifecycles, seed_lifecycles
from esper_analysis.loader import Run
from esper_analysis.ppo import PpoHealth, ppo_health
from esper_analysis.rewards import RewardBreakdown, reward_breakdown
from esper_analysis.rollbacks import RollbackAudit, rollback_audit
from esper_analysis.svg import (
    Marker,
    Segment,
    Series,
    bar_chart,
    color,
    empty_plot,
    line_chart,
    stacked_bars,
    timeline,
)
from esper_analysis.tables import format_value, html_table, legends
from esper_analysis.throughput import Throughput, throughput

#: File name of a run's report inside its directory (`esper train --report`, and
#: `esper analyze report` without -o).
REPORT_NAME: Final = "report.html"
#: The lifecycle timeline shows the seeds of at most this many (most recent) rounds.
TIMELINE_ROUNDS: Final = 6
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

_CSS: Final = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222}
body{max-width:1200px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:13px} .row{display:flex;flex-wrap:wrap;gap:12px}
.plot{background:#fff;border:1px solid #e3e3e3;border-radius:4px}
.plot .title{font-size:13px;font-weight:600;fill:#222} .plot .tick{font-size:10px;fill:#555}
.plot .label{font-size:11px;fill:#333} .plot .legend{font-size:10px;fill:#333}
.plot .grid{stroke:#eee;stroke-width:1} .plot .area{fill:none;stroke:#bbb}
.plot .series{stroke-width:1.8} .plot .empty{font-size:12px;fill:#888}
table{border-collapse:collapse;font-size:12px;margin:6px 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right} th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}
.ok{color:#07620e;font-weight:600} .bad{color:#a40000;font-weight:600}
.warn{background:#fff4d6;border:1px solid #e6c35c;padding:8px 12px;border-radius:4px}
.note,.none{color:#777;font-size:12px} .block{overflow-x:auto}
"""


def round_span(run: Run) -> tuple[float, float] | None:
    """First and last round any event reached: the shared x axis of the per-round charts."""
    frames = [run.scan(t).select(pl.col("round")) for t in _ROUND_SOURCES if run.rows_on_disk(t)]
    if not frames:
        return None
    rounds = pl.concat(frames).select("round")
    lo, hi = rounds.select(lo=pl.col("round").min(), hi=pl.col("round").max()).collect().row(0)
    return None if lo is None else (float(lo), float(hi))


def _zero_not_negative(frame: pl.DataFrame) -> pl.DataFrame:
    """-0.0 prints as ``-0``: make float zeros plain zeros before they become text."""
    floats = [c for c, t in frame.schema.items() if t.is_float()]
    return frame.with_columns(
        pl.when(pl.col(c) == 0).then(0.0).otherwise(pl.col(c)).alias(c) for c in floats
    )


def _table(frame: pl.DataFrame, **kwargs: Any) -> str:
    return html_table(_zero_not_negative(frame), **kwargs)


def _legends(frame: pl.DataFrame) -> str:
    """What the table's missing values mean (the terminal tables' legends)."""
    return "".join(f"<p class='note'>{html.escape(text)}</p>" for text in legends(frame))


def _learning_curve(run: Run, span: tuple[float, float] | None) -> str:
    frame = run.scan("round_finished").select(
        "round", reward="mean_episode_reward", accuracy="mean_final_accuracy"
    )
    if not run.rows_on_disk("round_finished"):
        frame = (
            run.scan("episode_finished")
            .group_by("round")
            .agg(reward=pl.col("episode_reward").mean(), accuracy=pl.col("final_val_acc").mean())
        )
    df = frame.sort("round").collect()
    rounds = df["round"].to_list()
    return line_chart(
        "learning-reward",
        "Mean episode reward per round",
        [Series("reward", rounds, df["reward"].to_list())],
        x_label="round",
        y_label="reward",
        x_range=span,
    ) + line_chart(
        "learning-accuracy",
        "Mean final accuracy per round",
        [Series("accuracy", rounds, df["accuracy"].to_list(), color="#009E73")],
        x_label="round",
        y_label="accuracy (%)",
        x_range=span,
    )


def _reward_components(rewards: RewardBreakdown, span: tuple[float, float] | None) -> str:
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
    rounds = df["round"].to_list()
    active = [c for c in REWARD_COMPONENTS if df[c].abs().sum() > 0]
    charts = [
        line_chart(
            f"reward-{c}",
            c,
            [Series(c, rounds, df[c].to_list(), color=color(i))],
            x_label="round",
            y_label="mean per step",
            width=SMALL_W,
            height=SMALL_H,
            x_range=span,
        )
        for i, c in enumerate(active)
    ]
    total = line_chart(
        "reward-total",
        "total",
        [Series("total", rounds, df["total"].to_list(), color="#000000")],
        x_label="round",
        y_label="mean per step",
        width=SMALL_W,
        height=SMALL_H,
        x_range=span,
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


def _timeline(run: Run, lc: Lifecycles) -> str:
    seg = lc.segments
    if seg.height == 0:
        return empty_plot("seed-timeline", "Seed lifecycles", "no seeds germinated")
    rounds = sorted(seg["round"].unique().to_list())[-TIMELINE_ROUNDS:]
    seg = seg.filter(pl.col("round").is_in(rounds))
    length = _episode_length(run, seg)
    lanes_df = seg.select("rank", "env", "slot").unique().sort("rank", "env", "slot")
    multi_rank = lanes_df["rank"].n_unique() > 1
    lanes = [
        (f"r{r} " if multi_rank else "") + f"env {e} / {s}" for r, e, s in lanes_df.iter_rows()
    ]
    lane_of = {key: i for i, key in enumerate(lanes_df.iter_rows())}
    # A step occupies [step, step + 1): a piece that lasts to the episode's last step
    # (a fossilized seed, or one alive at the end) covers that step too, so a seed
    # fossilized late is not a sliver.
    segments = [
        Segment(lane_of[(r, e, s)], rnd + a / length, rnd + _piece_end(a, b, length), stage)
        for r, e, s, rnd, stage, a, b in seg.select(
            "rank", "env", "slot", "round", "stage", "start_step", "end_step"
        ).iter_rows()
    ]
    pruned = lc.seeds.filter(
        (pl.col("outcome") == "pruned") & pl.col("round").is_in(rounds)
    ).select("rank", "env", "slot", "round", "ended_step")
    markers = [
        Marker(lane_of[(r, e, s)], rnd + step / length, "pruned")
        for r, e, s, rnd, step in pruned.iter_rows()
        if (r, e, s) in lane_of and step is not None
    ]
    title = f"Seed lifecycle per env and slot (rounds {rounds[0]}–{rounds[-1]})"
    return timeline(
        "seed-timeline",
        title,
        lanes,
        segments,
        list(TIMELINE_STAGES),
        x_label="round (+ step)",
        markers=markers,
    )


def _piece_end(start: int, end: int, length: int) -> float:
    """End of a timeline piece as a fraction of the round (the last step included)."""
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


def _actions(actions: Actions, span: tuple[float, float] | None) -> str:
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


def _ppo(ppo: PpoHealth, span: tuple[float, float] | None) -> str:
    df = ppo.updates
    rounds = df["round"].to_list()

    def s(name: str, col: str) -> Series:
        return Series(name, rounds, df[col].to_list())

    return line_chart(
        "ppo-entropy",
        "PPO entropy and explained variance",
        [s("entropy", "entropy"), s("explained variance", "explained_variance")],
        x_label="round",
        y_label="value",
        x_range=span,
    ) + line_chart(
        "ppo-kl",
        "PPO approx KL and clip fraction",
        [s("approx KL", "approx_kl"), s("clip fraction", "clip_frac")],
        x_label="round",
        y_label="value",
        x_range=span,
    )


def _throughput(tp: Throughput, span: tuple[float, float] | None) -> str:
    df = tp.rounds
    if df.height == 0:
        return empty_plot("throughput", "Throughput", "no round data")
    return line_chart(
        "throughput",
        "Env-steps per second per round",
        [Series("EPS", df["round"].to_list(), df["eps"].to_list())],
        x_label="round",
        y_label="env-steps / s",
        x_range=span,
    )


def _header(run: Run, counts: Counts, tp: Throughput) -> str:
    rows = {
        "status": run.status.value,
        "schema version": run.schema_version,
        "config hash": run.config_hash or "—",
        "events": counts.total,
        "env-steps": counts.env_steps,
        "wall (s)": tp.wall_s,
        "EPS": tp.eps,
    }
    meta = " · ".join(f"{k}: {html.escape(format_value(v))}" for k, v in rows.items())
    out = f"<h1>Esper run {html.escape(run.run_id)}</h1><p class='meta'>{meta}</p>"
    if run.recovery is not None:
        rec = run.recovery
        skipped = "".join(
            f"<li>{html.escape(s.path)}: {html.escape(s.reason)}</li>" for s in rec.files_skipped
        )
        out += (
            f"<div class='warn'><b>Partial run.</b> {html.escape(rec.message)}."
            + (f"<ul>{skipped}</ul>" if skipped else "")
            + "</div>"
        )
    return out


def _rollbacks(audit: RollbackAudit) -> str:
    """Same verdicts as ``esper analyze rollbacks``: checked means the data to check was there."""

    def verdict(value: bool | None, what: str, checked: bool, missing_data: str) -> str:
        if not checked:
            return f"<span class='note'>{what}: not checked ({missing_data})</span>"
        if audit.count == 0:
            return f"<span class='ok'>{what}: checked, nothing to reach</span>"
        if value is None:
            return f"<span class='note'>{what}: not checked (no matching rows)</span>"
        klass = "ok" if value else "bad"
        return f"<span class='{klass}'>{what}: {'all reached' if value else 'MISSING'}</span>"

    buffer = verdict(
        audit.all_reached_buffer, "buffer", audit.buffer_checked, "no reward_computed events"
    )
    episode = verdict(audit.all_reached_episode, "episode outcome", True, "")
    summary = f"<p>{audit.count} rollback(s). {buffer} · {episode}</p>"
    return summary + (_table(audit.rollbacks) if audit.rollbacks.height else "")


def _reward_check(rewards: RewardBreakdown) -> str:
    if rewards.rows == 0:
        return "<p class='none'>no reward_computed events</p>"
    if rewards.flagged_rows == 0:
        text = (
            f"<p class='ok'>All {rewards.rows} reward rows sum to their total "
            f"(tolerance {rewards.tolerance:g}).</p>"
        )
    else:
        text = (
            f"<p class='bad'>{rewards.flagged_rows} of {rewards.rows} reward rows differ from "
            f"the sum of their components by more than {rewards.tolerance:g}.</p>"
        )
    if rewards.missing_components:
        text += (
            "<p class='note'>Components absent from this schema version (read as 0): "
            + html.escape(", ".join(rewards.missing_components))
            + "</p>"
        )
    by_component = rewards.by_component.select("component", "sum", "mean", "min", "max", "nonzero")
    flagged = _table(rewards.flagged, max_rows=10) if rewards.flagged.height else ""
    return text + flagged + _table(by_component)


def _baseline(check: BaselineCheck | None, source: str) -> str:
    if check is None:
        return "<p class='none'>no baseline given (use --baseline FILE)</p>"
    klass = "ok" if check.ok else "bad"
    head = f"<p class='{klass}'>{html.escape(check.message())}</p>"
    note = f"<p class='note'>baseline: {html.escape(source)}</p>"
    drift = _table(check.drift) if check.drift.height else ""
    return head + note + drift + _table(check.types, max_rows=100)


def _section(title: str, body: str, *, plots: bool = False) -> str:
    """A titled block; plot sections lay their charts out side by side."""
    klass = "row" if plots else "block"
    return f"<section><h2>{html.escape(title)}</h2><div class='{klass}'>{body}</div></section>"


def _compare(run: Run, others: Sequence[Run]) -> str:
    """Curves of this run and ``others`` overlaid, paired differences (esper_analysis.compare)."""
    if not others:
        return ""
    return _section("Compared runs", compare_section([run, *others]), plots=True)


def build_report(
    run: Run,
    *,
    baseline: dict[str, Any] | None = None,
    baseline_source: str = "",
    compare_with: Sequence[Run] = (),
) -> str:
    """The report's HTML text (every analysis of the run, plus the baseline check)."""
    counts = event_counts(run)
    rewards = reward_breakdown(run)
    lc = seed_lifecycles(run)
    actions = action_distribution(run)
    tp = throughput(run)
    check = check_baseline(run, baseline, counts) if baseline is not None else None
    span = round_span(run)  # one round axis for every per-round chart
    body = [
        _header(run, counts, tp),
        _section("Learning curve", _learning_curve(run, span), plots=True),
        _compare(run, compare_with),
        _section("Reward components over time", _reward_components(rewards, span), plots=True),
        _section("Seed lifecycles", _timeline(run, lc), plots=True),
        _section("Per-blueprint outcomes", _table(lc.by_blueprint) + _legends(lc.by_blueprint)),
        _section("Action distribution", _actions(actions, span), plots=True),
        _section("PPO health", _ppo(ppo_health(run), span), plots=True),
        _section("Throughput", _throughput(tp, span), plots=True),
        _section("Rollbacks", _rollbacks(rollback_audit(run))),
        _section("Reward sum check", _reward_check(rewards)),
        _section("Event counts", _table(counts.by_type, max_rows=100)),
        _section("Baseline status", _baseline(check, baseline_source)),
    ]
    title = html.escape(f"Esper run {run.run_id}")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>{_CSS}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


def write_report(
    run: Run,
    path: str | os.PathLike[str],
    *,
    baseline: dict[str, Any] | None = None,
    baseline_source: str = "",
    compare_with: Sequence[Run] = (),
) -> Path:
    """Write the report atomically; returns its path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = build_report(
        run, baseline=baseline, baseline_source=baseline_source, compare_with=compare_with
    )
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    return target
