"""The demo (also the analysis layer's synthetic runs) uses the real lifecycle rules."""

from __future__ import annotations

import itertools

from esper.core.constants import SUCCESS_PATH, TRANSITIONS
from esper.core.enums import SeedStage
from esper.policy import masks
from esper.telemetry import demo_env


def test_demo_germination_blocking_is_the_policy_mask_rule() -> None:
    assert frozenset(masks.GERMINATE_BLOCKING) == demo_env._BLOCKS_GERMINATION
    assert masks.GERMINATE_BLOCKING is demo_env.GERMINATE_BLOCKING


def test_demo_occupying_prunable_retargetable_are_the_policy_mask_rules() -> None:
    assert frozenset(masks.OCCUPYING) == demo_env._OCCUPYING
    assert frozenset(masks.PRUNABLE) == demo_env._PRUNABLE
    assert masks.RETARGETABLE is demo_env.RETARGETABLE


def test_success_path_follows_the_transition_table() -> None:
    assert SUCCESS_PATH[0] in TRANSITIONS[SeedStage.DORMANT]
    assert all(b in TRANSITIONS[a] for a, b in itertools.pairwise(SUCCESS_PATH))
    assert TRANSITIONS[SUCCESS_PATH[-1]] == frozenset()  # terminal
