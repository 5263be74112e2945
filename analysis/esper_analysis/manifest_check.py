"""Do the files of a run agree with its manifest? Foreign or missing events are never silent.

The writer rewrites the manifest after every flush with the per-type event counts of the
files already on disk, and ``last_seq``, the last event it covers. So:

- every row of every file must carry the run's ``run_id``: a file with another run's
  events (copied in by hand, a bad merge of two directories) is an error naming it;
- a cleanly closed rank (status finished, failed or interrupted) must hold exactly the
  counts its manifest states: any difference is an error naming the type and files;
- a rank that did not close (crashed, or still running) may hold events written after
  its manifest's last rewrite (``seq > last_seq``): those are expected. Any other
  difference cannot be told apart from damage, so the read goes on but is flagged as
  degraded (a warning, and :attr:`esper_analysis.loader.Run.degraded`);
- files that repeat events exactly (same ``seq``; the scans keep one copy) are a
  degraded read too, since the numbers stay right.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import polars as pl
import pyarrow.compute as pc

from esper.core.enums import RunStatus
from esper_analysis.integrity import IntegrityError, file_run_ids
from esper_analysis.parts import PartFile, scan_parts
from esper_analysis.schema import known_event_types

if TYPE_CHECKING:
    from esper_analysis.loader import Run

_CLOSED: Final = frozenset(
    s.value for s in (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.INTERRUPTED)
)
#: Files named per problem before the list is abbreviated.
_MAX_NAMED: Final = 4


def check_run_integrity(run: Run) -> list[str]:
    """Raise :class:`IntegrityError` on foreign events or a closed rank's count mismatch.

    Returns the notes of a degraded read: an unclosed rank that disagrees with its
    manifest beyond the events written after its last rewrite, or a closed rank whose
    only excess is exact duplicates (same ``seq``), which the scans deduplicate.
    """
    _check_run_ids(run)
    notes: list[str] = []
    for rank, manifest in sorted(run.manifests.items()):
        errors, degraded = _count_problems(run, rank, manifest)
        where = f"run {run.run_id!r} rank {rank} ({run.path})"
        if errors:
            raise IntegrityError(
                f"{where} was closed cleanly ({manifest.get('status')}) but its files "
                f"disagree with its manifest: {'; '.join(errors)}"
            )
        if degraded:
            notes.append(f"degraded read of {where}: {'; '.join(degraded)}")
    notes += _missing_ranks(run)
    orphans = sorted({f.rank for fs in run.files.values() for f in fs} - set(run.manifests))
    if run.manifests and orphans:
        notes.append(
            f"degraded read of run {run.run_id!r}: rank(s) {orphans} have events but no "
            "manifest, so their counts cannot be checked"
        )
    return notes


def _missing_ranks(run: Run) -> list[str]:
    """A multi-process run records its world size: a rank with no manifest lost its
    telemetry (never started, or its files were removed), so the totals are short."""
    sizes = [m.get("world_size") for m in run.manifests.values()]
    world = max([w for w in sizes if isinstance(w, int)], default=1)
    missing = sorted(set(range(world)) - set(run.manifests))
    if not missing:
        return []
    return [
        f"degraded read of run {run.run_id!r}: world size {world}, but rank(s) {missing} "
        "have no manifest, so their events are missing from every total"
    ]


def _named(run: Run, files: Sequence[PartFile]) -> str:
    names = [f.name_in(run.path) for f in files[:_MAX_NAMED]]
    more = len(files) - _MAX_NAMED
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def _check_run_ids(run: Run) -> None:
    """Every file of a rank holds events of that rank's run (its manifest's run id)."""
    foreign: list[str] = []
    seen: set[str] = set()
    for files in run.files.values():
        for part in files:
            if part.rows == 0:
                continue
            ids = {part.run_id} if part.run_id is not None else file_run_ids(part.path)
            manifest = run.manifests.get(part.rank) or run.manifest
            expected = str(manifest.get("run_id") or "") if manifest else ""
            seen |= ids
            bad = sorted(ids - {expected}) if expected else []
            if bad:
                foreign.append(f"{part.name_in(run.path)} holds run_id {', '.join(bad)}")
    if not run.manifests and len(seen) > 1:
        foreign.append(f"files mix run ids {', '.join(sorted(seen))}")
    if foreign:
        raise IntegrityError(
            f"run {run.run_id!r} ({run.path}) holds events of another run: "
            f"{'; '.join(foreign[:_MAX_NAMED])}"
            + (
                f" (and {len(foreign) - _MAX_NAMED} more files)"
                if len(foreign) > _MAX_NAMED
                else ""
            )
        )


def _as_count(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _count_problems(run: Run, rank: int, manifest: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(errors, degraded-read notes) of one rank's files against its manifest counts."""
    counts = manifest.get("counts")
    closed = str(manifest.get("status")) in _CLOSED
    if not isinstance(counts, dict):
        return [], ["its manifest has no event counts, so they cannot be checked"]
    last_seq = _as_count(manifest.get("last_seq"))
    errors: list[str] = []
    degraded: list[str] = []
    for event_type in known_event_types():
        files = [f for f in run.files.get(event_type, ()) if f.rank == rank]
        expected = _as_count(counts.get(event_type, 0))
        raw = sum(f.rows for f in files)
        if expected == raw:
            continue
        held = _distinct(files)
        named = f" ({_named(run, files)})" if files else ""
        if expected is None:
            problem = f"{event_type}: the manifest count {counts[event_type]!r} is not a number"
        else:
            problem = f"{event_type}: manifest counts {expected}, files hold {held}{named}"
        if expected == held:  # exact duplicates only: the scans drop them
            degraded.append(f"{event_type}: {raw - held} duplicate event(s){named} ignored")
        elif closed:
            errors.append(problem)
        elif expected is None or last_seq is None:
            degraded.append(problem)
        elif not held - _rows_after(files, last_seq) <= expected <= held:
            degraded.append(f"{problem}, beyond what was written after its last rewrite")
    return errors, degraded


def _distinct(files: Sequence[PartFile]) -> int:
    """Distinct ``seq`` over files that may overlap (copied in, or a merge's leftovers)."""
    spans = sorted(
        (f.seq_min, f.seq_max) for f in files if f.seq_min is not None and f.seq_max is not None
    )
    if len(spans) == len(files) and all(a[1] < b[0] for a, b in itertools.pairwise(spans)):
        return sum(f.rows for f in files)
    frame = scan_parts(files, pl.Schema({"seq": pl.Int64}))
    return int(frame.select(pl.col("seq").n_unique()).collect().item())


def _rows_after(files: Sequence[PartFile], last_seq: int) -> int:
    """Rows with ``seq > last_seq`` (footer statistics; reads ``seq`` only if they straddle)."""
    rows = 0
    for f in files:
        if f.seq_min is not None and f.seq_min > last_seq:
            rows += f.rows
        elif f.seq_max is None or f.seq_max > last_seq:
            seq = f.read_seq()
            rows += int(pc.sum(pc.greater(seq, last_seq)).as_py() or 0)
    return rows
