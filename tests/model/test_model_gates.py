"""Quality gates G0-G5 in permissive and strict modes, and the records they produce."""

from __future__ import annotations

import msgspec
from _model_support import DIGITS_SPEC, TINY_CNN, drive_to, germinate, healthy_grads, tiny_model

from esper.core.constants import G2_MIN_TRAINING_EPOCHS, G3_STRICT_MIN_BLENDING_EPOCHS
from esper.core.enums import (
    AlphaCurve,
    GateId,
    GerminationStyle,
    Initiator,
    PruneReason,
    SeedStage,
)
from esper.model import build_model
from esper.telemetry.events import GateEvaluated, LifecycleEvent, SeedStageChanged

P = Initiator.POLICY


def _gates(records: list[LifecycleEvent], gate: GateId) -> list[GateEvaluated]:
    return [r for r in records if isinstance(r, GateEvaluated) and r.gate == gate.value]


def test_g0_checks_identity_blueprint_emptiness_and_limit() -> None:
    records: list[LifecycleEvent] = []
    model = tiny_model(records=records)
    model.max_seeds = 2
    s0, s1, s2 = model.slot_ids[:3]
    g = GerminationStyle.LINEAR_ADD
    assert not model.germinate(s0, "norm", g, 3, 1.0, seed_id="", current_acc=0, initiator=P)
    assert not model.germinate(s0, "lora", g, 3, 1.0, seed_id="a", current_acc=0, initiator=P)
    assert model.germinate(s0, "norm", g, 3, 1.0, seed_id="a", current_acc=0, initiator=P)
    assert not model.germinate(s0, "norm", g, 3, 1.0, seed_id="b", current_acc=0, initiator=P)
    assert model.germinate(s1, "norm", g, 3, 1.0, seed_id="b", current_acc=0, initiator=P)
    assert not model.germinate(s2, "norm", g, 3, 1.0, seed_id="c", current_acc=0, initiator=P)
    failed = [r.checks_failed for r in _gates(records, GateId.G0) if not r.passed]
    assert failed == [
        ["seed_id_present"],
        ["blueprint_known"],  # a transformer blueprint on a CNN host
        ["slot_empty"],
        ["under_seed_limit"],
    ]
    assert [r.seed_id for r in _gates(records, GateId.G0)] == ["", "a", "a", "b", "b", "c"]


def test_g1_and_g2_permissive() -> None:
    records: list[LifecycleEvent] = []
    model = tiny_model(records=records)
    slot = model.slot_ids[0]
    germinate(model, slot, "conv_small")
    assert model.advance(slot, initiator=P)
    assert model.slot(slot).stage == SeedStage.TRAINING
    for _ in range(G2_MIN_TRAINING_EPOCHS):
        assert not model.advance(slot, initiator=P)
        model.tick(50.0)
    assert not model.advance(slot, initiator=P)  # epochs ok, but gradient never measured
    assert _gates(records, GateId.G2)[-1].checks_failed == [
        "gradient_health_measured",
        "gradient_health>=0.7",
    ]
    model.apply_grad_norms([0.0] * (2 * len(model.slot_ids)))  # a dead gradient
    assert not model.advance(slot, initiator=P)
    assert _gates(records, GateId.G2)[-1].checks_failed == ["gradient_health>=0.7"]
    model.apply_grad_norms(healthy_grads(model))
    assert model.advance(slot, initiator=P)
    assert model.slot(slot).stage == SeedStage.BLENDING
    assert len(_gates(records, GateId.G1)) == 1


def test_g2_strict_needs_improvement_and_gradient_ratio() -> None:
    records: list[LifecycleEvent] = []
    model = tiny_model(strict=True, records=records)
    slot = model.slot_ids[0]
    germinate(model, slot, "conv_small")
    model.advance(slot, initiator=P)
    for _ in range(G2_MIN_TRAINING_EPOCHS):
        model.tick(50.0)  # no improvement over the 50% at stage start
    model.apply_grad_norms(healthy_grads(model))
    assert not model.advance(slot, initiator=P)
    assert "stage_improvement>=0.5pp" in _gates(records, GateId.G2)[-1].checks_failed
    model.tick(51.0)
    n = len(model.slot_ids)
    model.apply_grad_norms([1e-6, 1e3] * n)  # seed gradient tiny next to the host's
    assert not model.advance(slot, initiator=P)
    assert _gates(records, GateId.G2)[-1].checks_failed == ["grad_ratio>=0.1"]
    model.apply_grad_norms(healthy_grads(model))
    assert model.advance(slot, initiator=P)


