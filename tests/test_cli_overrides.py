"""Overrides on the command line (``--set KEY=VALUE``) and "did you mean" for misspelled
flags, commands and config keys (issue 49). Nothing here trains: the config is built
and checked from the parsed flags alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from esper.cli import build_parser, main
from esper.commands.train import build_config
from esper.config import load_config
from esper.errors import ConfigError
from esper.suggest import nearest


def _config(*argv: str):  # type: ignore[no-untyped-def]
    return build_config(build_parser().parse_args(["train", *argv]))


def test_set_reaches_any_key_typed_like_the_toml() -> None:
    cfg = _config(
        "--set", "ppo.lr=1e-3",
        "--set", "host.slots=[\"r0c0\", \"r0c1\"]",
        "--set", "policy.op_prior={ prune = -3.0, germinate = 1 }",
        "--set", "ppo.target_kl=none",
        "--set", "run.device=cpu",
        "--set", "policy.eager.tempo=3",
    )  # fmt: skip
    assert cfg.ppo.lr == 1e-3 and cfg.host.slots == ["r0c0", "r0c1"]
    assert cfg.policy.op_prior == {"prune": -3.0, "germinate": 1.0}
    assert cfg.ppo.target_kl is None and cfg.policy.eager.tempo == 3
    entry = _config("--set", "policy.op_prior.germinate=0.5")  # one entry of a mapping
    assert entry.policy.op_prior == {"prune": -5.0, "germinate": 0.5}


def test_set_comes_after_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[ppo]\nlr = 0.01\nclip = 0.3\n")
    cfg = _config("--config", str(path), "--set", "ppo.lr=0.002")
    assert (cfg.ppo.lr, cfg.ppo.clip) == (0.002, 0.3)
    assert load_config(path).ppo.lr == 0.01


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "ppo.lr=abc"], "--set ppo.lr=abc: Expected `float`, got `str` - at `$.ppo.lr`"),
        (["--set", "run.n_envs=4.5"], "--set run.n_envs=4.5: Expected `int`, got `float`"),
        (["--set", "ppo.learning_rate=1e-3"], "unknown key 'learning_rate' in [ppo] (did you "
         "mean 'lr'?)"),
        (["--set", "pp.lr=1"], "unknown key 'pp' in the config's sections (did you mean 'ppo'?)"),
        (["--set", "ppo.lr.x=1"], "ppo.lr is a value, not a section"),
        (["--set", "ppo.lr"], "expected KEY=VALUE"),
        (["--set", "run.n_envs=2", "--envs", "3"], "--envs both set run.n_envs"),
        (["--set", "task.name=digit"], "did you mean 'digits'?"),
    ],
)  # fmt: skip
def test_bad_set_is_one_line_naming_the_key(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *argv, "--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert message in err


def test_evaluate_takes_set_too() -> None:
    args = build_parser().parse_args(["evaluate", "ckpt.pt", "--set", "ppo.lr=1e-3"])
    assert build_config(args).ppo.lr == 1e-3


def test_unknown_toml_key_suggests_the_nearest(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[ppo]\nlearning_rate = 0.001\n[policy.eager]\ntempoo = 5\n")
    with pytest.raises(ConfigError, match=r"learning_rate.*did you mean 'lr'\?"):
        load_config(path)
    path.write_text("[policy.eager]\ntempoo = 5\n")
    with pytest.raises(ConfigError, match=r"tempoo.*did you mean 'tempo'\?"):
        load_config(path)


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["train", "--taks", "digits"], "--taks: did you mean --task?"),
        (["train", "--episode-lenght", "5"], "did you mean --episode-length?"),
        (["trian"], "did you mean 'train'?"),
        (["runs", "--jsn"], "did you mean --json?"),
        (["analyze", "compare", "x", "--unpaird"], "did you mean --unpaired?"),
        (["export", "tensorboard", "r", "-o", "o", "--forse"], "did you mean --force?"),
    ],
)
def test_misspelled_flags_and_commands_get_a_suggestion(
    argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert hint in capsys.readouterr().err


def test_nearest_is_none_when_nothing_is_close() -> None:
    assert nearest("zzz_qqq", ["lr", "clip", "gamma"]) is None
    assert nearest("learning_rate", ["lr", "clip"]) == "lr"
    assert nearest("entropy", ["entropy_coef", "clip"]) == "entropy_coef"
