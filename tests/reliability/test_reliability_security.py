"""Security: checkpoints never unpickle code, and user-given ids never escape a directory.

The crafted checkpoint carries an object whose ``__reduce__`` would create a marker
file when unpickled. The test first proves the payload is live (an unsafe
``torch.load(weights_only=False)`` does create the marker), then that Esper refuses the
file, through the API and the real CLI, and the marker never appears.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from _reliability_support import assert_user_error, run_esper, train_args, write_small_config

from esper.cli import main as esper_main
from esper.config import load_config, with_overrides
from esper.errors import CheckpointError, UserError
from esper.telemetry.hub import open_run
from esper.telemetry.memory_hub import MemoryHub
from esper.telemetry.paths import resolve_run_dir, validate_run_id
from esper.training.loop.checkpoint import CHECKPOINT_FORMAT, compat_fingerprint, load_checkpoint

SRC = Path(__file__).resolve().parents[2] / "src"


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: code execution, observable as a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def _crafted(tmp: Path, marker: Path) -> tuple[Path, Any]:
    """A checkpoint that matches the CLI's config in every checked field, plus the payload."""
    cfg = with_overrides(
        load_config(write_small_config(tmp)),
        {"run.n_envs": 2, "run.episode_length": 4, "task.name": "digits"},
    )
    path = tmp / "evil.pt"
    torch.save(
        {
            "format": CHECKPOINT_FORMAT,
            "run_id": "evil",
            "next_round": 1,
            "seq_position": 0,
            "compat": compat_fingerprint(cfg),
            "learner": {"policy": _Payload(marker)},
        },
        path,
    )
    return path, cfg


def test_the_payload_is_live_without_weights_only(tmp_path: Path) -> None:
    """Guards the tests below against a payload that would never fire anyway."""
    marker = tmp_path / "pwned-unsafe"
    path, _ = _crafted(tmp_path, marker)
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_crafted_checkpoint_is_rejected_by_the_api(tmp_path: Path) -> None:
    marker = tmp_path / "pwned-api"
    path, cfg = _crafted(tmp_path, marker)
    with pytest.raises(CheckpointError, match="refused to load") as info:
        load_checkpoint(path, cfg)
    assert "weights_only=True" in str(info.value) and "\x1b[" not in str(info.value)
    assert not marker.exists()


def test_crafted_checkpoint_is_rejected_by_the_cli(tmp_path: Path) -> None:
    marker = tmp_path / "pwned-cli"
    path, _ = _crafted(tmp_path, marker)
    args = train_args(write_small_config(tmp_path), tmp_path / "tel", "x", "--resume", str(path))
    assert_user_error(run_esper(args), "refused to load", str(path), "pickled python objects")
    assert not marker.exists()
    assert not (tmp_path / "tel").exists()


def _torch_load_calls(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "load"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "torch"
    ]


def test_every_torch_load_in_the_package_is_weights_only() -> None:
    calls = []
    for path in sorted(SRC.rglob("*.py")):
        for call in _torch_load_calls(ast.parse(path.read_text(), filename=str(path))):
            kw = {k.arg: k.value for k in call.keywords}
            safe = isinstance(kw.get("weights_only"), ast.Constant) and (
                kw["weights_only"].value is True  # type: ignore[union-attr]
            )
            calls.append((f"{path.relative_to(SRC)}:{call.lineno}", safe))
    assert calls, "the checkpoint loader calls torch.load somewhere"
    assert [where for where, safe in calls if not safe] == []


# --- ids and paths -----------------------------------------------------------------------

ESCAPES = ["..", "../x", "x/../..", "/etc", "a/b", "", ".x", "x\x00y", "x" * 129, "~root"]


@pytest.mark.parametrize("run_id", ESCAPES)
def test_run_ids_that_could_escape_are_rejected_everywhere(tmp_path: Path, run_id: str) -> None:
    with pytest.raises(UserError, match="invalid run id"):
        validate_run_id(run_id)
    with pytest.raises(UserError, match="invalid run id"):
        resolve_run_dir(tmp_path, run_id)
    with pytest.raises(UserError, match="invalid run id"):
        open_run(tmp_path / "tel", run_id, level=MemoryHub().level)
    assert not (tmp_path / "tel").exists()


def test_a_symlinked_run_directory_cannot_lead_outside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tel, outside = tmp_path / "tel", tmp_path / "outside"
    tel.mkdir()
    outside.mkdir()
    (tel / "sneaky").symlink_to(outside, target_is_directory=True)
    code = esper_main(train_args(write_small_config(tmp_path), tel, "sneaky", rounds=1))
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "outside the telemetry directory" in lines[0]
    assert os.listdir(outside) == []


def test_resume_cannot_continue_into_a_foreign_run_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--continue-run`` takes the run id from the checkpoint: it is validated too."""
    cfg = with_overrides(
        load_config(write_small_config(tmp_path)),
        {"run.n_envs": 2, "run.episode_length": 4, "task.name": "digits"},
    )
    from esper.training.loop.checkpoint import save_checkpoint

    ckpt = tmp_path / "ckpt.pt"
    save_checkpoint(
        ckpt,
        {
            "run_id": "../../escaped",
            "next_round": 1,
            "seq_position": 0,
            "compat": compat_fingerprint(cfg),
            "learner": {},
        },
    )
    args = train_args(
        write_small_config(tmp_path), tmp_path / "tel", "x", "--resume", str(ckpt), "--continue-run"
    )
    code = esper_main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "invalid run id" in lines[0] and "escaped" in lines[0]
    assert not (tmp_path.parent / "escaped").exists()
