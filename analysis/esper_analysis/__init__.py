"""Esper's polars analysis layer: reads run directories, never imports torch.

Load a run with :func:`load_run` (or every run under a directory with
:func:`load_runs`), then call any analysis on it; each returns an
:class:`~esper_analysis.result.AnalysisResult` (named polars tables plus a summary):

- :func:`event_counts`, :func:`capture_baseline` / :func:`check_baseline`
- :func:`reward_breakdown`, :func:`rollback_audit`, :func:`seed_lifecycles`
- :func:`action_distribution`, :func:`ppo_health`, :func:`throughput`
- :func:`write_report` (one self-contained HTML file)

The command line is :func:`esper_analysis.cli.main` (``esper analyze ...`` or
``python -m esper_analysis ...``).
"""

from __future__ import annotations

from esper_analysis.actions import action_distribution
from esper_analysis.baseline import (
    capture_baseline,
    check_baseline,
    read_baseline,
    write_baseline,
)
from esper_analysis.counts import event_counts
from esper_analysis.lifecycles import seed_lifecycles
from esper_analysis.loader import Run, load_run, load_runs, scan_runs
from esper_analysis.ppo import ppo_health
from esper_analysis.report import build_report, write_report
from esper_analysis.rewards import reward_breakdown
from esper_analysis.rollbacks import rollback_audit
from esper_analysis.throughput import throughput

__all__ = [
    "Run",
    "action_distribution",
    "build_report",
    "capture_baseline",
    "check_baseline",
    "event_counts",
    "load_run",
    "load_runs",
    "ppo_health",
    "read_baseline",
    "reward_breakdown",
    "rollback_audit",
    "scan_runs",
    "seed_lifecycles",
    "throughput",
    "write_baseline",
    "write_report",
]
