"""The realistic event mix of ``emit.py`` and ``writer.py``: a real normal-level run's events.

A short real trainer run (digits preset, 4 envs, level ``normal``) is recorded into a
:class:`~esper.telemetry.memory_hub.MemoryHub`, so the mix, the payloads (config JSON, lists,
NaNs) and the proportions are exactly what ``train()`` emits: env_step, action_taken,
reward_computed and counterfactual_computed dominate. Benchmarks then emit *unstamped
copies* of those events, cycling through the recorded sequence: a hub refuses an event
that was already emitted, and copies are made before any timing starts.
"""

from __future__ import annotations

import collections
import itertools
import tempfile
from pathlib import Path
from typing import Any

import _trainer as T
import msgspec

from esper.core.enums import TelemetryLevel
from esper.telemetry.events import EVENT_LEVELS, UNSTAMPED_SEQ, Event, event_tag
from esper.telemetry.memory_hub import MemoryHub
from esper.training.run import train

#: The run whose events make the mix (small: a few seconds).
MIX_OVERRIDES: dict[str, Any] = {"run.episode_length": 5, "run.rounds": 2}
#: Once-per-run events: a long run has one of each, so they are left out of the cycled
#: mix (in a 2-round recording they would be over-represented a hundredfold). The final
#: writer_stats is the memory hub's own close record.
ONCE_PER_RUN = frozenset({"run_started", "run_finished", "writer_stats"})


def record_mix(*, quick: bool = False, n_envs: int = 4) -> list[Event]:
    """Events of a real normal-level trainer run, in emission order (per-round ones)."""
    cfg = T.bench_config(
        "digits",
        n_envs=n_envs,
        level="normal",
        threads=1,
        quick=quick,
        overrides=None if quick else MIX_OVERRIDES,
    )
    hub = MemoryHub("mix", level=TelemetryLevel.NORMAL)
    with tempfile.TemporaryDirectory(prefix="esper-mix-") as scratch:  # the checkpoint
        train(cfg, data=T.load_data(cfg), telemetry=hub, save=Path(scratch) / "ckpt.pt")
    return [e for e in hub.events if event_tag(type(e)) not in ONCE_PER_RUN]


def fresh_copies(mix: list[Event], n: int) -> list[Event]:
    """``n`` unstamped copies, cycling through the mix (new objects, ready to emit)."""
    replace = msgspec.structs.replace
    return [
        replace(e, run_id="", seq=UNSTAMPED_SEQ, ts_ns=0, rank=0)
        for e in itertools.islice(itertools.cycle(mix), n)
    ]


def of_level(mix: list[Event], level: TelemetryLevel) -> list[Event]:
    """The events of exactly ``level`` (e.g. the normal-level ones a lifecycle hub drops)."""
    return [e for e in mix if EVENT_LEVELS[type(e)] == level]


def composition(events: list[Event]) -> dict[str, float]:
    """Share of each event type, largest first."""
    counts = collections.Counter(event_tag(type(e)) for e in events)
    total = sum(counts.values()) or 1
    return {t: n / total for t, n in counts.most_common()}
