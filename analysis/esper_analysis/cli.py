"""Command line of the analysis layer: ``esper analyze ...`` / ``python -m esper_analysis``.

Every command takes a run directory (``counts`` also a directory of runs, one column
per run; ``compare`` several runs). Output is rich tables for people, or JSON with
``--json``. Exit codes: 0 success, 1 drift (``baseline check``), 2 usage error (bad
arguments, missing run directory or baseline, corrupt file, newer schema, damaged pages
found by ``verify``), printed as
one ``error: ...`` line without a traceback. Warnings (a crashed run, skipped files)
go to stderr as ``warning: ...`` lines so ``--json`` output stays parseable.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TextIO

import polars as pl

from esper.errors import UserError
from esper.suggest import parse_args_suggesting
from esper_analysis import compare_cli
from esper_analysis.actions import action_distribution
from esper_analysis.baseline import check_baseline, read_baseline, write_baseline
from esper_analysis.compare_report import X_AXES
from esper_analysis.counts import Counts, event_counts
from esper_analysis.errors import AnalysisError, CorruptFileError
from esper_analysis.hosts import host_choices
from esper_analysis.integrity import corrupt_data_errors, verify_run
from esper_analysis.lifecycles import seed_lifecycles
from esper_analysis.loader import Run, is_run_dir, load_run, load_runs
from esper_analysis.ppo import ppo_health
from esper_analysis.result import AnalysisResult, jsonable
from esper_analysis.rewards import reward_breakdown
from esper_analysis.rollbacks import rollback_audit
from esper_analysis.schema import known_event_types
from esper_analysis.tables import (
    WIDTH_HELP,
    add_max_rows,
    console_for,
    fits,
    plural,
    print_result,
    rich_tables,
)
from esper_analysis.throughput import throughput

EXIT_OK: Final = 0
EXIT_DRIFT: Final = 1
EXIT_USAGE: Final = 2

#: Analyses that only read a run and print a result.
ANALYSES: Final[dict[str, tuple[Callable[[Run], AnalysisResult], str]]] = {
    "counts": (
        event_counts,
        "event counts by type, round, env and step (given a directory of runs: per run)",
    ),
    "rewards": (reward_breakdown, "reward breakdown per env, episode, op and component"),
    "rollbacks": (rollback_audit, "governor rollbacks, checked against buffer and episode"),
    "lifecycles": (seed_lifecycles, "seed lifecycles and per-blueprint outcomes"),
    "actions": (action_distribution, "op distribution per round and env"),
    "hosts": (
        host_choices,
        "growth per host family member: slot, blueprint and step of the germinations",
    ),
    "ppo": (ppo_health, "PPO losses, entropy per head, KL, explained variance"),
    "throughput": (throughput, "EPS and phase timings per round"),
}
#: Runs named in the error for a directory of runs given to a one-run analysis.
MAX_NAMED_RUNS: Final = 5


class UsageError(AnalysisError):
    """A command line the analyses cannot act on (exit 2)."""


def _common(p: argparse.ArgumentParser, *, json_help: str = "", rows: bool = True) -> None:
    """RUN, ``--json`` (when the command prints something JSON can carry) and
    ``--max-rows`` (when it prints tables)."""
    p.add_argument("run", metavar="RUN", help="run directory (<telemetry_dir>/<run_id>)")
    p.add_argument("--json", action="store_true", help=json_help or "print JSON instead of tables")
    if rows:
        add_max_rows(p)


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Analyse Esper telemetry runs (Parquet, polars).",
        epilog=WIDTH_HELP,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in ANALYSES.items():
        _common(sub.add_parser(name, help=help_text, description=help_text, epilog=WIDTH_HELP))
    baseline = sub.add_parser(
        "baseline",
        help="capture or check an event-count baseline",
        description="Capture a run's event counts as a JSON baseline, or check a run against "
        "one (exit 0 match, 1 drift, 2 usage error).",
    )
    bsub = baseline.add_subparsers(dest="baseline_command", required=True, metavar="ACTION")
    capture_help = "write a JSON baseline of a run's event counts"
    capture = bsub.add_parser("capture", help=capture_help, description=capture_help)
    _common(capture, json_help="also print the baseline as JSON (default: one line)", rows=False)
    capture.add_argument("-o", "--output", required=True, metavar="FILE", help="baseline file")
    check_help = "compare a run with a baseline (exit 0 match, 1 drift)"
    check = bsub.add_parser("check", help=check_help, description=check_help, epilog=WIDTH_HELP)
    _common(check)
    check.add_argument("--baseline", required=True, metavar="FILE", help="baseline file")
    report_help = "write a self-contained HTML report of a run (plots, tables, no scripts)"
    report = sub.add_parser("report", help=report_help, description=report_help)
    _common(report, json_help="print the report's path as JSON (default: one line)", rows=False)
    report.add_argument(
        "-o", "--output", metavar="FILE", help="HTML file (default: <run dir>/report.html)"
    )
    report.add_argument(
        "--baseline", metavar="FILE", help="also show the baseline status (default: none)"
    )
    report.add_argument(
        "--compare",
        nargs="+",
        default=[],
        metavar="RUN",
        help="overlay these runs' (or directories of runs') curves, differences against RUN "
        "as in `compare` (default: none)",
    )
    compare_cli.add_group_flags(report)
    report.add_argument(
        "--x-axis",
        choices=X_AXES,
        default="round",
        help="x axis of the per-round charts: round, or env-steps done (default: round)",
    )
    verify_help = "read every page of every file of a run, checksums verified (exit 2: damage)"
    _common(sub.add_parser("verify", help=verify_help, description=verify_help))
    compare_cli.add_parser(sub)
    return parser


def _run_info(run: Run) -> dict[str, Any]:
    info: dict[str, Any] = {"run_id": run.run_id, "path": str(run.path), "status": run.status}
    if run.recovery is not None:
        info["recovery"] = run.recovery
    info["degraded"] = run.degraded
    return info


def _emit(out: TextIO, run: Run, result: AnalysisResult, args: argparse.Namespace) -> None:
    if args.json:
        payload = {"run": _run_info(run), **result.to_json()}
        out.write(json.dumps(jsonable(payload), indent=2, allow_nan=False) + "\n")
        return
    console = console_for(out)
    console.print(f"[bold]run[/bold] {run.run_id} ({run.status.value}) — {run.path}")
    print_result(result, console, max_rows=args.max_rows)


def _baseline(args: argparse.Namespace, run: Run, out: TextIO) -> int:
    if args.baseline_command == "capture":
        data = write_baseline(run, args.output)
        if args.json:
            out.write(json.dumps(jsonable(data), indent=2, allow_nan=False) + "\n")
        else:
            total = sum(data["counts"].values())
            out.write(
                f"baseline of run {run.run_id} written to {args.output} "
                f"({len(data['counts'])} event types, {total} events)\n"
            )
        return EXIT_OK
    result = check_baseline(run, read_baseline(args.baseline))
    _emit(out, run, result, args)
    if not args.json:  # wrapped at the tables' width, like them
        verdict = ("OK: " if result.ok else "DRIFT: ") + result.message()
        console_for(out).print(verdict, markup=False, highlight=False)
    return EXIT_OK if result.ok else EXIT_DRIFT


def _report(args: argparse.Namespace, run: Run, out: TextIO) -> int:
    from esper_analysis.report import REPORT_NAME, write_report

    baseline = read_baseline(args.baseline) if args.baseline else None
    own = run.path.resolve()  # a directory of runs may hold the report's own run
    others = [r for r in compare_cli.expand_runs(args.compare) if r.path.resolve() != own]
    by = args.group
    if by is None and any(compare_cli.is_runs_dir(p) for p in args.compare):
        by = compare_cli.DIR_KEY  # a directory of runs is a group, as in `compare`
    path = write_report(
        run,
        args.output or run.path / REPORT_NAME,  # where `esper train --report` writes it
        baseline=baseline,
        baseline_source=args.baseline or "",
        compare_with=others,
        compare_by=by,
        unpaired=args.unpaired,
        x_axis=args.x_axis,
    )
    if args.json:
        out.write(json.dumps({"report": str(path), "run": jsonable(_run_info(run))}) + "\n")
    else:
        out.write(f"report of run {run.run_id} written to {path}\n")
    return EXIT_OK


def _verify(args: argparse.Namespace, run: Run, out: TextIO) -> int:
    result = verify_run(run)
    _emit(out, run, result, args)
    if result.damaged:
        bad = result.files.filter(pl.col("damage") != "")
        where = ", ".join(f"{run.path / f} ({d})" for f, d in bad.select("file", "damage").rows())
        raise CorruptFileError(f"damaged pages in {where}")
    return EXIT_OK


def _runs_under(path: Path) -> list[Path]:
    """Run directories directly under ``path`` when it is not a run itself (else none)."""
    if not path.is_dir() or is_run_dir(path):
        return []
    return [p for p in sorted(path.iterdir()) if p.is_dir() and is_run_dir(p)]


def _counts_of_runs(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``counts DIR_OF_RUNS``: one column of event counts per run (JSON: every run's counts)."""
    runs = load_runs(args.run)
    for run in runs:
        if run.recovery is not None:
            err.write(f"warning: {run.recovery.message}\n")
    results = []
    for run in runs:
        with corrupt_data_errors(run):
            results.append(event_counts(run))
    if args.json:
        payload = {
            "runs": [
                {"run": _run_info(r), **c.to_json()} for r, c in zip(runs, results, strict=True)
            ]
        }
        out.write(json.dumps(jsonable(payload), indent=2, allow_nan=False) + "\n")
        return EXIT_OK
    table = _per_run_table(runs, results)
    console = console_for(out)
    # Run names too long for one table at this width: the columns are numbered instead.
    numbered = not fits(table, console.width)
    if numbered:
        table.columns = ["type", *(f"#{i}" for i in range(1, len(runs) + 1))]
    console.print(f"[bold]{plural(len(runs), 'run')}[/bold] under {args.run}", highlight=False)
    for i, run in enumerate(runs, start=1):
        other_id = f" (run id {run.run_id})" if run.run_id != run.path.name else ""
        label = f"#{i} " if numbered else ""
        line = f"  {label}{run.path.name}{other_id}: {run.status.value}"
        console.print(line, markup=False, highlight=False)
    for part in rich_tables("Events per run", table, args.max_rows, width=console.width):
        console.print()
        console.print(part)
    return EXIT_OK


