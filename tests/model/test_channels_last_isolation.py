"""Regression: seeds in TRAINING on a channels_last CNN must train (no native crash).

torch's CPU GroupNorm backward segfaults on a channels_last input that does not require
grad, which is what an isolated seed sees; ``SeedGroupNorm`` works around it. The check
runs in a subprocess so a regression fails this test instead of killing pytest.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import torch
    from esper.config import Config
    from esper.core.constants import CNN_BLUEPRINTS
    from esper.core.enums import GerminationStyle, Initiator
    from esper.data.tasks import load_task
    from esper.model import build_model

    torch.set_num_threads(1)
    cfg = Config()
    data = load_task(cfg.task, seed=0)
    x = data.train_x[:32].contiguous(memory_format=torch.channels_last)
    y = data.train_y[:32]
    for bp in CNN_BLUEPRINTS:
        m = build_model(cfg.host, data.spec, seed=0).to(memory_format=torch.channels_last)
        for slot in m.slot_ids:
            m.germinate(slot, bp, GerminationStyle.LINEAR_ADD, 3, 1.0, seed_id=slot,
                        current_acc=0.0, initiator=Initiator.POLICY)
            m.advance(slot, initiator=Initiator.POLICY)
        torch.nn.functional.cross_entropy(m(x), y).backward()
    print("ok")
    """
)


def test_training_seeds_backward_on_channels_last_cpu() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.strip() == "ok"
