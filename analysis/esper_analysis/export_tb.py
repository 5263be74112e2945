"""``esper export tensorboard``: a run's per-round and per-update scalars as TensorBoard events.

The scalars are computed with polars from the run directory (:func:`run_scalars`, no
TensorBoard needed); writing them needs the optional ``tensorboard`` extra and uses
TensorBoard's own event-file writer and protobufs, not ``torch.utils.tensorboard``, so
the analysis layer still never imports torch. Each run becomes ``<out>/<run id>/``, so
``tensorboard --logdir <out>`` overlays several runs. The step of every scalar is the
round (one PPO update per round); the wall time is the event's own timestamp. What was
run goes along as text (TensorBoard's Text tab, step 0): ``run/summary`` (policy, task,
seed, envs, rounds, hosts, command line, version) and ``run/config`` (the full resolved
config as JSON), so the event files alone say what they measured.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import polars as pl

from esper.core.enums import SeedStage
from esper.errors import UserError
from esper.telemetry.events import REWARD_COMPONENTS
from esper.telemetry.paths import validate_run_id
from esper_analysis.lifecycles import seed_lifecycles, with_stage
from esper_analysis.loader import Run
from esper_analysis.rewards import reward_breakdown
from esper_analysis.run_info import run_info

#: What to install when the extra is missing (one line, printed as the error).
INSTALL_HINT: Final = (
    "esper export tensorboard needs the optional tensorboard package: from the Esper "
    'checkout, python -m pip install -c constraints.txt -e ".[tensorboard]"'
)
#: round_finished fields exported as ``round/<field>``.
ROUND_FIELDS: Final = ("mean_episode_reward", "mean_final_accuracy", "eps", "wall_s", "rollbacks")
#: ppo_update columns that are not scalars worth plotting (envelope, flags, text).
_PPO_SKIP: Final = frozenset(
    {"run_id", "seq", "ts_ns", "rank", "round", "env", "step", "skipped", "skip_reason"}
)
#: Stages shown as ``seeds/<stage>``: the round's seeds by the stage they ended the episode in
#: (pruned and fossilized seeds count under those outcomes).
SEED_STAGES: Final = tuple(
    s.value for s in SeedStage if s not in (SeedStage.DORMANT, SeedStage.RESETTING)
)
_NS_PER_S: Final = 1e9
#: Prefix of TensorBoard event files (what ``--force`` replaces, and nothing else).
EVENT_FILE_PREFIX: Final = "events.out.tfevents."


@dataclasses.dataclass(frozen=True)
class Scalar:
    tag: str
    step: int
    value: float
    wall_time: float


def _round_times(run: Run) -> dict[int, float]:
    """Wall time (s) of each round's end, so every tag of a round shares one time."""
    frame = run.scan("round_finished").group_by("round").agg(pl.col("ts_ns").max()).collect()
    return {int(r): int(ts) / _NS_PER_S for r, ts in frame.iter_rows()}


def _from_frame(
    frame: pl.DataFrame, prefix: str, columns: list[str], times: dict[int, float]
) -> Iterator[Scalar]:
    for row in frame.iter_rows(named=True):
        step = int(row["round"])
        for col in columns:
            value = row[col]
            if value is None or isinstance(value, str):
                continue
            value = float(value)
            if math.isfinite(value):
                yield Scalar(f"{prefix}/{col}", step, value, times.get(step, 0.0))


def _seed_counts(run: Run) -> pl.DataFrame:
    seeds = with_stage(seed_lifecycles(run).seeds)
    rounds = sorted(set(seeds["round"].to_list()) | set(_round_times(run)))
    counts = {
        (int(r), str(s)): int(n) for r, s, n in seeds.group_by("round", "stage").len().iter_rows()
    }
    return pl.DataFrame(
        [{"round": r, **{s: counts.get((r, s), 0) for s in SEED_STAGES}} for r in rounds],
        schema={"round": pl.Int64, **dict.fromkeys(SEED_STAGES, pl.Int64)},
    )