def test_g3_needs_full_alpha_at_rest_and_strict_needs_time() -> None:
    for strict in (False, True):
        records: list[LifecycleEvent] = []
        model = tiny_model(strict=strict, records=records)
        slot = model.slot_ids[1]
        germinate(model, slot, "norm", tempo=3, target=0.5)
        drive_to(model, slot, SeedStage.BLENDING)
        assert not model.advance(slot, initiator=P)  # ramp still moving
        model.tick(50.0)
        assert not model.advance(slot, initiator=P)
        for _ in range(2):
            model.tick(50.0)
        assert model.slot(slot).alpha.alpha == 0.5
        assert not model.advance(slot, initiator=P)  # at rest, but the target is 0.5
        assert _gates(records, GateId.G3)[-1].checks_failed == ["alpha_target_is_1"] + (
            ["epochs_in_blending>=10"] if strict else []
        )
        assert model.set_alpha_target(slot, 1.0, 0, AlphaCurve.LINEAR, initiator=P)
        if strict:
            assert not model.advance(slot, initiator=P)
            while model.slot(slot).life.epochs_in_stage < G3_STRICT_MIN_BLENDING_EPOCHS:
                model.tick(50.0)
        assert model.advance(slot, initiator=P)
        assert model.slot(slot).stage == SeedStage.HOLDING


def test_g5_needs_measured_contribution_and_strict_needs_one_point() -> None:
    for strict in (False, True):
        records: list[LifecycleEvent] = []
        model = tiny_model(strict=strict, records=records)
        slot = model.slot_ids[2]
        germinate(model, slot, "depthwise")
        model.apply_grad_norms(healthy_grads(model))
        drive_to(model, slot, SeedStage.HOLDING)
        assert not model.fossilize(slot, initiator=P)
        assert "contribution_measured" in _gates(records, GateId.G5)[-1].checks_failed
        model.record_contribution(slot, 0.4)
        assert model.fossilize(slot, initiator=P) is (not strict)
        if strict:
            model.record_contribution(slot, 1.2)
            assert model.fossilize(slot, initiator=P)
        assert model.slot(slot).stage == SeedStage.FOSSILIZED
        assert not model.prune(slot, reason=PruneReason.POLICY, initiator=P)
        assert not model.advance(slot, initiator=P)


def test_inapplicable_ops_return_false_without_changing_anything() -> None:
    records: list[LifecycleEvent] = []
    model = tiny_model(records=records)
    slot = model.slot_ids[0]
    assert not model.advance(slot, initiator=P)
    assert not model.fossilize(slot, initiator=P)
    assert not model.prune(slot, reason=PruneReason.POLICY, initiator=P)
    assert not model.set_alpha_target(slot, 0.5, 3, AlphaCurve.LINEAR, initiator=P)
    assert records == []
    germinate(model, slot, "norm")
    assert not model.set_alpha_target(slot, 0.5, 3, AlphaCurve.LINEAR, initiator=P)
    assert not model.fossilize(slot, initiator=P)
    assert model.slot(slot).stage == SeedStage.GERMINATED


def test_auto_advance_passes_each_gate_once_its_timing_is_met() -> None:
    """host.auto_advance: G1 at the next tick, G2 after the minimum epochs (healthy
    gradient), G3 when the blend rests at alpha 1; each move is the system's."""
    records: list[LifecycleEvent] = []
    model = build_model(
        msgspec.structs.replace(TINY_CNN, auto_advance=True),
        DIGITS_SPEC,
        seed=0,
        reporter=records.append,
    )
    slot = model.slot_ids[0]
    germinate(model, slot, "conv_small", tempo=3)
    model.tick(50.0)
    assert model.slot(slot).stage == SeedStage.TRAINING
    for _ in range(G2_MIN_TRAINING_EPOCHS - 1):
        model.apply_grad_norms(healthy_grads(model))
        model.tick(50.0)
    assert model.slot(slot).stage == SeedStage.TRAINING
    assert not _gates(records, GateId.G2)  # never tried before its minimum epochs
    model.apply_grad_norms(healthy_grads(model))
    model.tick(50.0)
    assert model.slot(slot).stage == SeedStage.BLENDING
    for _ in range(3):
        model.tick(50.0)
    assert model.slot(slot).stage == SeedStage.HOLDING
    model.tick(50.0)
    assert model.slot(slot).stage == SeedStage.HOLDING  # fossilizing stays a decision
    moves = [r for r in records if isinstance(r, SeedStageChanged)]
    assert [(m.to_stage, m.initiator) for m in moves][1:] == [
        (SeedStage.TRAINING, Initiator.SYSTEM),
        (SeedStage.BLENDING, Initiator.SYSTEM),
        (SeedStage.HOLDING, Initiator.SYSTEM),
    ]
    # A blend resting short of alpha 1 stays blending: G3 is not even tried.
    short = model.slot_ids[1]
    germinate(model, short, "norm", tempo=3, target=0.7)
    for _ in range(G2_MIN_TRAINING_EPOCHS + 6):
        model.apply_grad_norms(healthy_grads(model))
        model.tick(50.0)
    assert model.slot(short).stage == SeedStage.BLENDING
    assert all(r.passed for r in _gates(records, GateId.G3))


def test_without_auto_advance_seeds_wait_for_the_policy() -> None:
    model = tiny_model()
    slot = model.slot_ids[0]
    germinate(model, slot, "conv_small")
    for _ in range(G2_MIN_TRAINING_EPOCHS + 2):
        model.apply_grad_norms(healthy_grads(model))
        model.tick(50.0)
    assert model.slot(slot).stage == SeedStage.GERMINATED
