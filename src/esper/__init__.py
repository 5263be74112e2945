"""Esper: morphogenetic networks steered by vectorized PPO, telemetry-first.

Importing ``esper`` is cheap: torch is imported only by the modules that train.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from esper.training.run import TrainResult


def train(config: Any, **collaborators: Any) -> TrainResult:
    """Run a training job; see :func:`esper.training.run.train` (imports torch)."""
    from esper.training.run import train as _train

    return _train(config, **collaborators)


__all__ = ["__version__", "train"]
