"""Merging and rewriting part files without a window that loses or duplicates data.

Every rewrite of a ``<type>/rank=<r>`` directory follows the same four steps:

1. record the intent (output name + the inputs it replaces) in the manifest;
2. write the output under a temporary name and rename it into place (atomic);
3. delete the inputs;
4. clear the intent from the manifest.

A crash before step 2 leaves the inputs intact and the output absent. A crash between
steps 2 and 3 leaves both on disk, but the manifest already says that the output
supersedes the listed inputs, so :func:`live_parts` skips them (and a reader that
deduplicates on ``(rank, seq)`` gets the same answer). :func:`recover_pending` finishes
or abandons interrupted rewrites when a run is resumed. Inputs are read with their page
checksums verified, so a damaged part is never merged into a fresh, valid-looking file.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from esper.telemetry.manifest import Compaction, Manifest
from esper.telemetry.paths import (
    EVENTS_DIR,
    TMP_PREFIX,
    TMP_SUFFIX,
    list_parts,
    part_name,
)
from esper.telemetry.sink import COMPACT_ROW_GROUP_ROWS, PartSink

#: Outputs of one rewrite batch written at once, at most (one per core).
WRITE_THREADS: Final = min(os.cpu_count() or 1, 4)
#: Called with the manifest after it changed, to persist it (atomically).
SaveManifest = Callable[[Manifest], None]


def _read(paths: Iterable[Path], schema: pa.Schema) -> Iterator[pa.Table]:
    """Small part files read one by one, their page checksums verified."""
    return (pq.read_table(path, schema=schema, page_checksum_verification=True) for path in paths)


def _regrouped(tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
    """Small tables regrouped into row-group-sized ones (consumed lazily)."""
    pending: list[pa.Table] = []
    rows = 0
    for table in tables:
        pending.append(table)
        rows += table.num_rows
        if rows >= COMPACT_ROW_GROUP_ROWS:
            yield pa.concat_tables(pending)
            pending, rows = [], 0
    if pending:
        yield pa.concat_tables(pending)


def _events_relative(path: Path) -> str:
    """``<type>/rank=<r>/part-<n>.parquet``: the part's name relative to ``events/``."""
    return path.relative_to(path.parents[2]).as_posix()


@dataclass(frozen=True)
class Rewrite:
    """One rewrite: ``output`` (built from ``tables``, or none when None) replaces ``inputs``."""

    event_type: str
    inputs: list[Path]
    output: Path
    tables: Iterable[pa.Table] | None
    schema: pa.Schema


def rewrite_many(
    *,
    sink: PartSink,
    manifest: Manifest,
    save: SaveManifest,
    rewrites: list[Rewrite],
    touching: Callable[[Path], None] = lambda _path: None,
    landed: Callable[[Rewrite], None] = lambda _rewrite: None,
    spent: Callable[[int], None] = lambda _cpu_ns: None,
    parallel: bool = False,
) -> list[int]:
    """Run several rewrites under one intent record save and one clearing save.

    Each record stands alone (its output exists or it does not), so recording them
    together is as safe as one by one, for two manifest writes instead of two each
    (a manifest write cost about as much as a small merge). ``touching`` is told each
    file before it is written or removed (so an error can name it); ``landed`` each
    rewrite whose output is in place (so a caller can count rows no input held, output
    by output, and a failure half-way leaves counts that match the files); ``spent`` the
    CPU time of the threads that wrote outputs in ``parallel`` (:func:`_write_all`).
    Returns the output sizes.
    """
    records = [
        Compaction(
            event_type=r.event_type,
            output=_events_relative(r.output),
            inputs=[_events_relative(p) for p in r.inputs],
        )
        for r in rewrites
    ]
    manifest.pending_compactions.extend(records)
    save(manifest)
    sizes = _write_all(sink, rewrites, touching, landed, spent, parallel=parallel)
    for r in rewrites:
        for path in r.inputs:
            touching(path)
            sink.remove(path)
    for record in records:
        manifest.pending_compactions.remove(record)
    save(manifest)
    return sizes


def _write_one(sink: PartSink, r: Rewrite) -> int:
    return 0 if r.tables is None else sink.write_tables(r.tables, r.schema, r.output)


def _write_timed(sink: PartSink, r: Rewrite) -> tuple[int, int]:
    """Size of ``r``'s output, and the CPU time this (pool) thread spent writing it."""
    start = time.thread_time_ns()
    size = _write_one(sink, r)
    return size, time.thread_time_ns() - start


def _write_all(
    sink: PartSink,
    rewrites: list[Rewrite],
    touching: Callable[[Path], None],
    landed: Callable[[Rewrite], None],
    spent: Callable[[int], None],
    *,
    parallel: bool,
) -> list[int]:
    """Write every rewrite's output; with ``parallel``, on several threads where the
    sink allows it and there are several outputs (Parquet encoding releases the GIL, so
    the close's merge of a dozen types uses every core). ``landed`` is called in order,
    in this thread, for each output in place, and ``spent`` with the pool threads' CPU
    time; the first failure is raised once the others are done."""
    concurrent = parallel and getattr(sink, "concurrent", False)
    threads = min(len(rewrites), WRITE_THREADS) if concurrent else 1
    if threads > 1:
        with ThreadPoolExecutor(threads, thread_name_prefix="esper-compact") as pool:
            futures: list[Future[tuple[int, int]]] = []
            try:
                for r in rewrites:
                    futures.append(pool.submit(_write_timed, sink, r))
            except RuntimeError:  # the interpreter is shutting down (a hub closed at exit)
                if futures:  # (it refuses the first one already; never write one twice)
                    raise
            if futures:
                return _collect(rewrites, futures, touching, landed, spent)
    sizes = []
    for r in rewrites:
        touching(r.output)
        sizes.append(_write_one(sink, r))
        landed(r)
    return sizes


