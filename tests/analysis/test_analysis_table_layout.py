"""Tables legible in any terminal or pipe (issue 39): every ``esper analyze`` command and
``esper runs`` fit ``COLUMNS`` (80 here) when the output is a pipe or a file, and at most
100 columns there without it; a split table repeats its key columns in every part and
keeps the columns read together (expected, got, status) in one part."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _analysis_support import Script
from conftest import copy_run
from esper_analysis.baseline import capture_baseline
from esper_analysis.cli import ANALYSES, main
from esper_analysis.loader import load_run
from esper_analysis.tables import PIPE_WIDTH, output_width
from rich.cells import cell_len
from test_analysis_compare import _run as compare_run

from esper.cli import main as esper_main

WIDTH = 80
_PART = re.compile(r"^(?P<title>.+?) \((?P<n>\d+)/(?P<of>\d+)\)\s*$")
LONG_IDS = ("digits-ppo-s0-20251127-171538", "digits-eager-s0-20251127-171538")


def _cli(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    assert code in (0, 1), err.getvalue()
    return out.getvalue()


def _widest(text: str) -> int:
    return max(cell_len(line) for line in text.splitlines())


def parts(text: str) -> dict[str, list[list[str]]]:
    """Every split table's parts: title -> the column names of each part, in order."""
    found: dict[str, list[list[str]]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _PART.match(line)
        if m is None:
            continue
        start = i  # a title wider than its table wraps: its lines up to a blank one
        while start > 0 and lines[start - 1].strip() and not lines[start - 1].startswith("└"):
            start -= 1
        title = " ".join(ln.strip() for ln in [*lines[start:i], m["title"]])
        header = next(ln for ln in lines[i + 1 :] if ln.startswith("┃"))
        names = [c.strip() for c in header.strip("┃").split("┃")]
        found.setdefault(title, []).append(names)
    return found


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
    assert all(p[:4] == ["round", "env", "slot", "seed_id"] for p in seeds), seeds
    runs = split["Runs (late = last third of each run's rounds)"]
    assert len(runs) > 1 and all(p[0] == "run" for p in runs), runs
    for title, columns in split.items():
        for group in (("expected", "got"), ("mean_diff", "std_err")):
            holding = [p for p in columns if set(group) & set(p)]
            assert all(set(group) <= set(p) for p in holding), (title, columns)
    counted = split["Event counts against the baseline"]
    assert all(p[0] == "type" for p in counted)
    assert any({"expected", "got", "delta", "status"} <= set(p) for p in counted), counted


def test_paired_differences_repeat_run_and_metric(
    long_named: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))  # long run ids: the paired table splits
    text = _cli("compare", *map(str, long_named))
    paired = parts(text)["Paired differences against the reference, by (round, env)"]
    assert len(paired) > 1 and all(p[:2] == ["run", "metric"] for p in paired), paired


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
    assert "contribution: — the seed is still alive" in flat
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
