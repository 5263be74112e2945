"""The checkpoint and its ``checkpoint_saved`` event go together, even when interrupted.

A Ctrl-C that lands while the hub is flushing before a save used to leave a checkpoint on
disk with no event for it: the flush's interrupt was re-raised before the event was
emitted, so the run's last ``checkpoint_saved`` named an older checkpoint than the one
that resumes it (``test_ctrl_c_flushes_checkpoints_and_exits_130`` caught it under load).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from esper.config import Config
from esper.core.enums import TelemetryLevel
from esper.telemetry.events import CheckpointSaved
from esper.telemetry.hub import MemoryHub
from esper.training.checkpoint import load_checkpoint
from esper.training.recorder import Recorder
from esper.training.run import CheckpointLedger, _Saver


class _InterruptedFlushHub(MemoryHub):
    """A hub whose flush is interrupted (Ctrl-C while it waits for the writer)."""

    def flush(self) -> None:
        raise KeyboardInterrupt


class _Learner:
    def state_dict(self) -> dict[str, Any]:
        return {"round": 1}


def test_an_interrupted_flush_still_records_the_checkpoint_it_saved(tmp_path: Path) -> None:
    cfg = Config()
    hub = _InterruptedFlushHub("saver", level=TelemetryLevel.LIFECYCLE)
    ledger = CheckpointLedger()
    path = tmp_path / "checkpoint.pt"
    saver = _Saver(cfg, _Learner(), Recorder(hub, reward_family="contribution"), path, ledger)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        saver.round_completed(1, save_now=True, rollbacks=0)
    saved = [e for e in hub.events if isinstance(e, CheckpointSaved)]
    assert path.exists() and ledger.path == path and ledger.next_round == 1
    assert [(e.next_round, e.seq_position) for e in saved] == [(1, 0)]
    assert load_checkpoint(path, cfg)["next_round"] == 1
