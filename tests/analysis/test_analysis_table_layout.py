"""Tables legible in any terminal or pipe (issue 39): every ``esper analyze`` command and
``esper runs`` fit ``COLUMNS`` (80 here) when the output is a pipe or a file, and at most
100 columns there without it; a split table repeats its key columns in every part and
keeps the columns read together (expected, got, status) in one part."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _analysis_support import Script
from _analysis_tables import header_names, parts
from conftest import copy_run
from esper_analysis.baseline import capture_baseline
from esper_analysis.cli import ANALYSES, main
from esper_analysis.loader import load_run
from esper_analysis.tables import PIPE_WIDTH, output_width
from rich.cells import cell_len
from test_analysis_compare import _run as compare_run

from esper.cli import main as esper_main

WIDTH = 80
LONG_IDS = ("digits-ppo-s0-20251127-171538", "digits-eager-s0-20251127-171538")


def _cli(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    assert code in (0, 1), err.getvalue()
    return out.getvalue()


def _widest(text: str) -> int:
    return max(cell_len(line) for line in text.splitlines())


@pytest.fixture(scope="module")
def drifting_baseline(
    scripted: tuple[Path, Script], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The scripted run's baseline, with counts and the config changed: every row drifts."""
    data = capture_baseline(load_run(scripted[0]))
    data["fingerprint"]["seed"] = 8
    data["counts"] = {k: v + 1 for k, v in data["counts"].items()}
    path = tmp_path_factory.mktemp("baseline") / "b.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def long_named(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("long")
    return compare_run(root, LONG_IDS[0], 1.0, 70.0), compare_run(root, LONG_IDS[1], 1.5, 71.0)


def _commands(run: Path, baseline: Path, long_named: tuple[Path, Path]) -> list[list[str]]:
    return [
        *([name, str(run)] for name in sorted(ANALYSES)),
        ["baseline", "check", str(run), "--baseline", str(baseline)],
        ["compare", *map(str, long_named)],
        ["counts", str(long_named[0].parent)],
    ]


def test_every_analysis_fits_columns_in_a_pipe_and_repeats_its_keys(
    scripted: tuple[Path, Script],
    drifting_baseline: Path,
    long_named: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))  # StringIO is no terminal: a pipe's case
    split: dict[str, list[list[str]]] = {}
    for argv in _commands(scripted[0], drifting_baseline, long_named):
        text = _cli(*argv)
        assert _widest(text) <= WIDTH, (argv, text)
        assert "…" not in text, argv
        split.update(parts(text))
    seeds = split["Seeds (germination to end)"]
    assert len(seeds) > 1
    # (round, env) tells the scripted seeds apart: only those keys repeat in every part
    assert all(p[:2] == ["round", "env"] and "slot" not in p[2:3] for p in seeds[1:]), seeds
    runs = split["Runs (late = last third of each run's rounds)"]
    assert len(runs) > 1 and all(p[0] == "run" for p in runs), runs
    for title, columns in split.items():
        for group in (("expected", "got"), ("mean_diff", "ci_low", "ci_high", "std_err")):
            holding = [p for p in columns if set(group) & set(p)]
            assert all(set(group) <= set(p) for p in holding), (title, columns)
    counted = split["Event counts against the baseline"]
    assert all(p[0] == "type" for p in counted)
    assert any({"expected", "got", "delta", "status"} <= set(p) for p in counted), counted


def test_paired_differences_say_constant_columns_once(
    long_named: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One other run and one pairing: said once under the title (issue 49), so the
    differences fit 80 columns in one table, rounds_ahead beside rounds."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    text = _cli("compare", *map(str, long_named))
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("Each run minus the reference"))
    said = " ".join(lines[at : at + 2])
    assert f"run {LONG_IDS[1]}" in said and "pairing paired by (round, env)" in said
    names = header_names(lines, at)
    assert names[0] == "metric" and "run" not in names and "pairing" not in names
    assert {"mean_diff", "ci_low", "ci_high", "std_err", "rounds_ahead", "rounds"} <= set(names)


