"""Terminal output of ``esper analyze``: legible at 80-100 columns, validated flags, many runs.

Issue 13: at 100 columns every cell of ``esper analyze ppo`` became ``0.…``;
``--max-rows -5`` printed wrong output; ``counts DIR_OF_RUNS`` was refused.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from _analysis_tables import all_headers, folded
from conftest import copy_run
from esper_analysis import load_run
from esper_analysis.cli import ANALYSES, main
from esper_analysis.errors import AnalysisError
from esper_analysis.ppo import ppo_health
from esper_analysis.tables import format_value, print_result
from rich.cells import cell_len
from rich.console import Console

NARROW_WIDTHS = (80, 100)
ELLIPSIS = "…"


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _render(name: str, run_dir: Path, width: int) -> str:
    out = io.StringIO()
    analysis, _ = ANALYSES[name]
    print_result(analysis(load_run(run_dir)), Console(file=out, width=width), max_rows=40)
    return out.getvalue()


@pytest.mark.parametrize("width", NARROW_WIDTHS)
@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_every_shown_cell_is_complete_at_narrow_widths(
    scripted_run: Path, name: str, width: int
) -> None:
    text = _render(name, scripted_run, width)
    assert ELLIPSIS not in text, text
    assert max(cell_len(line) for line in text.splitlines()) <= width
    result = ANALYSES[name][0](load_run(scripted_run))
    shown = all_headers(text) | folded(text)  # headers broken at "_", columns in titles
    for key, _, frame in result.tables():
        if key in result.TEXT_SKIP:
            continue
        columns = [c for c in result.TEXT_COLUMNS.get(key, frame.columns) if c in frame.columns]
        for column in columns:
            # a header (maybe broken at "_"), said in a title, or a row of a one-row table
            assert column in shown or f"│ {column} " in text, f"{name}.{key}: {column} missing"
            for value in frame.head(40)[column]:
                assert format_value(value) in text, f"{name}.{key}.{column}: {value!r}"


def test_ppo_numbers_are_whole_at_100_columns(scripted_run: Path) -> None:
    """The issue's case: every ppo cell read ``0.…`` at 100 columns."""
    updates = ppo_health(load_run(scripted_run)).updates
    text = _render("ppo", scripted_run, 100)
    for column in ("policy_loss", "value_loss", "approx_kl", "explained_variance", "lr"):
        for value in updates[column]:
            assert format_value(value) in text


@pytest.mark.parametrize("bad", ["-5", "0", "many"])
def test_max_rows_must_be_a_positive_whole_number(
    scripted_run: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli("ppo", str(scripted_run), "--max-rows", bad)
    assert code == 2 and out == ""
    assert "argument --max-rows" in capsys.readouterr().err  # argparse's own usage error


def test_print_result_refuses_a_non_positive_row_limit(scripted_run: Path) -> None:
    """For commands that parse ``--max-rows`` on their own."""
    with pytest.raises(AnalysisError, match="--max-rows must be >= 1, got -5"):
        print_result(ppo_health(load_run(scripted_run)), Console(file=io.StringIO()), max_rows=-5)


def test_counts_of_a_directory_of_runs_has_one_column_per_run(
    scripted_run: Path, tmp_path: Path
) -> None:
    root = tmp_path / "runs"
    copy_run(scripted_run, root / "first")
    copy_run(scripted_run, root / "second")
    total = json.loads(_cli("counts", "--json", str(scripted_run))[1])["summary"]["total"]
    code, out, err = _cli("counts", str(root))
    assert code == 0, err
    assert "2 runs under" in out and "first" in out and "second" in out
    total_line = next(line for line in out.splitlines() if "total" in line)
    assert total_line.count(str(total)) == 2
    code, out, _ = _cli("counts", "--json", str(root))
    runs = json.loads(out)["runs"]
    assert [r["run"]["path"] for r in runs] == [str(root / "first"), str(root / "second")]
    assert [r["summary"]["total"] for r in runs] == [total, total]


def test_a_one_run_analysis_given_a_directory_of_runs_says_how(
    scripted_run: Path, tmp_path: Path
) -> None:
    root = tmp_path / "runs"
    copy_run(scripted_run, root / "first")
    copy_run(scripted_run, root / "second")
    code, out, err = _cli("ppo", str(root))
    assert code == 2 and out == ""
    assert "holds 2 runs (first, second)" in err
    assert str(root / "first") in err


def test_negative_zero_prints_as_zero() -> None:
    from esper_analysis.tables import format_value

    assert format_value(-0.0) == "0" and format_value(0.0) == "0"
    assert format_value(-0.25) == "-0.25" and format_value(-1e-5) == "-1.000e-05"


def test_numbers_read_as_numbers_and_a_run_without_family_names_its_host(
    scripted_run: Path,
) -> None:
    """Issue 49: parameter counts printed as 1.027e+04, and ``analyze hosts`` of a run
    without a family printed a row with a blank name."""
    assert format_value(10270.0) == "10270" and format_value(250000.5) == "250000"
    assert format_value(1.5e6) == "1.500e+06" and format_value(0.5) == "0.5"
    code, out, _ = _cli("hosts", str(scripted_run), "--json")
    assert code == 0
    assert [row["host"] for row in json.loads(out)["by_host"]] == ["(no family)"]
