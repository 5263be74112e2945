"""The demo stream uses the real lifecycle rules, not copies (issue 15)."""

from __future__ import annotations

from esper.policy import masks
from esper.telemetry import demo_env


def test_demo_germination_blocking_is_the_policy_mask_rule() -> None:
    assert frozenset(masks.GERMINATE_BLOCKING) == demo_env._BLOCKS_GERMINATION
    assert masks.GERMINATE_BLOCKING is demo_env.GERMINATE_BLOCKING
