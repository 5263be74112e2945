"""The synthetic run generator writes a consistent stream that every analysis accepts."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from esper_analysis.baseline import capture_baseline, check_baseline
from esper_analysis.counts import event_counts
from esper_analysis.lifecycles import seed_lifecycles
from esper_analysis.loader import load_run
from esper_analysis.rewards import reward_breakdown
from esper_analysis.rollbacks import rollback_audit
from esper_analysis.synth import synthesize_run
from esper_analysis.throughput import throughput

N_EVENTS = 60_000


def test_synthetic_run_is_consistent(tmp_path: Path) -> None:
    synth = synthesize_run(tmp_path / "synth", N_EVENTS, seed=3)
    assert abs(synth.n_events - N_EVENTS) < N_EVENTS * 0.05
    run = load_run(synth.path)
    seqs = pl.concat([run.scan(t).select("seq") for t in run.event_types]).collect()["seq"]
    assert seqs.sort().to_list() == list(range(synth.n_events))
    counts = event_counts(run)
    assert counts.total == synth.n_events
    assert counts.by_type["manifest"].to_list() == counts.by_type["events"].to_list()
    assert counts.env_steps == synth.rounds * synth.n_envs * synth.episode_length
    assert reward_breakdown(run).flagged_rows == 0
    audit = rollback_audit(run)
    assert audit.count > 0 and audit.all_reached_buffer and audit.all_reached_episode
    lc = seed_lifecycles(run)
    assert lc.fossilized > 0 and lc.pruned > 0 and lc.alive > 0
    assert (lc.seeds["lifetime_epochs"] >= 0).all()
    assert throughput(run).rounds.height == synth.rounds
    assert check_baseline(run, capture_baseline(run)).ok


def test_same_seed_same_counts_and_existing_path_refused(tmp_path: Path) -> None:
    a = synthesize_run(tmp_path / "a", 20_000, seed=5)
    b = synthesize_run(tmp_path / "b", 20_000, seed=5)
    assert a.n_events == b.n_events
    check = check_baseline(load_run(b.path), capture_baseline(load_run(a.path)))
    assert check.ok, check.drift
    with pytest.raises(FileExistsError):
        synthesize_run(tmp_path / "a", 10, seed=1)
