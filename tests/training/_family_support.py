"""A small host family shared by the family and evaluation tests."""

from __future__ import annotations

from typing import Any

from esper.config import Config, config_from_dict, with_overrides

MEMBERS = [
    {"name": "narrow", "block_channels": [2, 4, 8]},
    {"name": "wide", "block_channels": [8, 4, 16]},
]


def family_config(**overrides: Any) -> Config:
    """Digits with the two members, three shared slots and a small policy."""
    cfg = config_from_dict(
        {
            "run": {"n_envs": 4, "rounds": 2, "episode_length": 3},
            "task": {"train_samples_per_env": 64, "val_samples": 64},
            "host": {"slots": ["r0c0", "r0c1", "r0c2"]},
            "family": {"members": MEMBERS},
            "policy": {"feature_dim": 16, "lstm_hidden": 16},
        }
    )
    return with_overrides(cfg, overrides)
