"""Gradient metrics, parameter counts, seed metrics in slot reports."""

from __future__ import annotations

import math

import pytest
import torch
from _model_support import drive_to, germinate, sample_input, tiny_model

from esper.core.enums import AlphaCurve, Initiator, PruneReason, SeedStage, Topology
from esper.model import ParamCounts
from esper.model.metrics import GRAD_EXPLODING_RMS, gradient_health, gradient_ratio


def test_grad_norms_match_a_direct_computation() -> None:
    model = tiny_model(seed=1)
    s0, s1 = model.slot_ids[0], model.slot_ids[3]
    germinate(model, s0, "conv_small")
    drive_to(model, s0, SeedStage.TRAINING)
    germinate(model, s1, "bottleneck")
    drive_to(model, s1, SeedStage.BLENDING)
    model.tick(50.0)
    loss = model(sample_input(Topology.CNN, 8)).logsumexp(1).mean()
    loss.backward()
    norms = model.grad_norms()
    assert norms.shape == (len(model.slot_ids), 2)

    def direct(params) -> float:
        gs = [p.grad.flatten() for p in params if p.grad is not None]
        return float(torch.cat(gs).norm()) if gs else 0.0

    for j, slot in enumerate(model.slot_ids):
        ref = model.host.segments[model.positions[slot].ref_segment]
        assert norms[j, 0].item() == pytest.approx(direct(model.seed_parameters(slot)), rel=1e-5)
        assert norms[j, 1].item() == pytest.approx(direct(ref.parameters()), rel=1e-5)
    assert norms[0, 0] > 0 and norms[3, 0] > 0 and norms[1, 0] == 0
    model.apply_grad_norms(norms.reshape(-1).tolist())
    for j in (0, 3):
        rep = model.slot_reports()[j]
        assert 0.0 <= rep.grad_health <= 1.0 and math.isfinite(rep.grad_norm_ratio)
    assert math.isnan(model.slot_reports()[1].grad_health)
    model.apply_grad_norms([])  # before any training: nothing to apply
    with pytest.raises(ValueError):
        model.apply_grad_norms([1.0])


def test_gradient_health_and_ratio() -> None:
    assert gradient_health(0.0, 100) == 0.0
    assert gradient_health(math.nan, 100) == 0.0
    assert gradient_health(math.inf, 100) == 0.0
    assert gradient_health(0.1, 100) == 1.0
    assert gradient_health(GRAD_EXPLODING_RMS * 40.0, 100) == pytest.approx(0.25)
    assert gradient_health(1e-12, 100) < 0.01
    assert gradient_ratio(1.0, 100, 1.0, 10_000) == pytest.approx(10.0)
    assert math.isnan(gradient_ratio(1.0, 100, 0.0, 100))


def test_param_counts_and_effective_parameters() -> None:
    model = tiny_model(seed=0)
    host = sum(p.numel() for p in model.host.parameters())
    assert model.param_counts() == ParamCounts(host, 0, host)
    s0, s1 = model.slot_ids[:2]
    germinate(model, s0, "conv_heavy", tempo=4)
    n0 = sum(p.numel() for p in model.seed_parameters(s0))
    assert model.param_counts() == ParamCounts(host, n0, host)  # not yet blended in
    drive_to(model, s0, SeedStage.BLENDING)
    model.tick(50.0)
    alpha = model.slot(s0).alpha.alpha
    assert 0 < alpha < 1
    assert model.param_counts().effective == host + round(alpha * n0)
    drive_to(model, s0, SeedStage.FOSSILIZED)
    germinate(model, s1, "norm")
    n1 = sum(p.numel() for p in model.seed_parameters(s1))
    assert model.param_counts() == ParamCounts(host, n0 + n1, host + n0)


def test_transformer_counts_tied_weights_once() -> None:
    model = tiny_model(Topology.TRANSFORMER)
    host = model.host
    assert host.head.proj.weight is host.stem.tok.weight
    unique = {id(p): p.numel() for p in host.parameters()}
    assert model.param_counts().host == sum(unique.values())
    moved = model.to(torch.float64)
    assert moved.host.head.proj.weight is moved.host.stem.tok.weight


def test_reports_track_age_stage_improvement_and_contribution() -> None:
    model = tiny_model()
    slot = model.slot_ids[0]
    germinate(model, slot, "norm")  # acc 50 at germination
    model.advance(slot, initiator=Initiator.POLICY)
    model.tick(52.0)
    model.tick(55.0)
    model.record_contribution(slot, 1.5)
    model.tick(56.0)
    model.record_contribution(slot, 2.5)
    rep = model.slot_reports()[0]
    assert rep.age_epochs == 3 and rep.epochs_in_stage == 3
    assert rep.acc_at_germination == 50.0 and rep.acc_at_stage_start == 50.0
    assert rep.improvement == pytest.approx(6.0)
    assert rep.contribution == 2.5 and rep.contribution_velocity == pytest.approx(1.0)
    assert rep.epochs_since_contribution == 0
    model.tick(56.0)
    assert model.slot_reports()[0].epochs_since_contribution == 1
    assert rep.active and rep.params > 0


def test_scheduled_prune_freezes_the_seed_and_ramps_alpha_down() -> None:
    model = tiny_model()
    slot = model.slot_ids[0]
    germinate(model, slot, "conv_small")
    drive_to(model, slot, SeedStage.HOLDING)
    assert model.prune(
        slot,
        speed=3,
        curve=AlphaCurve.COSINE,
        reason=PruneReason.POLICY,
        initiator=Initiator.POLICY,
    )
    rep = model.slot_reports()[0]
    assert rep.stage == SeedStage.BLENDING and rep.scheduled_prune and not rep.alpha_at_rest
    assert all(not p.requires_grad for p in model.seed_parameters(slot))
    assert not model.set_alpha_target(slot, 1.0, 0, AlphaCurve.LINEAR, initiator=Initiator.POLICY)
    alphas = []
    for _ in range(3):
        model.tick(50.0)
        alphas.append(model.slot_reports()[0].alpha)
    assert alphas[0] > alphas[1] > 0.0 and alphas[2] == 0.0
    assert model.slot(slot).stage == SeedStage.PRUNED
    assert model.seed_parameters(slot) == []
