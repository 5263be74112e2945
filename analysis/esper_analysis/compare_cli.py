"""``esper analyze compare``: which runs and groups a command line names, and the output.

Each RUN argument is a run directory, or a directory of runs (a group: its runs are
the seeds). ``--group KEY`` pools every run named and groups them by ``policy``,
``task`` or a dotted config key (``ppo.lr``). Without groups the runs are compared
pair by pair (:func:`esper_analysis.compare.compare_runs`); with them, seed by seed
(:func:`esper_analysis.groups.compare_groups`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TextIO

from esper_analysis.compare import compare_runs
from esper_analysis.groups import CompareError, GroupComparison, compare_groups
from esper_analysis.loader import Run, is_run_dir, load_run, load_runs
from esper_analysis.result import AnalysisResult, jsonable
from esper_analysis.run_info import config_value, run_info
from esper_analysis.tables import WIDTH_HELP, add_max_rows

#: Group keys read from ``run_started`` itself (others are dotted config keys).
NAMED_KEYS: Final = ("policy", "task", "dir")
#: Group by the directory that holds each run (each directory of runs given, when
#: there is no --group).
DIR_KEY: Final = "dir"


def add_parser(sub: Any) -> None:
    """Register ``compare`` on the analyze sub-parsers."""
    p = sub.add_parser(
        "compare",
        help="compare runs or groups of seeds against the first (paired where they can be)",
        description=(
            "Compare runs side by side; the first RUN is the reference. Runs with the same "
            "seed, envs, episode length, task, host and host family train the same hosts "
            "whatever their policy, and are paired by (round, env); other runs are refused "
            "(exit 2) unless --unpaired. A RUN that is a directory of runs is a group of "
            "seeds: mean and 95%% confidence interval over its seeds, and each group minus "
            "the first paired by seed (--group KEY groups every run given by a key)."
        ),
        epilog=WIDTH_HELP,
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories, or directories of runs")
    add_group_flags(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_max_rows(p)


def add_group_flags(p: argparse.ArgumentParser) -> None:
    """``--group`` and ``--unpaired`` (compare and report)."""
    p.add_argument(
        "--group",
        metavar="KEY",
        help="group the runs by policy, task, dir (the directory holding the run) or a dotted "
        "config key (e.g. ppo.lr): mean and 95%% CI over each group's seeds (default: each "
        "directory of runs given is a group)",
    )
    p.add_argument(
        "--unpaired",
        action="store_true",
        help="compare runs that cannot be paired (another seed, envs or hosts) with unpaired "
        "Welch statistics, said as such in the output (default: refuse them, exit 2)",
    )


def is_runs_dir(text: str) -> bool:
    """Whether an argument names a directory of runs (a group) rather than a run."""
    path = Path(text)
    return path.is_dir() and not is_run_dir(path)


def expand_runs(paths: Sequence[str]) -> list[Run]:
    """Every run the arguments name (a directory of runs: each of its runs)."""
    return [run for _, runs, _ in _expand(paths) for run in runs]


def _expand(paths: Sequence[str]) -> list[tuple[str, list[Run], bool]]:
    """Each argument as (name, runs, whether it is a directory of runs)."""
    out: list[tuple[str, list[Run], bool]] = []
    for text in paths:
        path = Path(text)
        if is_runs_dir(text):
            out.append((path.resolve().name, load_runs(path), True))
        else:
            run = load_run(path)
            out.append((run.run_id, [run], False))
    return out


def group_label(run: Run, key: str) -> str:
    """The group of one run under ``--group key``."""
    info = run_info(run)
    if key == DIR_KEY:
        return run.path.resolve().parent.name
    if key == "policy":
        value: Any = info.policy_label
    elif key == "task":
        value = info.task
    else:
        value = config_value(info, key)
    if value is None:
        raise CompareError(
            f"--group {key}: run {run.run_id} records no {key!r} (use policy, task, dir, or "
            "a dotted config key such as ppo.lr)"
        )
    return str(value) if key in NAMED_KEYS else f"{key}={json.dumps(value)}"


def grouped(
    expanded: Sequence[tuple[str, list[Run], bool]], key: str | None
) -> dict[str, list[Run]]:
    """The groups of the expanded arguments: by directory, or by ``key``."""
    groups: dict[str, list[Run]] = {}
    seen: set[Path] = set()
    for name, runs, _ in expanded:
        for run in runs:
            where = run.path.resolve()
            if where in seen:
                raise CompareError(f"run {run.run_id} ({run.path}) is given twice")
            seen.add(where)
            label = name if key is None else group_label(run, key)
            groups.setdefault(label, []).append(run)
    return groups


def comparison(
    paths: Sequence[str], key: str | None, *, unpaired: bool, first: Run | None = None
) -> tuple[AnalysisResult, list[Run]]:
    """The comparison the arguments ask for, and every run it read: runs pair by pair,
    or groups when ``key`` is given or an argument is a directory of runs. ``first``:
    a run that leads (the report's own run)."""
    expanded = _expand(paths)
    if first is not None:
        expanded.insert(0, (first.run_id, [first], False))
    runs = [r for _, rs, _ in expanded for r in rs]
    if key is None and not any(is_group for _, _, is_group in expanded):
        return compare_runs(runs, unpaired=unpaired), runs
    groups = grouped(expanded, key)
    return compare_groups(groups, grouped_by=key or DIR_KEY, unpaired=unpaired), runs


def run_compare(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``esper analyze compare``; returns the exit code (errors raise AnalysisError: 2)."""
    from esper_analysis.tables import console_for, print_result

    result, runs = comparison(args.runs, args.group, unpaired=args.unpaired)
    for run in runs:
        if run.recovery is not None:
            err.write(f"warning: {run.recovery.message}\n")
    if args.json:
        info = [{"run_id": r.run_id, "path": str(r.path), "status": r.status} for r in runs]
        payload = {"runs_compared": info, **result.to_json()}
        out.write(json.dumps(jsonable(payload), indent=2, allow_nan=False) + "\n")
        return 0
    print_result(result, console_for(out), max_rows=args.max_rows)  # its summary names them
    return 0


__all__ = ["GroupComparison", "add_group_flags", "add_parser", "comparison", "run_compare"]
