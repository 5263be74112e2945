"""One self-contained HTML report of a run: plots as inline SVG, no scripts, no links.

The file opens offline in any browser: styles are inline, plots are drawn by
:mod:`esper_analysis.svg`, and nothing references the network or another file.
"""

from __future__ import annotations

import html
import os
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
    Segment,
    Series,
    bar_chart,
    empty_plot,
    line_chart,
    stacked_bars,
    timeline,
)
from esper_analysis.tables import format_value, html_table
from esper_analysis.throughput import Throughput, throughput

#: The lifecycle timeline shows the seeds of at most this many (most recent) rounds.
TIMELINE_ROUNDS: Final = 6
#: Rounds are grouped into at most this many columns in the action chart.
ACTION_BINS: Final = 60

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


def _learning_curve(run: Run) -> str:
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
    ) + line_chart(
        "learning-accuracy",
        "Mean final accuracy per round",
        [Series("accuracy", rounds, df["accuracy"].to_list(), color="#009E73")],
        x_label="round",
        y_label="accuracy (%)",
    )


def _reward_components(rewards: RewardBreakdown) -> str:
    df = rewards.by_round
    if df.height == 0:
        return empty_plot(
            "reward-components",
            "Reward components per round",
            "no reward_computed events (telemetry level below normal)",
        )
    active = [c for c in REWARD_COMPONENTS if df[c].abs().sum() > 0]
    series = [Series(c, df["round"].to_list(), df[c].to_list()) for c in active]
    total = Series("total", df["round"].to_list(), df["total"].to_list(), color="#000000")
    return line_chart(
        "reward-components",
        "Mean reward components per round",
        [*series, total],
        x_label="round",
        y_label="mean per step",
        width=1120,
        height=320,
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
    segments = [
        Segment(lane_of[(r, e, s)], rnd + a / length, rnd + b / length, stage)
        for r, e, s, rnd, stage, a, b in seg.select(
            "rank", "env", "slot", "round", "stage", "start_step", "end_step"
        ).iter_rows()
    ]
    title = f"Seed lifecycle per env and slot (rounds {rounds[0]}–{rounds[-1]})"
    return timeline(
        "seed-timeline", title, lanes, segments, list(TIMELINE_STAGES), x_label="round (+ step)"
    )


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


def _actions(actions: Actions) -> str:
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
        "action-rounds", "Op share per round", xs, stacks, x_label="round", y_label="share"
    )


def _ppo(ppo: PpoHealth) -> str:
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
    ) + line_chart(
        "ppo-kl",
        "PPO approx KL and clip fraction",
        [s("approx KL", "approx_kl"), s("clip fraction", "clip_frac")],
        x_label="round",
        y_label="value",
    )


def _throughput(tp: Throughput) -> str:
    df = tp.rounds
    if df.height == 0:
        return empty_plot("throughput", "Throughput", "no round data")
    return line_chart(
        "throughput",
        "Env-steps per second per round",
        [Series("EPS", df["round"].to_list(), df["eps"].to_list())],
        x_label="round",
        y_label="env-steps / s",
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
    def verdict(value: bool | None, what: str) -> str:
        if value is None:
            return f"<span class='note'>{what}: not checked</span>"
        klass = "ok" if value else "bad"
        return f"<span class='{klass}'>{what}: {'all reached' if value else 'MISSING'}</span>"

    summary = (
        f"<p>{audit.count} rollback(s). {verdict(audit.all_reached_buffer, 'buffer')} · "
        f"{verdict(audit.all_reached_episode, 'episode outcome')}</p>"
    )
    return summary + html_table(audit.rollbacks)


def _reward_check(rewards: RewardBreakdown) -> str:
    if rewards.rows == 0:
        return "<p class='none'>no reward_computed events</p>"
    klass = "ok" if rewards.flagged_rows == 0 else "bad"
    text = (
        f"<p class='{klass}'>{rewards.flagged_rows} of {rewards.rows} reward rows do not sum "
        f"to their total (tolerance {rewards.tolerance:g}).</p>"
    )
    if rewards.missing_components:
        text += (
            "<p class='note'>Components absent from this schema version (read as 0): "
            + html.escape(", ".join(rewards.missing_components))
            + "</p>"
        )
    by_component = rewards.by_component.select("component", "sum", "mean", "min", "max", "nonzero")
    return text + html_table(rewards.flagged, max_rows=10) + html_table(by_component)


def _baseline(check: BaselineCheck | None, source: str) -> str:
    if check is None:
        return "<p class='none'>no baseline given (use --baseline FILE)</p>"
    klass = "ok" if check.ok else "bad"
    head = f"<p class='{klass}'>{html.escape(check.message())}</p>"
    note = f"<p class='note'>baseline: {html.escape(source)}</p>"
    return head + note + html_table(check.drift) + html_table(check.types, max_rows=100)


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
    body = [
        _header(run, counts, tp),
        _section("Learning curve", _learning_curve(run), plots=True),
        _compare(run, compare_with),
        _section("Reward components over time", _reward_components(rewards), plots=True),
        _section("Seed lifecycles", _timeline(run, lc), plots=True),
        _section("Per-blueprint outcomes", html_table(lc.by_blueprint)),
        _section("Action distribution", _actions(actions), plots=True),
        _section("PPO health", _ppo(ppo_health(run)), plots=True),
        _section("Throughput", _throughput(tp), plots=True),
        _section("Rollbacks", _rollbacks(rollback_audit(run))),
        _section("Reward sum check", _reward_check(rewards)),
        _section("Event counts", html_table(counts.by_type, max_rows=100)),
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
