"""Observation features: the vectorised builder against a slow per-env reference."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from _policy_support import env_reports, report, space
from hypothesis import given, settings
from hypothesis import strategies as st

from esper.core.constants import ALL_BLUEPRINTS, G2_MIN_GRADIENT_HEALTH
from esper.core.enums import AlphaMode, BlendOp, LifecycleOp, SeedStage
from esper.core.records import SlotReport
from esper.policy.features import BASE_DIM, SLOT_DIM, build_features, obs_dim
from esper.policy.signals import SignalTracker

HIST = 5
ACTIVE = {
    SeedStage.GERMINATED,
    SeedStage.TRAINING,
    SeedStage.BLENDING,
    SeedStage.HOLDING,
    SeedStage.FOSSILIZED,
}


def slog(x: float) -> float:
    if not math.isfinite(x):
        return 0.0
    return math.copysign(math.log1p(abs(x)), x)


def fin(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def ref_base(
    t: SignalTracker, env: Sequence[SlotReport], epoch: int, max_epochs: int, op: int, ok: bool
) -> list[float]:
    def padded(values: Sequence[float]) -> list[float]:
        vals = list(values)[-HIST:]
        return [vals[0]] * (HIST - len(vals)) + vals if vals else [0.0] * HIST

    f = [epoch / max_epochs, slog(t.last_loss), fin(t.last_acc) / 100.0]
    f += [slog(x) for x in padded(t.loss_history)]
    f += [fin(x) / 100.0 for x in padded(t.acc_history)]
    f += [sum(r.stage == s for r in env) / len(env) for s in SeedStage]
    f.append(1.0 if ok else 0.0)
    f += [1.0 if op == o else 0.0 for o in range(len(LifecycleOp))]
    f.append(min(t.plateau_count, 10) / 10)
    f.append(1.0 if t.host_stabilised else 0.0)
    return f


def ref_slot(r: SlotReport, max_epochs: int) -> list[float]:
    active = r.stage in ACTIVE
    measured = math.isfinite(r.grad_health)
    f = [1.0 if active else 0.0]
    f += [1.0 if r.stage == s else 0.0 for s in SeedStage]
    f += [r.alpha, slog(r.contribution), slog(r.contribution_velocity), slog(r.improvement)]
    f += [r.tempo / 8.0, r.alpha_target]
    f += [1.0 if r.alpha_mode == m else 0.0 for m in AlphaMode]
    total = r.alpha_steps_total
    f.append(r.alpha_steps_done / total if total > 0 else 0.0)
    f.append(r.alpha_velocity)
    f += [1.0 if active and r.blend_op == b else 0.0 for b in BlendOp]
    f += [slog(r.grad_norm_ratio), fin(r.grad_health), 1.0 if measured else 0.0]
    f.append(1.0 if measured and r.grad_health < G2_MIN_GRADIENT_HEALTH else 0.0)
    f.append(r.epochs_in_stage / max_epochs)
    since = r.epochs_since_contribution
    f.append(1.0 / (1.0 + since) if since >= 0 else 0.0)
    f.append(r.age_epochs / max_epochs)
    f.append(1.0 if r.scheduled_prune else 0.0)
    return f


def reference(trackers, reports, epoch, max_epochs, ops, oks):
    rows, ids = [], []
    for t, env, op, ok in zip(trackers, reports, ops, oks, strict=True):
        row = ref_base(t, env, epoch, max_epochs, op, ok)
        for r in env:
            row += ref_slot(r, max_epochs)
        rows.append(row)
        ids.append(
            [
                ALL_BLUEPRINTS.index(r.blueprint) + 1 if r.stage in ACTIVE and r.blueprint else 0
                for r in env
            ]
        )
    return np.array(rows), np.array(ids)


@st.composite
def trackers(draw: st.DrawFn, n: int) -> list[SignalTracker]:
    out = []
    for _ in range(n):
        t = SignalTracker()
        for _ in range(draw(st.integers(0, 8))):
            loss = draw(st.one_of(st.floats(0.01, 10), st.just(math.nan)))
            t.update(loss, draw(st.floats(0, 100)))
        out.append(t)
    return out


@settings(max_examples=50, deadline=None)
@given(data=st.data(), n_envs=st.integers(1, 4), n_slots=st.integers(1, 4))
def test_vectorised_features_match_reference(
    data: st.DataObject, n_envs: int, n_slots: int
) -> None:
    sp = space(n_slots)
    reports = data.draw(env_reports(n_envs, sp.slot_ids))
    trk = data.draw(trackers(n_envs))
    ops = data.draw(st.lists(st.integers(0, 5), min_size=n_envs, max_size=n_envs))
    oks = data.draw(st.lists(st.booleans(), min_size=n_envs, max_size=n_envs))
    epoch, max_epochs = data.draw(st.integers(0, 20)), 20
    obs, bp = build_features(
        trackers=trk,
        reports=reports,
        epoch=epoch,
        max_epochs=max_epochs,
        last_ops=ops,
        last_success=oks,
        device="cpu",
    )
    want_obs, want_ids = reference(trk, reports, epoch, max_epochs, ops, oks)
    assert obs.dtype == torch.float32 and obs.shape == (n_envs, obs_dim(n_slots))
    assert want_obs.shape == obs.shape
    np.testing.assert_allclose(obs.numpy(), want_obs, rtol=1e-5, atol=1e-6)
    assert bp.dtype == torch.long
    assert np.array_equal(bp.numpy(), want_ids)
    assert torch.isfinite(obs).all()


def test_obs_dim_formula() -> None:
    assert obs_dim(4) == BASE_DIM + 4 * SLOT_DIM
    assert (BASE_DIM, SLOT_DIM) == (31, 32)


def test_envs_must_share_slot_order() -> None:
    with pytest.raises(ValueError, match="same slots"):
        build_features(
            trackers=[SignalTracker(), SignalTracker()],
            reports=[[report("a"), report("b")], [report("b"), report("a")]],
            epoch=0,
            max_epochs=10,
            last_ops=[0, 0],
            last_success=[True, True],
            device="cpu",
        )
