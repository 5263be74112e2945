"""``esper train --help`` documents every flag and its default."""

from __future__ import annotations

import argparse

import pytest

from esper.cli import build_parser
from esper.config import Config


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", ["train", "heuristic"])
def test_every_train_flag_has_help_with_its_default(command: str) -> None:
    parser = _subparser(command)
    undocumented = [
        a.option_strings[0]
        for a in parser._actions
        if a.option_strings != ["-h", "--help"] and "default" not in (a.help or "")
    ]
    assert not undocumented, f"flags without help text or default: {undocumented}"


def test_train_help_shows_the_config_defaults() -> None:
    cfg = Config()
    text = _subparser("train").format_help().split("options:", 1)[1]
    text = " ".join(text.split())
    for flag, value in {
        "--envs N": cfg.run.n_envs,
        "--rounds R": cfg.run.rounds,
        "--episode-length T": cfg.run.episode_length,
        "--batch-size B": cfg.task.batch_size,
        "--seed S": cfg.run.seed,
    }.items():
        start = text.index(flag)
        assert f"(default: {value})" in text[start : start + 120], flag
