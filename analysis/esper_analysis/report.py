"""One self-contained HTML report of a run: plots as inline SVG, no scripts, no links.

The file opens offline in any browser: styles are inline, plots are drawn by
:mod:`esper_analysis.svg`, and nothing references the network or another file. It
opens with what was run (policy, task, seed, envs, rounds, host family, the command
line, the version and the full resolved config), so the report alone says how to
reproduce the run; a section that cannot apply to the run (PPO health of a baseline)
is replaced by a line saying why.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import polars as pl

from esper_analysis.actions import action_distribution
from esper_analysis.baseline import BaselineCheck, check_baseline
from esper_analysis.compare_report import X_AXES, compare_section, steps_per_round
from esper_analysis.counts import Counts, event_counts
from esper_analysis.lifecycles import seed_lifecycles
from esper_analysis.loader import Run
from esper_analysis.ppo import ppo_health
from esper_analysis.report_charts import (
    XAxis,
    actions_chart,
    learning_curve,
    ppo_charts,
    reward_components,
    round_span,
    seed_timeline,
    throughput_chart,
)
from esper_analysis.rewards import RewardBreakdown, reward_breakdown
from esper_analysis.rollbacks import RollbackAudit, rollback_audit
from esper_analysis.run_info import RunInfo, run_info
from esper_analysis.tables import format_value, html_table, legends
from esper_analysis.throughput import Throughput, throughput

__all__ = ["REPORT_NAME", "X_AXES", "build_report", "round_span", "write_report"]

#: File name of a run's report inside its directory (`esper train --report`, and
#: `esper analyze report` without -o).
REPORT_NAME: Final = "report.html"

_CSS: Final = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222}
body{max-width:1200px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:13px} .row{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
.plot{background:#fff;border:1px solid #e3e3e3;border-radius:4px}
.plot .title{font-size:13px;font-weight:600;fill:#222} .plot .tick{font-size:10px;fill:#555}
.plot .label{font-size:11px;fill:#333} .plot .legend{font-size:10px;fill:#333}
.plot .grid{stroke:#eee;stroke-width:1} .plot .area{fill:none;stroke:#bbb}
.plot .series{stroke-width:1.8} .plot .empty{font-size:12px;fill:#888}
.plot .note{font-size:10px;fill:#8a5300}
table{border-collapse:collapse;font-size:12px;margin:6px 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right} th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}
table.what td{text-align:left} table.what th{text-align:left;font-weight:600}
.ok{color:#07620e;font-weight:600} .bad{color:#a40000;font-weight:600}
.warn{background:#fff4d6;border:1px solid #e6c35c;padding:8px 12px;border-radius:4px}
.note,.none{color:#777;font-size:12px} .block{overflow-x:auto}
.row>p.note{flex-basis:100%} details.page{flex-basis:100%} summary{cursor:pointer;font-size:12px}
pre.config{font-size:11px;background:#f8f8f8;border:1px solid #e3e3e3;padding:8px;overflow-x:auto}
code.cmd{font-size:12px;background:#f4f4f4;padding:2px 4px;word-break:break-all}
"""


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


def _what_was_run(run: Run, info: RunInfo, rounds_done: int) -> str:
    """Policy, task, seed, envs, rounds, hosts, versions, command line and config."""
    if info.policy is None:
        return (
            "<p class='none'>This run recorded no run_started event: what was run is unknown.</p>"
        )
    envs = f"{info.envs}"
    if info.world_size > 1:
        envs += f" ({info.n_envs} per rank × {info.world_size} ranks)"
    reward = info.config.get("reward", {}).get("family") if info.config else None
    rows: dict[str, str] = {
        "policy": str(info.policy_label)
        + (f", frozen from {info.eval_checkpoint}" if info.is_eval else ""),
        "task": str(info.task),
        "seed": str(info.seed),
        "envs": envs,
        "rounds": f"{rounds_done} of {info.rounds}",
        "episode length": f"{info.episode_length} steps (host epochs)",
        "hosts": f"family of {len(info.family)}: {', '.join(info.family)}"
        if info.family
        else "one host ([host] of the config)",
        "reward family": str(reward or "—"),
        "device": f"{info.device}, telemetry level {info.telemetry_level}",
        "esper": f"{info.esper_version} (torch {info.torch_version}, python {info.python_version})",
    }
    if info.parent_run_id:
        rows["resumed"] = f"from run {info.parent_run_id} at round {info.resumed_from_round}"
    cells = "".join(f"<tr><th>{k}</th><td>{html.escape(v)}</td></tr>" for k, v in rows.items())
    commands = (
        "".join(
            f"<p class='meta'>command line: <code class='cmd'>{html.escape(c)}</code></p>"
            for c in info.command_lines
        )
        or "<p class='note'>command line: not recorded (a run written before esper recorded it)</p>"
    )
    config = ""
    if info.config:
        text = html.escape(json.dumps(info.config, indent=2, sort_keys=True))
        config = (
            "<details><summary>Full resolved config (JSON: saved as run.json, "
            "<code>esper train --config run.json</code> runs it again)</summary>"
            f"<pre class='config'>{text}</pre></details>"
        )
    return f"<table class='what'>{cells}</table>{commands}{config}"


