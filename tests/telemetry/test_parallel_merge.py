"""Merges written on several threads give the same files as one thread, and fail cleanly.

``rewrite_many(parallel=True)`` (the close's merge: one file per type) writes the
outputs on a thread pool when the sink says it may (``concurrent``): each file is still written
by one thread, so the bytes must not depend on it; a failure must leave every other
output counted (``landed``) and name the failed file.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest
from _telemetry_support import bare_manifest, minimal_event

from esper.telemetry import compaction
from esper.telemetry import events as ev
from esper.telemetry.arrow_schema import event_schema, events_to_table
from esper.telemetry.compaction import Rewrite, merge, rewrite_many
from esper.telemetry.events import EVENT_TYPES, event_tag
from esper.telemetry.paths import part_name, type_rank_dir
from esper.telemetry.sink import ParquetSink

TYPES = (ev.EnvStep, ev.RewardComputed, ev.ActionTaken, ev.SeedGerminated)
ROWS = 5000


class OneThreadSink(ParquetSink):
    concurrent = False


class FailingSink(ParquetSink):
    """Fails (disk full) on the file of one event type, whichever thread writes it."""

    def __init__(self, fail_type: str) -> None:
        self.fail_type = fail_type

    def write_tables(self, tables: Iterable[pa.Table], schema: pa.Schema, path: Path) -> int:
        if f"type={self.fail_type}" in path.parts:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return super().write_tables(tables, schema, path)


def _jobs(run_dir: Path) -> list[Rewrite]:
    jobs = []
    for cls in TYPES:
        tag = event_tag(cls)
        template = minimal_event(cls)
        events = [msgspec.structs.replace(template, seq=i, step=i) for i in range(ROWS)]
        table = events_to_table(EVENT_TYPES[tag], events)
        output = type_rank_dir(run_dir, tag, 0) / part_name(0)
        jobs.append(
            merge(
                event_type=tag,
                inputs=[],
                output=output,
                schema=event_schema(cls),
                tail=[table],
            )
        )
    return jobs


def _write(run_dir: Path, sink: ParquetSink) -> tuple[list[int], list[str], list[int]]:
    landed: list[str] = []
    spent: list[int] = []
    sizes = rewrite_many(
        sink=sink,
        manifest=bare_manifest("merge"),
        save=lambda _m: None,
        rewrites=_jobs(run_dir),
        landed=lambda job: landed.append(job.event_type),
        spent=spent.append,
        parallel=True,
    )
    return sizes, landed, spent


def _files(run_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in run_dir.rglob("*.parquet")}


@pytest.mark.skipif(compaction.WRITE_THREADS < 2, reason="one core: merges run on one thread")
def test_parallel_merges_write_the_same_bytes_as_one_thread(tmp_path: Path) -> None:
    one_sizes, one_landed, one_spent = _write(tmp_path / "one", OneThreadSink())
    many_sizes, many_landed, many_spent = _write(tmp_path / "many", ParquetSink())
    assert _files(tmp_path / "one") == _files(tmp_path / "many")
    assert len(_files(tmp_path / "many")) == len(TYPES)
    assert many_sizes == one_sizes and many_landed == one_landed  # landed in order
    assert one_spent == [] and len(many_spent) == len(TYPES)  # pool CPU is reported
    assert all(ns > 0 for ns in many_spent)


@pytest.mark.parametrize("sink_kind", ["parallel", "one thread"])
def test_a_failed_merge_names_its_file_and_the_others_land(tmp_path: Path, sink_kind: str) -> None:
    failing = event_tag(ev.RewardComputed)
    sink = FailingSink(failing)
    if sink_kind == "one thread":
        sink.concurrent = False
    landed: list[str] = []
    touched: list[Path] = []
    with pytest.raises(OSError, match="No space left"):
        rewrite_many(
            sink=sink,
            manifest=bare_manifest("merge"),
            save=lambda _m: None,
            rewrites=_jobs(tmp_path),
            touching=touched.append,
            landed=lambda job: landed.append(job.event_type),
            parallel=True,
        )
    assert f"type={failing}" in touched[-1].parts  # the error's file is the last touched
    written = {p.parts[-3] for p in tmp_path.rglob("*.parquet")}
    assert {f"type={t}" for t in landed} == written  # counted exactly what is on disk
    assert f"type={failing}" not in written
    if sink_kind == "parallel" and compaction.WRITE_THREADS > 1:
        assert len(landed) == len(TYPES) - 1  # the others were still written
