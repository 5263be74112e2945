"""``esper analyze compare`` and the report's compared-runs section, on known runs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from esper_analysis.cli import main
from esper_analysis.compare import compare_runs
from esper_analysis.loader import load_run

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run

ROUNDS, ENVS = 3, 2


def _run(root: Path, run_id: str, reward: float, acc: float, *, episodes: bool = True) -> Path:
    """Episode reward ``reward + round + env`` and final accuracy ``acc + env``."""
    hub = open_run(root, run_id, level=TelemetryLevel.NORMAL, flush_interval_s=0.05)
    for r in range(ROUNDS if episodes else 0):
        for e in range(ENVS):
            hub.emit(
                ev.EpisodeFinished(
                    round=r,
                    env=e,
                    step=9,
                    final_val_acc=acc + e,
                    final_val_loss=0.5,
                    host_params=100,
                    params_added=10 * e,
                    seeds_germinated=1,
                    seeds_fossilized=e,
                    seeds_pruned=0,
                    episode_reward=reward + r + e,
                    rollbacks=0,
                    rollback_penalty=0.0,
                )
            )
    hub.close(RunStatus.FINISHED)
    return root / run_id


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("compare")
    return (
        _run(root, "ref", 1.0, 70.0),
        _run(root, "better", 1.5, 71.0),
        _run(root, "empty", 0.0, 0.0, episodes=False),
    )


def test_paired_differences_and_late_window(runs: tuple[Path, Path, Path]) -> None:
    result = compare_runs([load_run(runs[0]), load_run(runs[1])])
    paired = {row["metric"]: row for row in result.paired.to_dicts()}
    assert paired["reward"]["mean_diff"] == pytest.approx(0.5)
    assert paired["reward"]["std_err"] == pytest.approx(0.0)
    assert paired["reward"]["pairs"] == ROUNDS * ENVS and paired["reward"]["rounds_ahead"] == 3
    assert paired["final_acc"]["mean_diff"] == pytest.approx(1.0)
    ref = result.runs.to_dicts()[0]
    assert ref["late_from_round"] == 2 and ref["late_reward"] == pytest.approx(3.5)
    assert result.curves.height == 2 * ROUNDS


def test_cli_table_json_and_exit_codes(runs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["compare", str(runs[0]), str(runs[1])], stdout=out, stderr=err) == 0
    assert "Paired differences" in out.getvalue() and "better" in out.getvalue()
    out = io.StringIO()
    assert main(["compare", str(runs[0]), str(runs[1]), "--json"], stdout=out) == 0
    data = json.loads(out.getvalue())
    assert data["summary"]["reference"] == "ref" and len(data["paired"]) == 2
    err = io.StringIO()
    assert main(["compare", str(runs[0]), str(runs[2])], stdout=io.StringIO(), stderr=err) == 2
    assert "no finished episodes" in err.getvalue()
    err = io.StringIO()
    assert main(["compare", str(runs[0]), str(runs[0])], stderr=err) == 2
    assert "given twice" in err.getvalue()
    assert main(["compare", str(tmp_path / "nope")], stderr=io.StringIO()) == 2
    assert main(["compare"], stderr=io.StringIO()) == 2


def test_report_overlays_compared_runs(runs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    target = tmp_path / "r.html"
    args = ["report", str(runs[0]), "-o", str(target), "--compare", str(runs[1])]
    assert main(args, stdout=io.StringIO(), stderr=io.StringIO()) == 0
    text = target.read_text()
    assert "Compared runs" in text and 'data-series="better"' in text