def run_scalars(run: Run) -> list[Scalar]:
    """Every exported scalar of a run, sorted by (tag, step)."""
    times = _round_times(run)
    rounds = (
        run.scan("round_finished")
        .group_by("round")
        .agg(pl.col(list(ROUND_FIELDS)).mean())
        .sort("round")
        .collect()
    )
    ppo = run.scan("ppo_update").collect()
    ppo_cols = [c for c, t in ppo.schema.items() if c not in _PPO_SKIP and t.is_numeric()]
    ppo = ppo.group_by("round").agg(pl.col(ppo_cols).mean()).sort("round")
    rewards = reward_breakdown(run).by_round
    reward_cols = [c for c in [*REWARD_COMPONENTS, "total"] if c in rewards.columns]
    scalars = [
        *_from_frame(rounds, "round", list(ROUND_FIELDS), times),
        *_from_frame(ppo, "ppo", ppo_cols, times),
        *_from_frame(rewards, "reward", reward_cols, times),
        *_from_frame(_seed_counts(run), "seeds", list(SEED_STAGES), times),
    ]
    return sorted(scalars, key=lambda s: (s.tag, s.step))


def run_texts(run: Run) -> dict[str, str]:
    """What was run, as Markdown for TensorBoard's Text tab: ``run/summary`` and
    ``run/config`` (empty when the run recorded no run_started)."""
    info = run_info(run)
    if info.policy is None:
        return {}
    rows = {
        "run": info.run_id,
        "policy": info.policy_label,
        "task": info.task,
        "seed": info.seed,
        "envs": info.envs,
        "rounds": info.rounds,
        "episode length": info.episode_length,
        "hosts": ", ".join(info.family) or "one host",
        "parent run": info.parent_run_id or "—",
        "esper": info.esper_version,
    }
    table = "| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows.items())
    commands = "".join(f"\n    {c}\n" for c in info.command_lines) or "\n(not recorded)\n"
    texts = {"run/summary": f"{table}\ncommand line:\n{commands}"}
    if info.config:
        config = json.dumps(info.config, indent=2, sort_keys=True)
        texts["run/config"] = "\n".join("    " + line for line in config.splitlines())
    return texts


def _tensorboard() -> tuple[Any, Any, Any, Any]:
    """TensorBoard's writer, protos and text summary, or a one-line :class:`UserError`
    saying what to install."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return EventFileWriter, Event, Summary, text_pb


def _target(out_dir: Path, run: Run, force: bool) -> Path:
    target = out_dir / validate_run_id(run.run_id)  # the id names a directory: keep it inside
    if target.exists():
        if not target.is_dir():
            raise UserError(f"{target} exists and is not a directory")
        old = [p for p in target.iterdir() if p.name.startswith(EVENT_FILE_PREFIX)]
        if old and not force:
            raise UserError(
                f"{target} already holds TensorBoard event files; pass --force to replace them"
            )
    return target


def export_tensorboard(run: Run, out_dir: str | Path, *, force: bool = False) -> Path:
    """Write the run's scalars under ``out_dir/<run id>/``; returns that directory.

    The file is written in a temporary directory beside the target and moved into place,
    so an interrupted export leaves no half-written event file where TensorBoard looks.
    """
    writer_cls, event_cls, summary_cls, text_pb = _tensorboard()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = _target(out, run, force)
    scalars = run_scalars(run)
    with tempfile.TemporaryDirectory(dir=out, prefix=f".{run.run_id}.") as tmp:
        writer = writer_cls(tmp)
        start = min((s.wall_time for s in scalars), default=0.0)
        for tag, text in run_texts(run).items():
            writer.add_event(event_cls(wall_time=start, step=0, summary=text_pb(tag, text)))
        for s in scalars:
            value = summary_cls.Value(tag=s.tag, simple_value=s.value)
            writer.add_event(
                event_cls(wall_time=s.wall_time, step=s.step, summary=summary_cls(value=[value]))
            )
        writer.close()
        target.mkdir(exist_ok=True)
        for old in target.glob(f"{EVENT_FILE_PREFIX}*"):
            old.unlink()
        for new in Path(tmp).iterdir():
            shutil.move(str(new), target / new.name)
    return target
