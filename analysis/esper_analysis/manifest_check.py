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
  degraded (a warning, and :attr:`esper_analysis.loader.Run.degraded`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import pyarrow.compute as pc
import pyarrow.parquet as pq

from esper.core.enums import RunStatus
from esper.telemetry.events import EVENT_TYPES
from esper.telemetry.manifest import Manifest, effective_status
from esper_analysis.integrity import IntegrityError

if TYPE_CHECKING:
    from esper_analysis.loader import PartFile, Run

_CLOSED: Final = frozenset({RunStatus.FINISHED, RunStatus.FAILED, RunStatus.INTERRUPTED})
#: Files named per problem before the list is abbreviated.
_MAX_NAMED: Final = 4


def check_run_integrity(run: Run) -> list[str]:
    """Raise :class:`IntegrityError` on foreign events or a closed rank's count mismatch.

    Returns the notes of a degraded read: an unclosed rank that disagrees with its
    manifest beyond the events written after its last rewrite, or ranks whose events
    cannot be checked or are missing.
    """
    _check_run_ids(run)
    notes: list[str] = []
    for rank, manifest in sorted(run.manifests.items()):
        problems = _count_problems(run, rank, manifest)
        where = f"run {run.run_id!r} rank {rank} ({run.path})"
        if problems and effective_status(manifest) in _CLOSED:
            raise IntegrityError(
                f"{where} was closed cleanly ({manifest.status}) but its files disagree "
                f"with its manifest: {'; '.join(problems)}"
            )
        if problems:
            notes.append(f"degraded read of {where}: {'; '.join(problems)}")
    with_files = {f.rank for fs in run.files.values() for f in fs}
    orphans = sorted(with_files - set(run.manifests))
    if run.manifests and orphans:
        notes.append(
            f"degraded read of run {run.run_id!r}: rank(s) {orphans} have events but no "
            "manifest, so their counts cannot be checked"
        )
    world = max((m.world_size for m in run.manifests.values()), default=1)
    missing = sorted(set(range(world)) - set(run.manifests) - with_files)
    if missing:  # a multi-process run records its world size
        notes.append(
            f"degraded read of run {run.run_id!r}: world size {world}, but rank(s) {missing} "
            "have no manifest and no events, so their events are missing from every total"
        )
    return notes


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
            manifest = run.manifests.get(part.rank) or run.manifest
            seen |= part.run_ids
            bad = sorted(part.run_ids - {manifest.run_id}) if manifest else []
            if bad:
                foreign.append(f"{part.name_in(run.path)} holds run_id {', '.join(bad)}")
    if not run.manifests and len(seen) > 1:
        foreign.append(f"files mix run ids {', '.join(sorted(seen))}")
    if foreign:
        more = len(foreign) - _MAX_NAMED
        raise IntegrityError(
            f"run {run.run_id!r} ({run.path}) holds events of another run: "
            f"{'; '.join(foreign[:_MAX_NAMED])}" + (f" (and {more} more files)" if more > 0 else "")
        )


def _count_problems(run: Run, rank: int, manifest: Manifest) -> list[str]:
    """How one rank's files differ from its manifest's counts (a rank that did not
    close may hold events after its ``last_seq``)."""
    closed = effective_status(manifest) in _CLOSED
    problems: list[str] = []
    for event_type in EVENT_TYPES:
        files = [f for f in run.files.get(event_type, ()) if f.rank == rank]
        expected = manifest.counts.get(event_type, 0)
        held = sum(f.rows for f in files)
        if expected == held or (
            not closed and held - _rows_after(files, manifest.last_seq) <= expected <= held
        ):
            continue
        named = f" ({_named(run, files)})" if files else ""
        after = "" if closed else ", beyond what was written after its last rewrite"
        problems.append(
            f"{event_type}: manifest counts {expected}, files hold {held}{named}{after}"
        )
    return problems


def _rows_after(files: Sequence[PartFile], last_seq: int) -> int:
    """Rows with ``seq > last_seq`` (from the names; reads ``seq`` only where they straddle)."""
    rows = 0
    for f in files:
        if f.first > last_seq:
            rows += f.rows
        elif f.last > last_seq:
            seq = pq.read_table(f.path, columns=["seq"]).column("seq")
            rows += int(pc.sum(pc.greater(seq, last_seq)).as_py() or 0)
    return rows
