"""The eager grower: the heuristic's rules, but it germinates whenever a slot is free.

It measures how much accuracy seeds can add when growth is never held back: on the
learning presets it is the strongest baseline (docs/training.md). What it germinates,
in which slots and how it blends are ``[policy.eager]`` keys
(:class:`esper.config.EagerConfig`); pruning, fossilizing, stall and rotation penalties
are the heuristic's ``[policy]`` keys.
"""

from __future__ import annotations

from esper.config import PolicyConfig
from esper.policy.actions import ActionSpace
from esper.policy.heuristic import Growth, HeuristicPolicy
from esper.policy.signals import SignalTracker


class EagerPolicy(HeuristicPolicy):
    """Germinate in the first free slot of ``growth.slot_order`` at every decision that
    no other rule claims; everything else as :class:`HeuristicPolicy`."""

    def __init__(self, space: ActionSpace, cfg: PolicyConfig, growth: Growth | None = None) -> None:
        super().__init__(space, cfg, growth or Growth.of_eager(cfg.eager))

    def germinate_now(self, tracker: SignalTracker) -> bool:
        """Always: growth never waits for the host to plateau."""
        del tracker
        return True
