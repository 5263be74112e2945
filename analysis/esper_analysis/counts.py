"""Event counts: by type, by round, by env, by step within the episode, per env-step.

One scan per event type reads only the envelope columns counted (collected in
parallel); every view is a histogram of those columns.
"""

from __future__ import annotations

import dataclasses
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Final

import numpy as np
import polars as pl

from esper.telemetry.events import EVENT_LEVELS, EVENT_TYPES
from esper_analysis.dict_counts import Histogram, dictionary_histograms
from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult


@dataclasses.dataclass(frozen=True)
class Counts(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "by_type": "Events by type",
        "by_round": "Events by type and round",
        "by_env": "Events by type and env",
        "by_step": "Events by type and step within the episode",
        "by_rank": "Events by type and rank (process)",
    }
    #: By-round/env/step are long: people get the per-type table (JSON has them all).
    TEXT_SKIP: ClassVar[frozenset[str]] = frozenset({"by_round", "by_step"})

    by_type: pl.DataFrame
    by_round: pl.DataFrame
    by_env: pl.DataFrame
    by_step: pl.DataFrame
    #: Per process of a multi-rank run (torchrun); one rank, 0, otherwise.
    by_rank: pl.DataFrame
    total: int
    env_steps: int | None

    @functools.cached_property
    def nested(self) -> dict[str, dict[str, dict[str, int]]]:
        """``by_round``, ``by_env`` and ``by_rank`` as ``{type: {str(key): count}}`` (the
        baseline's JSON shape), built once: capturing a baseline and checking one against
        the same counts share it."""
        return {
            "by_round": _nested(self.by_round, "round"),
            "by_env": _nested(self.by_env, "env"),
            "by_rank": _nested(self.by_rank, "rank"),
        }

    def of(self, event_type: str) -> int:
        """Count of one type (0 when absent)."""
        row = self.by_type.filter(pl.col("type") == event_type)
        return int(row["events"][0]) if row.height else 0


#: The envelope columns counted per value (each gives one breakdown table).
_DIMENSIONS: Final = ("round", "env", "step", "rank")
#: The ones read from the data (the ranks usually come from the footers).
_READ: Final = _DIMENSIONS[:-1]
#: Event types whose pages are counted at once.
_PAGE_THREADS: Final = 2
#: Rows read at once: bounds memory (4 int64 columns: 80 MB) on runs of any size.
BATCH_ROWS: Final = 2_500_000


def _histogram(values: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, counts) of an integer column, via ``numpy.bincount``.

    Counting is a histogram over small integer ranges (rounds, envs, steps), which
    bincount does in one linear pass, several times cheaper than a hash group-by. A
    column of one value (the rank of a one-process run) is counted without a pass.
    """
    if values.null_count():
        values = values.drop_nulls()
    if values.is_empty():
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    low, high = values.min(), values.max()
    if low == high:
        return np.array([low], dtype=np.int64), np.array([len(values)], dtype=np.int64)
    low, high = int(low), int(high)  # type: ignore[arg-type]
    # Values from 0 up are counted as they are (no shifted copy) unless the range below
    # the smallest is larger than the column itself.
    offset = 0 if 0 <= low <= len(values) else low
    size = high - offset + 1
    counts = np.zeros(size, dtype=np.int64)
    # Chunk by chunk: each chunk is a view, where ``to_numpy`` of a column read in
    # many chunks copies it whole (fresh memory, page faults): 1.2-1.7 ms less per
    # column of 2.1M rows.
    for chunk in values.get_chunks():
        arr = chunk.to_numpy()
        counts += np.bincount(arr - offset if offset else arr, minlength=size)
    counts = counts[low - offset :]
    present = np.flatnonzero(counts)
    return present + low, counts[present]


def _nested(frame: pl.DataFrame, dim: str) -> dict[str, dict[str, int]]:
    """``{type: {str(key): count}}``, built column-wise: sorted by type (as
    :func:`_breakdown_table` builds it), each type's rows are one slice of three lists
    (no partition into frames)."""
    if frame.is_empty():
        return {}
    if not frame["type"].is_sorted():
        frame = frame.sort("type", maintain_order=True)
    types = frame["type"]
    starts = np.flatnonzero(np.r_[True, (types[1:] != types[:-1]).to_numpy()])
    ends = [*starts[1:].tolist(), frame.height]
    keys = _decimal_strings(frame[dim])
    events = frame["events"].to_list()
    names = types.gather(starts).to_list()
    return {
        str(name): dict(zip(keys[a:b], events[a:b], strict=True))
        for name, a, b in zip(names, starts.tolist(), ends, strict=True)
    }


def _decimal_strings(values: pl.Series) -> list[Any]:
    """``str`` of every integer (None for a null): over a small range, each distinct
    value's string is made once and gathered (a round repeats once per event type)."""
    low, high = values.min(), values.max()
    if values.null_count() or not isinstance(low, int) or not isinstance(high, int):
        return values.cast(pl.String).to_list()
    if high - low > len(values):
        return values.cast(pl.String).to_list()
    names = np.array([str(v) for v in range(low, high + 1)], dtype=np.object_)
    return list(names[values.to_numpy() - low].tolist())


