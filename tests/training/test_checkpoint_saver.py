"""The checkpoint and its ``checkpoint_saved`` event go together, even when interrupted.

A Ctrl-C that lands while the hub is flushing before a save used to leave a checkpoint on
disk with no event for it (``test_ctrl_c_flushes_checkpoints_and_exits_130`` caught it
under load). A flush that did not complete now fails the checkpoint (it would point past
events not yet durable, issue 48): neither is written, and the round stays pending
until the way out saves it, flush first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from esper.config import Config
from esper.core.enums import TelemetryLevel
from esper.telemetry.events import CheckpointSaved
from esper.telemetry.memory_hub import MemoryHub
from esper.training.loop.checkpoint import load_checkpoint
from esper.training.loop.recorder import Recorder
from esper.training.run import CheckpointLedger, _Saver


class _InterruptedFlushHub(MemoryHub):
    """A hub whose first flush is interrupted (Ctrl-C while it waits for the writer)."""

    flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        if self.flushes == 1:
            raise KeyboardInterrupt


class _Learner:
    def state_dict(self) -> dict[str, Any]:
        return {"round": 1}


def test_an_interrupted_flush_fails_the_checkpoint_until_the_way_out_saves_it(
    tmp_path: Path,
) -> None:
    cfg = Config()
    hub = _InterruptedFlushHub("saver", level=TelemetryLevel.LIFECYCLE)
    ledger = CheckpointLedger()
    path = tmp_path / "checkpoint.pt"
    saver = _Saver(cfg, _Learner(), Recorder(hub, reward_family="contribution"), path, ledger)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        saver.round_completed(1, save_now=True, rollbacks=0)
    assert not path.exists() and ledger.path is None
    assert not [e for e in hub.events if isinstance(e, CheckpointSaved)]
    saver.save_pending_quietly()  # the run's way out: flushed, then saved
    saved = [e for e in hub.events if isinstance(e, CheckpointSaved)]
    assert path.exists() and ledger.path == path and ledger.next_round == 1
    assert [(e.next_round, e.seq_position) for e in saved] == [(1, 0)]
    assert load_checkpoint(path, cfg)["next_round"] == 1