def test_lifecycles_at_80_columns_repeat_only_the_keys_that_tell_rows_apart(
    scripted: tuple[Path, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 parts for the scripted seeds table, not 5 (issue 49: up to 8 parts of 1-2 value
    columns, each repeating round, env, slot, seed_id and blueprint)."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    seeds = parts(_cli("lifecycles", str(scripted[0])))["Seeds (germination to end)"]
    assert len(seeds) <= 3
    assert all(p[:2] == ["round", "env"] for p in seeds)
    assert sum(len(p) - 2 for p in seeds) == 11  # every other column once


def test_a_one_row_table_too_wide_is_printed_down(
    scripted: tuple[Path, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rollback was 4 tables at 80 columns: a one-row table is field / value."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    text = _cli("rollbacks", str(scripted[0]))
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("Rollbacks that did not reach"))
    assert header_names(lines, at) == ["field", "value"]
    assert "│ penalized_step " in text and "outcome (1/2)" not in text


def test_counts_of_a_directory_is_one_table_with_numbered_runs(
    long_named: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    text = _cli("counts", str(long_named[0].parent))
    assert "Events per run\n" in text or "Events per run " in text
    assert not parts(text)  # one table, not one per run
    for i, run_id in enumerate(sorted(LONG_IDS), start=1):
        assert f"#{i} {run_id}: finished" in text
    header = next(ln for ln in text.splitlines() if ln.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == ["type", "#1", "#2"]


def test_contribution_legend_explains_dash_and_nan(
    scripted: tuple[Path, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    text = _cli("lifecycles", str(scripted[0]))
    flat = " ".join(text.split())
    assert "contribution_pp (accuracy points the seed adds): — the seed is still alive" in flat
    assert "nan: it ended before a counterfactual measured it" in flat


def test_esper_runs_fits_80_columns(
    scripted: tuple[Path, Script],
    long_named: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    root = long_named[0].parent
    assert esper_main(["runs", str(root), str(scripted[0])]) == 0
    text = capsys.readouterr().out
    assert _widest(text) <= WIDTH and "…" not in text
    for run_id in (*LONG_IDS, "scripted"):
        assert run_id in text  # whole ids, statuses and dates, never "digi…"
    assert "finished" in text and "started (UTC)" in text
    split = parts(text)  # long ids at 80 columns: split, each part led by the id
    assert split and all(p[0] == "id" for ps in split.values() for p in ps), split


def test_output_width_rules() -> None:
    pipe = io.StringIO()
    assert output_width(pipe, {}) == PIPE_WIDTH <= 100
    assert output_width(pipe, {"COLUMNS": "132"}) == 132
    assert output_width(pipe, {"COLUMNS": "wide"}) == PIPE_WIDTH  # not a number: ignored
    assert output_width(pipe, {"COLUMNS": "0"}) == PIPE_WIDTH


def test_a_real_pipe_honours_columns(scripted: tuple[Path, Script], tmp_path: Path) -> None:
    """``COLUMNS=80 esper analyze lifecycles RUN > file`` and the same without COLUMNS."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    for columns, limit in (("80", 80), ("", PIPE_WIDTH)):
        target = tmp_path / f"out{columns}.txt"
        with target.open("w") as out:
            proc = subprocess.run(
                [sys.executable, "-m", "esper_analysis", "lifecycles", str(scripted[0])],
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                env={**env, "COLUMNS": columns} if columns else env,
                timeout=120,
                check=False,
            )
        assert proc.returncode == 0, proc.stderr
        text = target.read_text()
        assert WIDTH - 10 < _widest(text) <= limit, (columns, _widest(text))


def test_a_copy_under_another_name_keeps_its_id_in_the_listing(
    scripted: tuple[Path, Script], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    copy_run(scripted[0], tmp_path / "runs" / "renamed")
    text = _cli("counts", str(tmp_path / "runs"))
    assert "1 run under" in text and "renamed (run id scripted): finished" in text
