"""What a run with no config does: the growth that pays on the narrow default host
(docs/training.md, "What a default run learns")."""

from __future__ import annotations

from pathlib import Path

from esper.config import Config, with_overrides
from esper.core.enums import TelemetryLevel
from esper.data.tasks import load_task
from esper.telemetry import events as ev
from esper.telemetry.memory_hub import MemoryHub
from esper.training.run import train


def test_a_default_run_grows_conv_heavy_seeds_that_advance_on_their_own(tmp_path: Path) -> None:
    cfg = with_overrides(
        Config(), {"run.rounds": 1, "run.n_envs": 2, "run.episode_length": 16,
                   "telemetry.dir": str(tmp_path)},
    )  # fmt: skip
    assert (cfg.host.base_channels, cfg.reward.family.value) == (4, "accuracy")
    hub = MemoryHub(level=TelemetryLevel.LIFECYCLE)
    train(cfg, data=load_task(cfg.task, seed=0), telemetry=hub, save=tmp_path / "ckpt")
    germinated = hub.of_type(ev.SeedGerminated)
    assert germinated, "the untrained policy starts as an eager grower"
    assert {(g.blueprint, g.style, g.tempo, g.alpha_target) for g in germinated} == {
        ("conv_heavy", 0, 5, 1.0)
    }
    assert {g.slot for g in germinated} <= {"r0c0", "r1c0"}
    changes = hub.of_type(ev.SeedStageChanged)
    advanced = [c for c in changes if c.from_stage in ("GERMINATED", "TRAINING")]
    assert advanced and {c.initiator for c in advanced} == {"system"}  # gates pass alone
    blended = {c.seed_id for c in changes if c.to_stage == "BLENDING"}
    assert {p.seed_id for p in hub.of_type(ev.SeedPruned)} <= blended  # none before blending
