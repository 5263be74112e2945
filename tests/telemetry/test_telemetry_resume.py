"""Resume continues seq at the checkpoint position and part numbers after the last."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from _telemetry_support import all_seqs, minimal_event, read_type

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run
from esper.telemetry.manifest import read_manifest
from esper.telemetry.paths import list_parts, manifest_path, part_number, type_rank_dir
from esper.telemetry.sink import ParquetSink


class RecordingSink(ParquetSink):
    def __init__(self) -> None:
        self.written: list[Path] = []

    def write_table(self, table: pa.Table, path: Path) -> int:
        self.written.append(path)
        return super().write_table(table, path)


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
    highest_before = list_parts(directory)[-1][0]

    sink = RecordingSink()
    with open_run(
        tmp_path,
        "res",
        level=TelemetryLevel.NORMAL,
        resume=True,
        start_seq=checkpoint_seq,
        config_hash="def",
        sink=sink,
    ) as hub2:
        assert hub2.next_seq == 80
        for i in range(80, 130):
            hub2.emit(_step(i))
        hub2.flush()
    first_new = part_number(next(p for p in sink.written if p.parent == directory).name)
    assert first_new is not None and first_new > highest_before

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
    in_flight = type_rank_dir(hub.run_dir, "env_step", 1) / ".part-000009.parquet.tmp"
    stale = type_rank_dir(hub.run_dir, "env_step", 0) / ".part-000009.parquet.tmp"
    for path in (in_flight, stale):
        path.write_bytes(b"half a part")
    with open_run(
        tmp_path, "multi", level=TelemetryLevel.NORMAL, rank=0, resume=True, start_seq=1
    ) as hub0:
        hub0.emit(_step(1))
    assert in_flight.read_bytes() == b"half a part"
    assert not stale.exists()
