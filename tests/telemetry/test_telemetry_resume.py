"""Resume checks the run before it changes it, cuts the old tail at the checkpoint
position and continues seq."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from _telemetry_support import SyncRecordingSink, all_seqs, live_files, minimal_event, read_type

from esper.core.enums import RunStatus, TelemetryLevel
from esper.errors import UserError
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run
from esper.telemetry.manifest import read_manifest
from esper.telemetry.paths import Part, list_parts, manifest_path, part_name, type_rank_dir
from esper.telemetry.resume import ResumeRefusedError
from esper.telemetry.sink import ParquetSink


class CrashBeforeDeleteSink(ParquetSink):
    """Writes a file, then 'dies' before deleting what it replaces."""

    def remove(self, path: Path) -> None:
        raise RuntimeError("simulated crash")


def _step(i: int) -> ev.Event:
    return minimal_event(ev.EnvStep, step=i)


def test_resume_truncates_the_old_tail_and_continues(tmp_path: Path) -> None:
    with open_run(tmp_path, "res", level=TelemetryLevel.NORMAL, config_hash="abc") as hub:
        for i in range(100):
            hub.emit(_step(i))
            if i == 79:
                checkpoint_seq = hub.next_seq  # what a checkpoint stores
    assert hub.run_dir is not None and checkpoint_seq == 80
    directory = type_rank_dir(hub.run_dir, "env_step", 0)

    with open_run(
        tmp_path,
        "res",
        level=TelemetryLevel.NORMAL,
        resume=True,
        start_seq=checkpoint_seq,
        config_hash="def",
    ) as hub2:
        assert hub2.next_seq == 80
        (cut,) = list_parts(directory).live  # the old tail cut
        assert (cut.first, cut.last) == (0, 79)
        assert not any(list_parts(type_rank_dir(hub.run_dir, "writer_stats", 0)))
        for i in range(80, 130):
            hub2.emit(_step(i))
        hub2.flush()

    rows = read_type(hub.run_dir, "env_step")
    assert [r["step"] for r in rows] == list(range(130))
    assert [r["seq"] for r in rows] == list(range(130))
    seqs = all_seqs(hub.run_dir)
    assert sorted(seqs) == list(range(131))  # + one writer_stats (the first was cut)
    manifest = read_manifest(manifest_path(hub.run_dir, 0))
    assert manifest.status == RunStatus.FINISHED.value
    assert manifest.counts == {"env_step": 130, "writer_stats": 1}
    assert manifest.config_hash == "abc" and manifest.first_seq == 0
    (resume,) = manifest.resumes
    assert resume.start_seq == 80 and resume.events_truncated == 21
    assert resume.config_hash == "def"


def test_resume_fsyncs_the_files_it_cut_and_kept(tmp_path: Path) -> None:
    """The checkpoint a run resumes from points into the files the resume rewrote:
    they are durable before the new session writes anything."""
    hub = open_run(tmp_path, "res-sync", level=TelemetryLevel.NORMAL)
    for i in range(30):
        hub.emit(_step(i))
        hub.emit(minimal_event(ev.ActionTaken, step=i))
        if i % 10 == 9:
            hub.flush()
    hub.close()
    assert hub.run_dir is not None
    sink = SyncRecordingSink()
    with open_run(
        tmp_path, "res-sync", level=TelemetryLevel.NORMAL, resume=True, start_seq=25, sink=sink
    ) as hub2:
        assert len(live_files(hub.run_dir)) == 2  # env_step and action_taken, cut
        assert live_files(hub.run_dir) <= sink.synced
        assert manifest_path(hub.run_dir, 0) in sink.synced
        hub2.emit(_step(0))
    assert [r["seq"] for r in read_type(hub.run_dir, "env_step")][-1] == 25


def test_resume_leaves_other_ranks_in_flight_parts_alone(tmp_path: Path) -> None:
    """Ranks resume at their own pace: rank 0's crash repair must not delete the part
    rank 1 is writing under its dot tmp name (rank 1's writer then failed on it and the
    whole torchrun job was lost), while its own stale tmp files still go."""
    for rank in (0, 1):
        with open_run(
            tmp_path, "multi", level=TelemetryLevel.NORMAL, rank=rank, world_size=2
        ) as hub:
            hub.emit(_step(0))
    assert hub.run_dir is not None
    name = f".{part_name(9, 9)}.tmp"
    in_flight = type_rank_dir(hub.run_dir, "env_step", 1) / name
    stale = type_rank_dir(hub.run_dir, "env_step", 0) / name
    for path in (in_flight, stale):
        path.write_bytes(b"half a part")
    with open_run(
        tmp_path, "multi", level=TelemetryLevel.NORMAL, rank=0, resume=True, start_seq=1
    ) as hub0:
        hub0.emit(_step(1))
    assert in_flight.read_bytes() == b"half a part"
    assert not stale.exists()


def test_a_crash_during_the_cut_is_settled_by_the_next_resume(tmp_path: Path) -> None:
    with open_run(tmp_path, "cut", level=TelemetryLevel.NORMAL) as hub:
        for i in range(10):
            hub.emit(_step(i))
    assert hub.run_dir is not None
    directory = type_rank_dir(hub.run_dir, "env_step", 0)
    with pytest.raises(RuntimeError, match="simulated crash"):
        open_run(
            tmp_path, "cut", level=TelemetryLevel.NORMAL, resume=True, start_seq=5,
            sink=CrashBeforeDeleteSink(),
        )  # fmt: skip
    # The cut part (seq 0-4) lies inside its uncut input (0-9): the input is live.
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == list(range(10))
    with open_run(tmp_path, "cut", level=TelemetryLevel.NORMAL, resume=True, start_seq=5):
        pass
    assert list_parts(directory) == ([Part(directory / part_name(0, 4), 0, 4)], [], [])
    assert [r["step"] for r in read_type(hub.run_dir, "env_step")] == list(range(5))


def test_a_manifest_of_another_run_is_refused_before_anything_changes(tmp_path: Path) -> None:
    with open_run(tmp_path, "mine", level=TelemetryLevel.NORMAL) as hub:
        hub.emit(_step(0))
    run_dir = hub.run_dir
    assert run_dir is not None
    path = manifest_path(run_dir, 0)
    path.write_text(path.read_text().replace('"run_id": "mine"', '"run_id": "theirs"'))

    def files() -> dict[Path, bytes]:  # the run's data (not its lock file's owner record)
        return {
            p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.suffix != ".lock"
        }

    before = files()
    with pytest.raises(UserError, match="belongs to run 'theirs', not 'mine'"):
        open_run(tmp_path, "mine", level=TelemetryLevel.NORMAL, resume=True, start_seq=1)
    assert files() == before


def _lose_a_part(run_dir: Path) -> None:
    (part,) = list_parts(type_rank_dir(run_dir, "action_taken", 0)).live
    part.path.unlink()


def _stray_file(run_dir: Path) -> None:
    (part,) = list_parts(type_rank_dir(run_dir, "env_step", 0)).live
    shutil.copy(part.path, part.path.with_name("part-7.parquet"))


def _misnamed_part(run_dir: Path) -> None:
    (part,) = list_parts(type_rank_dir(run_dir, "env_step", 0)).live
    part.path.rename(part.path.with_name(part_name(part.first, part.last + 1000)))


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (_lose_a_part, "events before the checkpoint's seq 20 are missing"),
        (_stray_file, "part-7.parquet is not a part file"),
        (_misnamed_part, "does not hold the seq range its name states"),
    ],
    ids=["lost-part", "stray-file", "misnamed-part"],
)
def test_a_damaged_run_is_refused_before_anything_changes(
    tmp_path: Path, damage: Callable[[Path], None], needle: str
) -> None:
    with open_run(tmp_path, "dmg", level=TelemetryLevel.NORMAL, config_hash="abc") as hub:
        for i in range(15):
            hub.emit(_step(i))
            hub.emit(minimal_event(ev.ActionTaken, step=i))
    assert hub.run_dir is not None
    damage(hub.run_dir)
    before = _files(hub.run_dir)
    with pytest.raises(ResumeRefusedError, match=needle) as refused:
        open_run(
            tmp_path, "dmg", level=TelemetryLevel.NORMAL, resume=True, start_seq=20,
            checkpoint_hash="abc",
        )  # fmt: skip
    assert "nothing was changed" in str(refused.value)
    assert _files(hub.run_dir) == before


def test_a_checkpoint_of_another_config_is_refused(tmp_path: Path) -> None:
    with open_run(tmp_path, "cfg", level=TelemetryLevel.NORMAL, config_hash="abc") as hub:
        hub.emit(_step(0))
    with open_run(
        tmp_path, "cfg", level=TelemetryLevel.NORMAL, resume=True, start_seq=1,
        config_hash="def", checkpoint_hash="abc",
    ):  # fmt: skip
        pass  # a checkpoint of the first session: continued (with other flags)
    assert hub.run_dir is not None
    before = _files(hub.run_dir)
    for written_by in ("abc", "def"):  # either session's checkpoint is this run's
        with open_run(
            tmp_path, "cfg", level=TelemetryLevel.NORMAL, resume=True, start_seq=1,
            config_hash="def", checkpoint_hash=written_by,
        ):  # fmt: skip
            pass
    with pytest.raises(ResumeRefusedError, match="written with config xyz, this run's sessions"):
        open_run(
            tmp_path, "cfg", level=TelemetryLevel.NORMAL, resume=True, start_seq=1,
            checkpoint_hash="xyz",
        )  # fmt: skip
    assert {p.name for p in _files(hub.run_dir)} == {p.name for p in before}


def _files(run_dir: Path) -> dict[Path, bytes]:
    """The run's data (not its lock file's owner record)."""
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.suffix != ".lock"}
