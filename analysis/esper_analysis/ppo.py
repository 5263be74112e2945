"""PPO health over rounds: losses, entropy per head, KL, clipping, explained variance."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Final

import polars as pl

from esper.core.constants import HEAD_NAMES
from esper_analysis.loader import Run
from esper_analysis.result import AnalysisResult

_MAIN: Final = (
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clip_frac",
    "explained_variance",
    "grad_norm",
    "lr",
    "entropy_coef",
    "ratio_max",
    "epochs_run",
    "early_stopped",
    "skipped",
    "skip_reason",
    "n_transitions",
)


@dataclasses.dataclass(frozen=True)
class PpoHealth(AnalysisResult):
    TITLES: ClassVar[dict[str, str]] = {
        "updates": "PPO updates per round",
        "per_head": "Entropy and clip fraction per head",
    }

    updates: pl.DataFrame
    per_head: pl.DataFrame
    n_updates: int
    skipped: int
    early_stopped: int
    max_kl: float | None
    last_explained_variance: float | None


def ppo_health(run: Run) -> PpoHealth:
    """One row per PPO update (by round and rank) and a long per-head table."""
    lf = run.scan("ppo_update").sort("round", "rank", "seq")
    head_cols = [f"entropy_{h}" for h in HEAD_NAMES] + [f"clip_frac_{h}" for h in HEAD_NAMES]
    updates = lf.select("round", "rank", *_MAIN).collect()
    wide = lf.select("round", "rank", *head_cols).collect()
    per_head = (
        wide.unpivot(index=["round", "rank"], on=head_cols)
        .with_columns(
            metric=pl.when(pl.col("variable").str.starts_with("entropy_"))
            .then(pl.lit("entropy"))
            .otherwise(pl.lit("clip_frac")),
            head=pl.col("variable").str.replace(r"^(entropy|clip_frac)_", ""),
        )
        # "first": a damaged or hand-made run may repeat an update of (round, rank)
        .pivot(
            on="metric", index=["round", "rank", "head"], values="value", aggregate_function="first"
        )
        .sort("round", "rank", "head")
    )
    n = updates.height
    kl = updates["approx_kl"].drop_nans().drop_nulls()
    ev = updates["explained_variance"].drop_nulls()
    return PpoHealth(
        updates=updates,
        per_head=per_head,
        n_updates=n,
        skipped=int(updates["skipped"].sum()) if n else 0,
        early_stopped=int(updates["early_stopped"].sum()) if n else 0,
        max_kl=float(kl.max()) if kl.len() else None,  # type: ignore[arg-type]
        last_explained_variance=float(ev[-1]) if ev.len() else None,
    )
