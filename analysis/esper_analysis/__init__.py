"""Esper's polars analysis layer: reads run directories, never imports torch.

Load a run with :func:`load_run` (or every run under a directory with
:func:`load_runs`), then call any analysis on it; each returns an
:class:`~esper_analysis.result.AnalysisResult` (named polars tables plus a summary):

- :func:`event_counts`, :func:`capture_baseline` / :func:`check_baseline`
- :func:`reward_breakdown`, :func:`rollback_audit`, :func:`seed_lifecycles`
- :func:`action_distribution`, :func:`ppo_health`, :func:`throughput`, :func:`host_choices`
- :func:`run_info` (what was run: policy, task, seed, envs, config, command line)
- :func:`compare_runs` (pair by pair) and :func:`compare_groups` (groups of seeds: mean
  and 95 % interval over seeds, paired by seed)
- :func:`write_report` (one self-contained HTML file)
- :func:`verify_run` (every page of every file read, checksums verified)

The command line is :func:`esper_analysis.cli.main` (``esper analyze ...`` or
``python -m esper_analysis ...``).
"""

from __future__ import annotations

from esper_analysis import actions as _actions
from esper_analysis import baseline as _baseline
from esper_analysis import compare as _compare
from esper_analysis import counts as _counts
from esper_analysis import groups as _groups
from esper_analysis import hosts as _hosts
from esper_analysis import lifecycles as _lifecycles
from esper_analysis import ppo as _ppo
from esper_analysis import report as _report
from esper_analysis import rewards as _rewards
from esper_analysis import rollbacks as _rollbacks
from esper_analysis import throughput as _throughput
from esper_analysis.baseline import read_baseline
from esper_analysis.integrity import guard_corrupt_data, verify_run
from esper_analysis.loader import Run, load_run, load_runs, scan_runs
from esper_analysis.run_info import RunInfo, run_info

# Public entry points run under the corrupt-data guard: a scan that hits damaged data
# pages raises CorruptFileError naming the file, never a raw polars error.
action_distribution = guard_corrupt_data(_actions.action_distribution)
capture_baseline = guard_corrupt_data(_baseline.capture_baseline)
check_baseline = guard_corrupt_data(_baseline.check_baseline)
write_baseline = guard_corrupt_data(_baseline.write_baseline)
event_counts = guard_corrupt_data(_counts.event_counts)
host_choices = guard_corrupt_data(_hosts.host_choices)
seed_lifecycles = guard_corrupt_data(_lifecycles.seed_lifecycles)
ppo_health = guard_corrupt_data(_ppo.ppo_health)
build_report = guard_corrupt_data(_report.build_report)
write_report = guard_corrupt_data(_report.write_report)
reward_breakdown = guard_corrupt_data(_rewards.reward_breakdown)
rollback_audit = guard_corrupt_data(_rollbacks.rollback_audit)
throughput = guard_corrupt_data(_throughput.throughput)
# Several runs at once: the guard names the file of one run; these read many.
compare_runs = _compare.compare_runs
compare_groups = _groups.compare_groups

__all__ = [
    "Run",
    "RunInfo",
    "action_distribution",
    "build_report",
    "capture_baseline",
    "check_baseline",
    "compare_groups",
    "compare_runs",
    "event_counts",
    "host_choices",
    "load_run",
    "load_runs",
    "ppo_health",
    "read_baseline",
    "reward_breakdown",
    "rollback_audit",
    "run_info",
    "scan_runs",
    "seed_lifecycles",
    "throughput",
    "verify_run",
    "write_baseline",
    "write_report",
]
