"""``esper export tensorboard``: event files read back with TensorBoard's own reader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _analysis_support import N_ENVS, ROUNDS, Script

from esper.cli import main

EventAccumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator"
).EventAccumulator


def _read(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def exported(
    scripted: tuple[Path, Script], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, list[tuple[int, float]]]]:
    out = tmp_path_factory.mktemp("tb")
    assert main(["export", "tensorboard", str(scripted[0]), "-o", str(out)]) == 0
    return out, _read(out / "scripted")


def test_scalars_read_back_with_known_values(
    exported: tuple[Path, dict[str, list[tuple[int, float]]]], scripted: tuple[Path, Script]
) -> None:
    _, tags = exported
    script = scripted[1]
    means = [
        sum(script.episode_reward[(r, e)] for e in range(N_ENVS)) / N_ENVS for r in range(ROUNDS)
    ]
    reward = tags["round/mean_episode_reward"]
    assert [s for s, _ in reward] == list(range(ROUNDS))
    assert [v for _, v in reward] == pytest.approx(means, rel=1e-6)  # float32 on disk
    assert [v for _, v in tags["ppo/approx_kl"]] == pytest.approx([0.01, 0.02], rel=1e-6)
    assert [v for _, v in tags["ppo/explained_variance"]] == pytest.approx([0.5, 0.7], rel=1e-6)
    # round 0: A fossilized, B pruned; round 1: C training, D germinated (the script)
    assert tags["seeds/FOSSILIZED"] == [(0, 1.0), (1, 0.0)]
    assert tags["seeds/PRUNED"] == [(0, 1.0), (1, 0.0)]
    assert tags["seeds/TRAINING"] == [(0, 0.0), (1, 1.0)]
    assert tags["seeds/GERMINATED"] == [(0, 0.0), (1, 1.0)]
    for tag in ("reward/total", "reward/attribution", "round/eps", "round/mean_final_accuracy"):
        assert len(tags[tag]) == ROUNDS, tag


def test_reexport_refused_without_force(
    exported: tuple[Path, dict[str, list[tuple[int, float]]]],
    scripted: tuple[Path, Script],
    capsys: pytest.CaptureFixture[str],
) -> None:
    out, before = exported
    assert main(["export", "tensorboard", str(scripted[0]), "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    args = ["export", "tensorboard", str(scripted[0]), "-o", str(out), "--force"]
    assert main(args) == 0
    assert len(list((out / "scripted").glob("events.out.tfevents.*"))) == 1
    assert _read(out / "scripted") == before


def test_missing_extra_is_a_one_line_error(scripted: tuple[Path, Script], tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['tensorboard'] = None\n"
        "from esper.cli import main\n"
        f"sys.exit(main(['export', 'tensorboard', {str(scripted[0])!r}, '-o', {str(tmp_path)!r}]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and 'pip install -c constraints.txt -e ".[tensorboard]"' in lines[0], (
        lines
    )
    assert not any(tmp_path.iterdir())


def test_runs_and_export_never_import_torch(scripted: tuple[Path, Script], tmp_path: Path) -> None:
    run = str(scripted[0])
    code = (
        "import sys\nfrom esper.cli import main\n"
        f"assert main(['runs', {run!r}, '--json']) == 0\n"
        f"assert main(['export', 'tensorboard', {run!r}, '-o', {str(tmp_path)!r}]) == 0\n"
        "print('TORCH:' + ','.join(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "TORCH:"


def test_the_config_and_what_was_run_go_along_as_text(tmp_path: Path) -> None:
    """Issue 49: the event files alone did not say what they measured."""
    import json

    import msgspec
    from _analysis_support import run_started

    from esper.config import Config
    from esper.core.enums import RunStatus, TelemetryLevel
    from esper.telemetry import events as ev
    from esper.telemetry.hub import open_run

    hub = open_run(tmp_path / "runs", "cfg-run", level=TelemetryLevel.NORMAL)
    argv = json.dumps(["/bin/esper", "train", "--seed", "7"])
    hub.emit(msgspec.structs.replace(run_started(), config_json=Config().to_json(), argv=argv))
    hub.emit(
        ev.RoundFinished(
            round=0, wall_s=1.0, eps=1.0, mean_episode_reward=0.0, mean_final_accuracy=50.0,
            rollbacks=0, train_ms=0.0, val_ms=0.0, policy_ms=0.0, action_ms=0.0, ppo_ms=0.0,
        )
    )  # fmt: skip
    hub.close(RunStatus.FINISHED)
    out = tmp_path / "tb"
    assert main(["export", "tensorboard", str(tmp_path / "runs" / "cfg-run"), "-o", str(out)]) == 0
    acc = EventAccumulator(str(out / "cfg-run"))
    acc.Reload()
    texts = {
        tag: acc.Tensors(tag)[0].tensor_proto.string_val[0].decode()
        for tag in acc.Tags()["tensors"]
    }
    assert set(texts) == {"run/summary", "run/config"}
    assert "| seed | 7 |" in texts["run/summary"] and "esper train --seed 7" in texts["run/summary"]
    config = json.loads("\n".join(line[4:] for line in texts["run/config"].splitlines()))
    assert config == json.loads(Config().to_json())
    assert "round/mean_final_accuracy" in acc.Tags()["scalars"]
