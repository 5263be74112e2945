"""What a run that did not close cleanly still holds: the loader's recovery report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from esper.core.enums import RunStatus

if TYPE_CHECKING:
    from esper_analysis.loader import Run


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str


@dataclass(frozen=True)
class Recovery:
    """What could be read from a run that did not close cleanly."""

    status: RunStatus
    files_read: tuple[str, ...]
    files_skipped: tuple[SkippedFile, ...]
    events: int
    last_seq: dict[int, int]
    seq_gaps: dict[int, int]
    manifest_last_seq: dict[int, int]
    message: str


def recovery_of(run: Run) -> Recovery:
    """What a scan of the run recovers: events, last ``seq`` and gaps per rank, files."""
    last_seq: dict[int, int] = {}
    gaps: dict[int, int] = {}
    events = 0
    if run.files:
        per_rank = (
            run.scan_envelopes(["rank", "seq"])
            .group_by("rank")
            .agg(
                n=pl.col("seq").n_unique(),
                lo=pl.col("seq").min(),
                hi=pl.col("seq").max(),
            )
            .sort("rank")
            .collect()
        )
        for rank, n, lo, hi in per_rank.iter_rows():
            last_seq[int(rank)] = int(hi)
            gaps[int(rank)] = int(hi) - int(lo) + 1 - int(n)
            events += int(n)
    files_read = tuple(dict.fromkeys(f.name_in(run.path) for fs in run.files.values() for f in fs))
    seq_text = ", ".join(f"rank {r}: {s}" for r, s in last_seq.items()) or "none"
    message = (
        f"run {run.run_id} is {run.status.value}: recovered {events} events from "
        f"{len(files_read)} files (last seq {seq_text})"
    )
    if run.skipped:
        message += f"; skipped {len(run.skipped)} unreadable file(s)"
    if any(gaps.values()):
        message += f"; {sum(gaps.values())} seq gap(s)"
    return Recovery(
        status=run.status,
        files_read=files_read,
        files_skipped=tuple(run.skipped),
        events=events,
        last_seq=last_seq,
        seq_gaps=gaps,
        manifest_last_seq={r: m.last_seq for r, m in run.manifests.items()},
        message=message,
    )
