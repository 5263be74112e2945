"""Resume cuts the old tail at the checkpoint position, continues seq, and leaves one
merged file per type."""

from __future__ import annotations

from pathlib import Path

import pytest
from _telemetry_support import SyncRecordingSink, all_seqs, live_files, minimal_event, read_type

from esper.core.enums import RunStatus, TelemetryLevel
from esper.errors import UserError
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run
from esper.telemetry.manifest import read_manifest
from esper.telemetry.paths import list_parts, manifest_path, part_name, type_rank_dir
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
        (cut,) = list_parts(directory)  # the old tail cut and merged into one file
        assert (cut.first, cut.last) == (0, 79)
        assert not list_parts(type_rank_dir(hub.run_dir, "writer_stats", 0))
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


def test_resume_fsyncs_the_files_it_cut_and_merged(tmp_path: Path) -> None:
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
    assert [p.path.name for p in list_parts(directory)] == [part_name(0, 4)]
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
