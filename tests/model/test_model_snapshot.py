"""Governor support: exact snapshot/restore of host + fossils, and pruning live seeds."""

from __future__ import annotations

import io

import torch
from _model_support import drive_to, germinate, perturb_seed, sample_input, tiny_model

from esper.core.enums import GerminationStyle, Initiator, PruneReason, SeedStage, Topology
from esper.telemetry.events import LifecycleEvent, SeedPruned


def _train_steps(model, steps: int = 3) -> None:
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model.train()
    for i in range(steps):
        x = sample_input(Topology.CNN, 8, seed=i)
        loss = model(x).logsumexp(dim=1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_restore_is_bitwise_exact_and_survives_torch_save() -> None:
    model = tiny_model(seed=4)
    a, b, c = model.slot_ids[:3]
    germinate(model, a, "conv_heavy", GerminationStyle.GATED_GATE)
    drive_to(model, a, SeedStage.FOSSILIZED)
    perturb_seed(model, a)
    _train_steps(model)
    snap = model.snapshot_state()
    assert all(v.device == next(model.parameters()).device for v in snap.values())
    buf = io.BytesIO()
    torch.save(snap, buf)
    buf.seek(0)
    snap = torch.load(buf, weights_only=True)
    expected = _state(model)
    x = sample_input(Topology.CNN, 4)
    expected_out = model.eval()(x)

    # Diverge: more training, a second fossil, a live seed.
    germinate(model, b, "bottleneck")
    drive_to(model, b, SeedStage.FOSSILIZED)
    germinate(model, c, "norm")
    drive_to(model, c, SeedStage.TRAINING)
    _train_steps(model)

    model.restore_state(snap)
    assert model.slot(b).stage == SeedStage.DORMANT  # not in the snapshot
    assert model.slot(a).stage == SeedStage.FOSSILIZED
    pruned = model.prune_live_seeds(
        reason=PruneReason.GOVERNOR_ROLLBACK, initiator=Initiator.GOVERNOR
    )
    assert pruned == (c,)
    restored = _state(model)
    assert restored.keys() == expected.keys()
    for k, v in expected.items():
        assert torch.equal(restored[k], v), k
    assert torch.equal(model.eval()(x), expected_out)


def test_restore_rebuilds_a_missing_fossil_in_a_fresh_model() -> None:
    model = tiny_model(seed=9)
    slot = model.slot_ids[1]
    germinate(model, slot, "attention", GerminationStyle.LINEAR_MULTIPLY)
    drive_to(model, slot, SeedStage.FOSSILIZED)
    perturb_seed(model, slot)
    snap = model.snapshot_state()
    fresh = tiny_model(seed=123)
    fresh.restore_state(snap)
    rep = fresh.slot_reports()[1]
    assert rep.stage == SeedStage.FOSSILIZED and rep.blueprint == "attention"
    assert rep.seed_id == model.slot_reports()[1].seed_id and rep.alpha == 1.0
    x = sample_input(Topology.CNN, 3)
    assert torch.equal(fresh.eval()(x), model.eval()(x))


def test_prune_live_seeds_reports_every_pruned_seed() -> None:
    records: list[LifecycleEvent] = []
    model = tiny_model(records=records)
    s = model.slot_ids
    germinate(model, s[0], "norm")
    drive_to(model, s[0], SeedStage.FOSSILIZED)
    germinate(model, s[1], "norm")
    germinate(model, s[2], "norm", tempo=8)
    drive_to(model, s[2], SeedStage.HOLDING)
    assert model.prune(s[2], speed=5, reason=PruneReason.POLICY, initiator=Initiator.POLICY)
    model.tick(50.0)  # mid-ramp scheduled prune
    records.clear()
    pruned = model.prune_live_seeds(
        reason=PruneReason.GOVERNOR_ROLLBACK, initiator=Initiator.GOVERNOR
    )
    assert pruned == (s[1], s[2])
    got = [r for r in records if isinstance(r, SeedPruned)]
    assert [r.slot for r in got] == [s[1], s[2]]
    assert all(
        r.reason == PruneReason.GOVERNOR_ROLLBACK and r.initiator == Initiator.GOVERNOR for r in got
    )
    assert model.live_seed_slots() == (s[0],)