def _omitted(title: str, why: str) -> str:
    """A section that cannot apply to this run: its title and the reason."""
    return _section(title, f"<p class='none'>Not applicable: {html.escape(why)}.</p>")


def _not_learning(info: RunInfo) -> str | None:
    """Why the run has no PPO updates (None: it learns, or is unknown)."""
    if info.policy is None or info.learns:
        return None
    if info.is_eval:
        return "an evaluation of a frozen policy makes no PPO updates"
    return f"the {info.policy} policy does not learn, so there are no PPO updates"


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


def _compare(run: Run, others: Sequence[Run], by: str | None, unpaired: bool, x_axis: str) -> str:
    """Curves of this run and ``others`` overlaid, differences (esper_analysis.compare)."""
    if not others:
        return ""
    body = compare_section([run, *others], by=by, unpaired=unpaired, x_axis=x_axis)
    return _section("Compared runs", body, plots=True)


def build_report(
    run: Run,
    *,
    baseline: dict[str, Any] | None = None,
    baseline_source: str = "",
    compare_with: Sequence[Run] = (),
    compare_by: str | None = None,
    unpaired: bool = False,
    x_axis: str = "round",
) -> str:
    """The report's HTML text (every analysis of the run, plus the baseline check).

    ``compare_with``: runs overlaid and compared with this one, pair by pair, or, with
    ``compare_by`` (``policy``, ``task``, ``dir`` or a config key), as groups of seeds;
    ``unpaired``: allow runs that cannot be paired (Welch). ``x_axis``: ``round`` or
    ``env-steps`` for the per-round charts.
    """
    if x_axis not in X_AXES:
        raise ValueError(f"x_axis must be one of {X_AXES}, got {x_axis!r}")
    info = run_info(run)
    counts = event_counts(run)
    rewards = reward_breakdown(run)
    lc = seed_lifecycles(run)
    tp = throughput(run)
    check = check_baseline(run, baseline, counts) if baseline is not None else None
    span = round_span(run)  # one round axis for every per-round chart
    axis = XAxis(x_axis, steps_per_round(run), span)
    no_ppo = _not_learning(info)
    no_seeds = "the static policy never germinates a seed" if info.policy == "static" else None
    body = [
        _header(run, counts, tp),
        _section("What was run", _what_was_run(run, info, tp.rounds.height)),
        _section("Learning curve", learning_curve(run, axis), plots=True),
        _compare(run, compare_with, compare_by, unpaired, x_axis),
        _section("Reward components over time", reward_components(rewards, axis), plots=True),
        _omitted("Seed lifecycles", no_seeds)
        if no_seeds
        else _section("Seed lifecycles", seed_timeline(run, lc, span), plots=True),
        ""
        if no_seeds
        else _section(
            "Per-blueprint outcomes", _table(lc.by_blueprint) + _legends(lc.by_blueprint)
        ),
        _section("Action distribution", actions_chart(action_distribution(run), span), plots=True),
        _omitted("PPO health", no_ppo)
        if no_ppo
        else _section("PPO health", ppo_charts(ppo_health(run), axis), plots=True),
        _section("Throughput", throughput_chart(tp, axis), plots=True),
        _section("Rollbacks", _rollbacks(rollback_audit(run))),
        _section("Reward sum check", _reward_check(rewards)),
        _section("Event counts", _table(counts.by_type, max_rows=100)),
        _section("Baseline status", _baseline(check, baseline_source)),
    ]
    title = html.escape(f"Esper run {run.run_id}")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>{_CSS}</style></head><body>"
        + "\n".join(b for b in body if b)
        + "</body></html>\n"
    )


def write_report(
    run: Run,
    path: str | os.PathLike[str],
    *,
    baseline: dict[str, Any] | None = None,
    baseline_source: str = "",
    compare_with: Sequence[Run] = (),
    compare_by: str | None = None,
    unpaired: bool = False,
    x_axis: str = "round",
) -> Path:
    """Write the report atomically (options: :func:`build_report`); returns its path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = build_report(
        run,
        baseline=baseline,
        baseline_source=baseline_source,
        compare_with=compare_with,
        compare_by=compare_by,
        unpaired=unpaired,
        x_axis=x_axis,
    )
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    return target
