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


def _analyze_help(*argv: str) -> str:
    import contextlib
    import io

    from esper_analysis.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*argv, "--help"], stdout=out) == 0
    return " ".join(out.getvalue().split())


def test_analyze_commands_take_only_the_flags_they_use() -> None:
    """``report`` and ``baseline capture`` print no tables: no ``--max-rows``; every
    command says what it does and shows its defaults."""
    for argv in (("report",), ("baseline", "capture")):
        text = _analyze_help(*argv)
        assert "--max-rows" not in text, argv
        assert "--json" in text and "(default: one line)" in text, argv
    assert "Capture a run's event counts" in _analyze_help("baseline")
    assert "self-contained HTML report" in _analyze_help("report")
    for argv in (("compare",), ("baseline", "check"), ("counts",)):
        assert "--max-rows N rows shown per table, >= 1 (default: 40)" in _analyze_help(*argv)
        assert "COLUMNS" in _analyze_help(*argv)  # how to get wider tables


def test_other_commands_show_their_defaults() -> None:
    demo = " ".join(_subparser("telemetry-demo").format_help().split())
    assert "(default: normal)" in demo and "(default: 4)" in demo
    watch = " ".join(_subparser("watch").format_help().split())
    assert "--wait S" in watch and "(default: 60" in watch
    export = _subparser("export")
    targets = next(a for a in export._actions if isinstance(a, argparse._SubParsersAction))
    tensorboard = " ".join(targets.choices["tensorboard"].format_help().split())
    assert 'python -m pip install -c constraints.txt -e ".[tensorboard]"' in tensorboard
