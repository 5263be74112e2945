"""What was run: a run's policy, task, seed, envs, rounds, host family, resolved config
and command line, read from its ``run_started`` events and manifest.

The same facts decide whether two runs can be compared pair by pair: runs started with
the same seed, envs, episode length, task, host and host family train the same freshly
seeded hosts in round ``r``, env ``e`` whatever their policy (:func:`pairing_facts`,
:func:`pairing_differences`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from typing import Any, Final

import polars as pl

from esper_analysis.loader import Run

#: The config sections that decide which host an env trains, and on what data.
HOST_SECTIONS: Final = ("task", "host", "family")
#: Keys of those sections that say where, not what (the same data at another path).
NOT_PAIRING: Final = frozenset({"task.data_path"})
#: Longest value shown in a difference (longer ones end in "...").
MAX_SHOWN: Final = 60
#: Differences named in one error before "and N more".
MAX_NAMED_DIFFERENCES: Final = 3
#: How ``python -m esper`` appears in ``sys.argv[0]``.
_MAIN_MODULE: Final = os.path.join("esper", "__main__.py")


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """A run's identity; ``None`` where the run did not record it (no ``run_started``)."""

    run_id: str
    policy: str | None
    task: str | None
    seed: int | None
    #: Envs per rank and ranks; ``envs`` is the run's total (``n_envs * world_size``).
    n_envs: int | None
    world_size: int
    episode_length: int | None
    rounds: int | None
    #: Host family member names (empty without a family).
    family: tuple[str, ...]
    #: The resolved config as recorded (an empty dict when unrecorded).
    config: dict[str, Any]
    #: The command line of every session that wrote the run (a continued run has several).
    command_lines: tuple[str, ...]
    esper_version: str | None
    torch_version: str | None
    python_version: str | None
    device: str | None
    telemetry_level: str | None
    parent_run_id: str | None
    resumed_from_round: int | None
    eval_checkpoint: str | None
    #: ``esper evaluate --sample``: sampled rather than greedy actions.
    eval_sampled: bool

    @property
    def envs(self) -> int | None:
        return None if self.n_envs is None else self.n_envs * self.world_size

    @property
    def is_eval(self) -> bool:
        return bool(self.eval_checkpoint)

    @property
    def policy_label(self) -> str | None:
        """The policy kind; an ``esper evaluate`` run is marked (frozen, no updates)."""
        if self.policy is None:
            return None
        if not self.is_eval:
            return self.policy
        return f"{self.policy} (eval, sampled)" if self.eval_sampled else f"{self.policy} (eval)"

    @property
    def learns(self) -> bool:
        """Whether the run updates a PPO policy (baselines and evaluations do not)."""
        return self.policy == "ppo" and not self.is_eval


def _started_rows(run: Run) -> list[dict[str, Any]]:
    if not run.rows_on_disk("run_started"):
        return []
    frame = run.scan("run_started").collect()
    columns = frame.columns
    return [dict(zip(columns, row, strict=True)) for row in frame.sort("seq").iter_rows()]


def _config(raw: object) -> dict[str, Any]:
    try:
        data = json.loads(str(raw or "{}"))
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def display_command(raw: str) -> str:
    """A recorded ``argv`` (a JSON list) as the user typed it: ``esper ...`` or
    ``python -m esper ...`` (shell-quoted); "" when unrecorded."""
    try:
        argv = json.loads(raw) if raw else []
    except json.JSONDecodeError:
        return raw
    if not isinstance(argv, list) or not argv:
        return ""
    words = [str(a) for a in argv]
    head = words[0]
    if head.endswith(_MAIN_MODULE):
        words[:1] = ["python", "-m", "esper"]
    elif os.path.basename(head) == "esper":
        words[0] = "esper"
    return shlex.join(words)