def _per_run_table(runs: Sequence[Run], results: Sequence[Counts]) -> pl.DataFrame:
    """Rows: event types (then the total); columns: one per run, in directory order."""
    types = [t for t in known_event_types() if any(c.of(t) for c in results)]
    data: dict[str, list[Any]] = {"type": [*types, "total"]}
    for run, counts in zip(runs, results, strict=True):
        data[_unique_name(run.path.name, data)] = [*(counts.of(t) for t in types), counts.total]
    return pl.DataFrame(data)


def _unique_name(name: str, taken: dict[str, Any]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}#{n}"
    return candidate


def _dispatch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.command == "compare":  # several runs: its own module
        return compare_cli.run_compare(args, out, err)
    several = _runs_under(Path(args.run))
    if several and args.command == "counts":
        return _counts_of_runs(args, out, err)
    if several:
        names = ", ".join(p.name for p in several[:MAX_NAMED_RUNS])
        more = f" and {len(several) - MAX_NAMED_RUNS} more" if len(several) > MAX_NAMED_RUNS else ""
        raise UsageError(
            f"{args.run} holds {len(several)} runs ({names}{more}), not one run: pass one of "
            f"them (e.g. {Path(args.run) / several[0].name}); 'counts' and 'compare' read several"
        )
    run = load_run(args.run)
    with corrupt_data_errors(run):  # a scan that hits bad data pages names the file
        if run.recovery is not None:
            err.write(f"warning: {run.recovery.message}\n")
        if args.command == "baseline":
            return _baseline(args, run, out)
        if args.command == "report":
            return _report(args, run, out)
        if args.command == "verify":
            return _verify(args, run, out)
        analysis, _ = ANALYSES[args.command]
        _emit(out, run, analysis(run), args)
    return EXIT_OK


def main(
    argv: Sequence[str] | None = None,
    prog: str = "esper analyze",
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run one analysis command; returns the exit code (never raises SystemExit)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = build_parser(prog)
    try:
        args = parse_args_suggesting(parser, list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse reports usage errors (2) and --help (0) this way
        return int(exc.code or 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            code = _dispatch(args, out, err)
        except UserError as exc:
            err.write(f"error: {exc}\n")
            code = exc.exit_code
        except OSError as exc:
            err.write(f"error: {exc}\n")
            code = EXIT_USAGE
    for w in caught:
        err.write(f"warning: {w.message}\n")
    return code