def _breakdown_schema(dim: str) -> pl.Schema:
    return pl.Schema({"type": pl.String, dim: pl.Int64, "events": pl.Int64})


def _batches(run: Run, types: list[str], limit: int = BATCH_ROWS) -> list[list[str]]:
    """``types`` in groups of at most ``limit`` rows (a lone larger type is its own
    group): each group is read in parallel, and only one group is held in memory."""
    batches: list[list[str]] = []
    rows = limit
    for event_type in types:
        n = run.rows_on_disk(event_type)
        if rows + n > limit:
            batches.append([])
            rows = 0
        batches[-1].append(event_type)
        rows += n
    return batches


def _breakdowns(
    run: Run, batch_rows: int = BATCH_ROWS, *, pages: bool = True
) -> tuple[dict[str, pl.DataFrame], dict[str, int]]:
    """Rows per ``(type, value)`` of each dimension, and rows per type, from one parallel
    scan per type. Each table is built once from the concatenated histograms (a frame
    per type and dimension cost more than the histograms themselves). ``pages=False``
    reads every type's columns (no counting from the pages' dictionary indices)."""
    totals: dict[str, int] = {}
    parts: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {dim: [] for dim in _DIMENSIONS}
    known = {t: _footer_ranks(run, t) for t in run.event_types}
    read = _counted_from_pages(run, known, totals, parts) if pages else list(known)
    for batch in _batches(run, read, batch_rows):
        dims = {t: [d for d in _DIMENSIONS if d != "rank" or known[t] is None] for t in batch}
        frames = pl.collect_all([run.scan(t).select(dims[t]) for t in batch])
        for event_type, frame in zip(batch, frames, strict=True):
            if frame.height:
                totals[event_type] = frame.height
            ranks = known[event_type]
            for dim in _DIMENSIONS:
                if dim == "rank" and ranks is not None:
                    parts[dim].append((event_type, *ranks))
                else:
                    parts[dim].append((event_type, *_histogram(frame[dim])))
    return {dim: _breakdown_table(dim, parts[dim]) for dim in _DIMENSIONS}, totals


def _counted_from_pages(
    run: Run,
    known: dict[str, tuple[np.ndarray, np.ndarray] | None],
    totals: dict[str, int],
    parts: dict[str, list[tuple[str, np.ndarray, np.ndarray]]],
) -> list[str]:
    """Adds the histograms of the types whose pages' dictionary indices can be counted
    (:mod:`esper_analysis.dict_counts`) to ``totals`` and ``parts``; returns the types
    left to read. Only where the footers give the ranks: a rank read as a column fills
    its nulls with the directory's rank, which counting the pages would not."""

    def count(event_type: str) -> tuple[dict[str, Histogram], int] | None:
        return dictionary_histograms(run, event_type, _READ) if known[event_type] else None

    # Two at a time: decompression and the run counter release the GIL.
    with ThreadPoolExecutor(max_workers=_PAGE_THREADS, thread_name_prefix="esper-counts") as pool:
        counted = dict(zip(known, pool.map(count, known), strict=True))
    read = []
    for event_type, ranks in known.items():
        fast = counted[event_type]
        if ranks is None or fast is None:
            read.append(event_type)
            continue
        histograms, rows = fast
        if rows:
            totals[event_type] = rows
        parts["rank"].append((event_type, *ranks))
        for dim in _READ:
            parts[dim].append((event_type, *histograms[dim]))
    return read