def run_info(run: Run) -> RunInfo:
    """The run's identity from its first ``run_started`` (and every session's command line)."""
    rows = _started_rows(run)
    first = rows[0] if rows else {}
    config = _config(first.get("config_json"))
    members = config.get("family", {}).get("members", []) if config else []
    world = run.manifest.world_size if run.manifest is not None else None

    def get(key: str) -> Any:
        return first.get(key)

    commands = tuple(display_command(str(r.get("argv") or "")) for r in rows if r.get("argv"))
    return RunInfo(
        run_id=run.run_id,
        policy=get("policy_kind"),
        task=get("task"),
        seed=get("seed"),
        n_envs=get("n_envs"),
        world_size=world if isinstance(world, int) and world > 0 else 1,
        episode_length=get("episode_length"),
        rounds=rows[-1]["rounds"] if rows else None,  # a resume may extend the run
        family=tuple(str(m.get("name", "")) for m in members if isinstance(m, dict)),
        config=config,
        command_lines=commands,
        esper_version=get("esper_version"),
        torch_version=get("torch_version"),
        python_version=get("python_version"),
        device=get("device"),
        telemetry_level=get("telemetry_level"),
        parent_run_id=(
            get("parent_run_id")
            or (run.manifest.parent_run_id if run.manifest is not None else "")
            or None
        ),
        resumed_from_round=get("resumed_from_round"),
        eval_checkpoint=get("eval_checkpoint"),
        eval_sampled=bool(get("eval_sampled")),
    )


def pairing_facts(info: RunInfo) -> dict[str, Any] | None:
    """What must be equal for two runs to train the same hosts env by env (None: the
    run recorded no ``run_started``, so its seed and hosts are unknown)."""
    if info.seed is None:
        return None
    facts: dict[str, Any] = {
        "seed": info.seed,
        "envs": info.envs,
        "episode_length": info.episode_length,
    }
    if info.config:
        for section in HOST_SECTIONS:
            facts.update(_flatten(section, info.config.get(section, {})))
        for key in NOT_PAIRING:
            facts.pop(key, None)
    else:  # an old or hand-written run_started: the fields it has
        facts["task.name"] = info.task
    return facts


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(f"{prefix}.{key}", item))
        return out
    return {prefix: value}


def _show(value: Any) -> str:
    """A fact's value in one short phrase (a family by its members' names)."""
    if isinstance(value, list):
        text = "[" + ", ".join(_show(v.get("name", v)) if isinstance(v, dict) else _show(v)
                               for v in value) + "]"  # fmt: skip
    elif isinstance(value, dict):
        text = json.dumps(value, sort_keys=True)
    else:
        text = "none" if value is None else str(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def pairing_differences(
    reference: RunInfo, other: RunInfo, *, ignore: frozenset[str] = frozenset()
) -> list[str]:
    """Why ``other`` cannot be paired with ``reference`` env by env (empty: it can).

    ``ignore``: facts allowed to differ (``seed`` between the seeds of one group).
    """
    a, b = pairing_facts(reference), pairing_facts(other)
    for info, facts in ((reference, a), (other, b)):
        if facts is None:
            return [f"{info.run_id} recorded no run_started, so its seed and hosts are unknown"]
    assert a is not None and b is not None
    out = []
    for key in sorted(set(a) | set(b), key=_fact_order):
        if key in ignore:
            continue
        if a.get(key, "—") != b.get(key, "—"):
            out.append(f"{key} {_show(b.get(key))} vs {_show(a.get(key))}")
    return out


def _fact_order(key: str) -> tuple[int, str]:
    first = ("seed", "envs", "episode_length")
    return (first.index(key), "") if key in first else (len(first), key)


def describe_differences(differences: list[str]) -> str:
    """The first few differences, and how many more."""
    shown = differences[:MAX_NAMED_DIFFERENCES]
    more = len(differences) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def config_value(info: RunInfo, key: str) -> Any:
    """A dotted config key's value (``ppo.lr``), or None when the run did not record it."""
    node: Any = info.config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def episode_frame(run: Run) -> pl.DataFrame:
    """The run's episodes, one per (round, env) (the last written wins, as after a
    resume that replayed a round)."""
    return (
        run.scan("episode_finished")
        .select(
            "round",
            "env",
            "episode_reward",
            "final_val_acc",
            "params_added",
            "seeds_germinated",
            "seeds_fossilized",
            "seeds_pruned",
        )
        .unique(subset=["round", "env"], keep="last", maintain_order=True)
        .sort("round", "env")
        .collect()
    )