def _collect(
    rewrites: list[Rewrite],
    futures: list[Future[tuple[int, int]]],
    touching: Callable[[Path], None],
    landed: Callable[[Rewrite], None],
    spent: Callable[[int], None],
) -> list[int]:
    """The parallel writes' sizes, in order; the first failure raised after the rest."""
    sizes, failure = [], None
    for r, future in zip(rewrites, futures, strict=True):
        try:
            size, cpu_ns = future.result()
        except Exception as exc:
            if failure is None:
                touching(r.output)  # the error names this file
                failure = exc
            continue
        sizes.append(size)
        spent(cpu_ns)
        landed(r)
    if failure is not None:
        raise failure
    return sizes


def merge(
    *,
    event_type: str,
    inputs: list[Path],
    output: Path,
    schema: pa.Schema,
    contents: list[pa.Table] | None = None,
    tail: list[pa.Table] | None = None,
) -> Rewrite:
    """The rewrite that merges ``inputs`` (in order), then ``tail``, into ``output``.

    ``contents``: the inputs' tables, one per input, when the caller still holds what it
    wrote (the writer does, for its recent parts): the merge then reads no file.
    ``tail``: newer rows that are in no file yet (the writer's held burst), appended.
    """
    if contents is not None and len(contents) != len(inputs):
        raise ValueError(f"{len(contents)} tables given for {len(inputs)} parts")
    tables = _read(inputs, schema) if contents is None else iter(contents)
    if tail:
        tables = itertools.chain(tables, tail)
    return Rewrite(event_type, inputs, output, _regrouped(tables), schema)


def compact_parts(
    *,
    sink: PartSink,
    manifest: Manifest,
    save: SaveManifest,
    event_type: str,
    inputs: list[Path],
    output: Path,
    schema: pa.Schema,
    contents: list[pa.Table] | None = None,
) -> int:
    """Merge ``inputs`` (in order) into ``output`` with the crash-safe rewrite."""
    job = merge(
        event_type=event_type, inputs=inputs, output=output, schema=schema, contents=contents
    )
    (size,) = rewrite_many(sink=sink, manifest=manifest, save=save, rewrites=[job])
    return size


def truncate_from_seq(
    *,
    sink: PartSink,
    manifest: Manifest,
    save: SaveManifest,
    event_type: str,
    directory: Path,
    start_seq: int,
    schema: pa.Schema,
) -> int:
    """Drop events with ``seq >= start_seq`` (a resumed run re-emits them); return count."""
    parts = list_parts(directory)
    next_number = parts[-1][0] + 1 if parts else 0
    removed = 0
    for _, path in parts:
        table = pq.read_table(path, schema=schema, page_checksum_verification=True)
        keep = pc.less(table.column("seq"), start_seq)
        kept = table.filter(keep)
        if kept.num_rows == table.num_rows:
            continue
        removed += table.num_rows - kept.num_rows
        output = directory / part_name(next_number)
        next_number += 1
        tables = [kept] if kept.num_rows else None
        rewrite = Rewrite(event_type, [path], output, tables, schema)
        rewrite_many(sink=sink, manifest=manifest, save=save, rewrites=[rewrite])
    return removed


def recover_pending(run_dir: Path, manifest: Manifest, sink: PartSink, save: SaveManifest) -> None:
    """Finish rewrites a dead process started: drop inputs whose output exists."""
    for record in list(manifest.pending_compactions):
        if (run_dir / EVENTS_DIR / record.output).exists():
            for name in record.inputs:
                sink.remove(run_dir / EVENTS_DIR / name)
        manifest.pending_compactions.remove(record)
    save(manifest)


def remove_stale_tmp(directory: Path) -> None:
    """Delete temporary files a killed writer left behind (never visible to readers)."""
    if not directory.is_dir():
        return
    for path in directory.rglob(f"{TMP_PREFIX}*{TMP_SUFFIX}"):
        path.unlink(missing_ok=True)


def live_parts(run_dir: Path, manifests: Iterable[Manifest] = ()) -> list[Path]:
    """Every part file a reader should read, skipping inputs of a finished rewrite.

    Pass the manifests of all ranks (see :func:`esper.telemetry.manifest.read_manifests`).
    """
    superseded: set[Path] = set()
    for manifest in manifests:
        for record in manifest.pending_compactions:
            if (run_dir / EVENTS_DIR / record.output).exists():
                superseded.update(run_dir / EVENTS_DIR / name for name in record.inputs)
    events_dir = run_dir / EVENTS_DIR
    if not events_dir.is_dir():
        return []
    found: list[Path] = []
    for type_dir in sorted(p for p in events_dir.iterdir() if p.is_dir()):
        for rank_dir in sorted(p for p in type_dir.iterdir() if p.is_dir()):
            found.extend(p for _, p in list_parts(rank_dir) if p not in superseded)
    return found