def _footer_ranks(run: Run, event_type: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The ``rank`` histogram of a type from its files' footers, when every file proves
    its one rank (:attr:`PartFile.rank_value`) and no deduplication is needed; else
    None, and the column is read. A one-process run's rank is one value, so reading
    it was a tenth of the counts' time for nothing."""
    if run.needs_dedup(event_type):
        return None
    rows: dict[int, int] = {}
    for part in run.files.get(event_type, ()):
        if part.rank_value is None:
            return None
        rows[part.rank_value] = rows.get(part.rank_value, 0) + part.rows
    present = sorted(value for value, n in rows.items() if n)
    return np.array(present, dtype=np.int64), np.array([rows[v] for v in present], dtype=np.int64)


def _breakdown_table(dim: str, parts: list[tuple[str, np.ndarray, np.ndarray]]) -> pl.DataFrame:
    """One ``(type, value, events)`` table, sorted, from every type's histogram.

    Each histogram's values ascend and each type has one, so the histograms
    concatenated in type-name order are the sorted table: no sort of its rows (on a
    10M-event run, 39 ms for the four tables, about a sixth of the counts).
    """
    if not parts:
        return pl.DataFrame(schema=_breakdown_schema(dim))
    parts = sorted(parts, key=lambda part: part[0])
    lengths = [len(keys) for _, keys, _ in parts]
    names = pl.Series("type", [t for t, _, _ in parts], pl.String)
    types = names.gather(np.repeat(np.arange(len(parts)), lengths))
    return pl.DataFrame(
        {
            "type": types,
            dim: np.concatenate([keys for _, keys, _ in parts]),
            "events": np.concatenate([counts for _, _, counts in parts]),
        },
        schema=_breakdown_schema(dim),
    )


def _manifest_counts(run: Run) -> dict[str, int]:
    """Per-type counts the writer recorded, summed over every rank's manifest."""
    totals: dict[str, int] = {}
    for manifest in run.manifests.values():
        counts = manifest.get("counts")
        if isinstance(counts, dict):
            for key, value in counts.items():
                if isinstance(value, int):
                    totals[key] = totals.get(key, 0) + value
    return totals


def _env_steps(run: Run, by_type: dict[str, int]) -> int | None:
    """Env-steps of the run: env_step events when written, else run_finished's total."""
    if by_type.get("env_step"):
        return by_type["env_step"]
    if run.rows_on_disk("run_finished"):
        value = run.scan("run_finished").select(pl.col("env_steps").last()).collect().item()
        return int(value) if value else None
    return None


def event_counts(run: Run) -> Counts:
    """Every count view of a run, deduplicated on ``(rank, seq)``.

    One scan per type reads the three envelope columns once; each breakdown is a
    histogram of one of them. Grouping by ``(round, env, step)`` together would have
    as many groups as env-steps, i.e. be as large as the data itself.
    """
    tables, total_of = _breakdowns(run)
    env_steps = _env_steps(run, total_of)
    manifest = _manifest_counts(run)
    levels = {t: EVENT_LEVELS[cls].name.lower() for t, cls in EVENT_TYPES.items()}
    rows = [
        {
            "type": t,
            "events": total_of[t],
            "level": levels[t],
            "manifest": manifest.get(t),
            "per_env_step": total_of[t] / env_steps if env_steps else None,
        }
        for t in EVENT_TYPES
        if t in total_of
    ]
    by_type = pl.DataFrame(rows, schema=_BY_TYPE_SCHEMA)
    return Counts(
        by_type=by_type,
        by_round=tables["round"],
        by_env=tables["env"],
        by_step=tables["step"],
        by_rank=tables["rank"],
        total=int(by_type["events"].sum()),
        env_steps=env_steps,
    )


_BY_TYPE_SCHEMA = pl.Schema(
    {
        "type": pl.String,
        "events": pl.Int64,
        "level": pl.String,
        "manifest": pl.Int64,
        "per_env_step": pl.Float64,
    }
)
