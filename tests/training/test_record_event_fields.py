"""Training-side records and the events they become stay field-for-field identical (issue 15).

``PPOMetrics`` becomes ``ppo_update`` and ``RewardBreakdown`` becomes ``reward_computed``
by copying every field; a field added to one side only would be silently dropped or
left at a default, so the declarations are checked here (names, order and types).
"""

from __future__ import annotations

import msgspec

from esper.core.records import PPOMetrics, RewardBreakdown
from esper.telemetry import events as ev

ENVELOPE = {f.name for f in msgspec.structs.fields(ev.Event)}
#: reward_computed fields that are not in the breakdown: the context the emitter adds.
REWARD_CONTEXT = ("family", "op", "normalized")


def _payload(cls: type, skip: tuple[str, ...] = ()) -> list[tuple[str, object]]:
    return [
        (f.name, f.type)
        for f in msgspec.structs.fields(cls)
        if f.name not in ENVELOPE and f.name not in skip
    ]


def test_ppo_metrics_and_ppo_update_declare_the_same_fields() -> None:
    assert _payload(PPOMetrics) == _payload(ev.PpoUpdate)


def test_reward_breakdown_and_reward_computed_declare_the_same_components() -> None:
    assert _payload(RewardBreakdown) == _payload(ev.RewardComputed, REWARD_CONTEXT)
    event_names = {f.name for f in msgspec.structs.fields(ev.RewardComputed)}
    assert set(REWARD_CONTEXT) <= event_names
