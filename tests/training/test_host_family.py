"""Host families: the seeded, balanced draw at reset, the members' hosts, what the
policy observes of them, what the telemetry records, and the config checks."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import polars as pl
import pytest
import torch
from _family_support import MEMBERS, family_config
from esper_analysis import load_run
from esper_analysis.cli import main as analysis_main
from esper_analysis.hosts import host_choices

from esper.config import Config, config_from_dict, load_config, with_overrides
from esper.core.enums import Initiator
from esper.core.host_family import member_index, positions, slot_cost
from esper.data.tasks import load_task
from esper.errors import ConfigError
from esper.policy.features import (
    BASE_DIM,
    HOST_DIM,
    SLOT_DIM,
    SLOT_HOST_DIM,
    obs_dim,
)
from esper.telemetry import events as ev
from esper.telemetry.memory_hub import MemoryHub
from esper.training.envs.env_factory import EnvFactory, member_host
from esper.training.envs.host_envs import HostEnvs
from esper.training.loop.run_setup import action_space_for
from esper.training.run import train

ROOT = Path(__file__).resolve().parents[2]


def test_the_draw_is_balanced_per_round_and_seeded() -> None:
    for seed in (0, 7):
        for rnd in range(5):
            draws = [member_index(seed, rnd, env, 4) for env in range(8)]
            assert Counter(draws) == Counter({0: 2, 1: 2, 2: 2, 3: 2})  # each member twice
            assert draws == [member_index(seed, rnd, env, 4) for env in range(8)]
    orders = {tuple(member_index(0, rnd, env, 4) for env in range(4)) for rnd in range(12)}
    assert len(orders) > 1  # rounds draw different assignments
    assert [member_index(3, 2, e, 1) for e in range(3)] == [0, 0, 0]
    with pytest.raises(ValueError, match="at least one member"):
        member_index(0, 0, 0, 0)


def test_each_env_trains_its_members_host_and_knows_it() -> None:
    cfg = family_config()
    data = load_task(cfg.task, seed=0)
    envs = EnvFactory(cfg, data.spec).create_round(1)
    for env in envs:
        name, host = member_host(cfg, 1, env.index)
        assert env.host is not None and env.host.name == name
        widths = {"narrow": [2, 4, 8], "wide": [8, 4, 16]}[name]
        assert host.block_channels == widths
        assert [d.width for d in env.host.slots] == widths  # r0c<i> sees block i's width
        assert [d.position for d in env.host.slots] == [0.0, 0.5, 1.0]
        assert env.host.depth == 3
        assert env.host.params == sum(p.numel() for p in env.model.host.parameters())
    assert {env.host.name for env in envs if env.host is not None} == {"narrow", "wide"}


def test_without_a_family_the_hosts_are_the_configs_and_the_observation_is_unchanged() -> None:
    cfg = family_config(**{"family.members": []})
    assert member_host(cfg, 0, 3) == ("", cfg.host)
    assert obs_dim(3) == BASE_DIM + 3 * SLOT_DIM
    assert obs_dim(3, host_features=True) == obs_dim(3) + HOST_DIM + 3 * SLOT_HOST_DIM


def test_the_observation_carries_the_host_descriptors() -> None:
    cfg = family_config()
    data = load_task(cfg.task, seed=0)
    space = action_space_for(cfg, data)
    envs = HostEnvs(
        cfg, data, space=space, policy_device=torch.device("cpu"), amp=cfg.run.amp,
        initiator=Initiator.POLICY,
    )  # fmt: skip
    envs.reset(0)
    obs = envs.observe(0).obs
    assert obs.shape == (4, obs_dim(3, host_features=True))
    host_cols = obs[:, obs_dim(3) :]
    for row, env in zip(host_cols, envs.states, strict=True):
        assert env.host is not None
        slots = row[HOST_DIM:].view(3, SLOT_HOST_DIM)
        widths = torch.tensor([d.width for d in env.host.slots], dtype=torch.float32)
        assert torch.allclose(slots[:, 0] * 6.0, torch.log2(widths))
        assert torch.allclose(slots[:, 1], torch.tensor([0.0, 0.5, 1.0]))
        expected = torch.tensor([slot_cost(d.width, env.host.params) for d in env.host.slots])
        assert torch.allclose(slots[:, 2], expected.float(), atol=1e-6)
    narrow = [i for i, e in enumerate(envs.states) if e.host and e.host.name == "narrow"]
    wide = [i for i, e in enumerate(envs.states) if e.host and e.host.name == "wide"]
    assert not torch.equal(host_cols[narrow[0]], host_cols[wide[0]])  # members differ


def test_positions_span_the_host() -> None:
    assert positions(5, [0, 2, 4]) == [0.0, 0.5, 1.0]
    assert positions(1, [0]) == [0.0]


def _episodes(cfg: Config) -> list[tuple[int, int, str, float]]:
    hub = MemoryHub(run_id="family")
    train(cfg, telemetry=hub, save=None)
    return [
        (e.round, e.env, e.host, e.final_val_acc)
        for e in hub.events
        if isinstance(e, ev.EpisodeFinished)
    ]


def test_a_family_run_records_each_episodes_host_and_is_deterministic(tmp_path: Path) -> None:
    cfg = family_config(**{"telemetry.dir": str(tmp_path)})
    first = _episodes(cfg)
    assert [h for _, _, h, _ in first] != [""] * len(first)
    for rnd, env, host, _ in first:
        assert host == member_host(cfg, rnd, env)[0]
    assert _episodes(cfg) == first  # same seed, same events
    static = _episodes(with_overrides(cfg, {"policy.kind": "static"}))
    assert [(r, e, h) for r, e, h, _ in static] == [(r, e, h) for r, e, h, _ in first]


def test_the_hosts_analysis_groups_growth_by_member(tmp_path: Path) -> None:
    cfg = family_config(
        **{"telemetry.dir": str(tmp_path), "run.run_id": "eager", "policy.kind": "eager",
           "telemetry.level": "lifecycle"}
    )  # fmt: skip
    train(cfg)
    result = host_choices(load_run(tmp_path / "eager"))
    assert result.hosts == 2 and result.episodes == 8
    assert set(result.by_host["host"]) == {"narrow", "wide"}
    assert dict(zip(result.by_host["host"], result.by_host["block_channels"], strict=True)) == {
        "narrow": "2-4-8",
        "wide": "8-4-16",
    }
    late = result.choices.filter(pl.col("phase") == "last third")
    assert late.height > 0 and set(late["slot"]) == {"r0c0"}  # eager: the first free slot
    assert late["mean_step"].to_list() == [0.0] * late.height


def test_the_hosts_tables_repeat_their_keys_when_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = family_config(
        **{"telemetry.dir": str(tmp_path), "run.run_id": "eager", "policy.kind": "eager",
           "telemetry.level": "lifecycle"}
    )  # fmt: skip
    train(cfg)
    monkeypatch.setenv("COLUMNS", "60")  # a pipe (StringIO) of 60 columns: tables split
    out, err = io.StringIO(), io.StringIO()
    assert analysis_main(["hosts", str(tmp_path / "eager")], stdout=out, stderr=err) == 0
    headers: list[list[str]] = []  # each table's column names (a header may span lines)
    for line in out.getvalue().splitlines():
        if line.startswith("┏"):
            headers.append([])
        elif line.startswith("┃"):
            pieces = [c.strip() for c in line.strip().strip("┃").split("┃")]
            names = headers[-1] or [""] * len(pieces)
            headers[-1] = [a + b for a, b in zip(names, pieces, strict=True)]
    assert len(headers) > 2  # both tables split
    for names in headers:  # each part led by the keys that tell its rows apart
        assert names[0] == "host" or names[:2] == ["phase", "host"], names


def test_members_must_share_the_action_spaces_slots() -> None:
    deep = {"name": "deep", "block_channels": [2, 4, 8, 8]}
    cfg = family_config(**{"host.slots": [], "family.members": [*MEMBERS, deep]})
    with pytest.raises(ConfigError, match=r"members\[2\] \('deep'\): its slots"):
        action_space_for(cfg, load_task(cfg.task, seed=0))


@pytest.mark.parametrize(
    ("members", "extra", "message"),
    [
        ([{"name": "a b", "block_channels": [2]}], {}, "use 1-32 characters"),
        ([{"name": "a", "block_channels": [2]}] * 2, {}, "'a' listed twice"),
        ([{"name": "a", "block_channels": []}], {}, "at least one block width"),
        ([{"name": "a", "block_channels": [0]}], {}, "Expected `int` >= 1"),
        (
            [{"name": "a", "block_channels": [2]}],
            {"task": {"name": "text", "data_path": "x"}},
            "CNN",
        ),
    ],
)
def test_family_config_errors_name_the_key(
    members: list[dict[str, Any]], extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"family": {"members": members}, **extra})


@pytest.mark.parametrize("name", ["learning_family.toml", "learning_family_holdout.toml"])
def test_the_family_presets_load_and_offer_the_same_slots(name: str) -> None:
    cfg = load_config(ROOT / "configs" / name)
    assert cfg.family.enabled and len(cfg.family.members) >= 2
    space = action_space_for(cfg, load_task(cfg.task, seed=0))
    assert space.slot_ids == ("r0c0", "r0c1", "r0c2")
    trained = load_config(ROOT / "configs" / "learning_family.toml")
    same = {"family", "run"}  # only the members (and nothing of the run) differ
    a, b = msgspec.to_builtins(cfg), msgspec.to_builtins(trained)
    assert {k: v for k, v in a.items() if k not in same} == {
        k: v for k, v in b.items() if k not in same
    }
