"""The demo (also the analysis layer's synthetic runs) drives the real lifecycle code:
the model's slot operations, gates, tick and the policy's mask rules."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from _telemetry_support import read_type

from esper.core.constants import SUCCESS_PATH, TRANSITIONS
from esper.core.enums import GateId, GerminationStyle, Initiator, SeedStage
from esper.model import gates
from esper.model.lifecycle import COOLDOWN_EPOCHS, COOLDOWN_STAGES, SeedLifecycle
from esper.model.metrics import SeedMetrics
from esper.model.slot_state import SlotState
from esper.model.slot_table import SlotTable
from esper.model.ticks import tick_slots
from esper.telemetry.demo import DemoSettings, run_demo
from esper.telemetry.demo_env import DEMO_G2_EPOCHS, MAX_SEEDS
from esper.telemetry.events import GateEvaluated, LifecycleEvent


def test_success_path_follows_the_transition_table() -> None:
    assert SUCCESS_PATH[0] in TRANSITIONS[SeedStage.DORMANT]
    assert all(b in TRANSITIONS[a] for a, b in itertools.pairwise(SUCCESS_PATH))
    assert TRANSITIONS[SUCCESS_PATH[-1]] == frozenset()  # terminal


def _check_names() -> dict[str, set[str]]:
    """Every check each real gate lists (permissive; G2 with the demo's threshold)."""
    life, metrics = SeedLifecycle(), SeedMetrics()
    results = [
        gates.gate_g0(
            seed_id="s", blueprint="b", blueprint_known=True, stage=SeedStage.DORMANT,
            live_seeds=0, max_seeds=MAX_SEEDS, strict=False,
        ),
        gates.gate_g5(life, metrics, strict=False),
    ]  # fmt: skip
    names = {r.gate: {*r.checks_passed, *r.checks_failed} for r in results}
    cell = np.array([0])
    for gate, _, checks in gates.ADVANCE_GATES.values():
        permissive, _ = checks(SlotTable(1, 1), cell, cell, DEMO_G2_EPOCHS)
        names[gate.value] = {name for name, _ in permissive}
    return names


def test_demo_gate_checks_are_the_model_gates(tmp_path: Path) -> None:
    run = run_demo(tmp_path, "g", DemoSettings(rounds=2, seed=1)).run_dir
    names = _check_names()
    seen = set()
    for row in read_type(run, "gate_evaluated"):
        assert {*row["checks_passed"], *row["checks_failed"]} == names[row["gate"]], row
        assert row["passed"] == (not row["checks_failed"])
        seen.add(row["gate"])
    assert {GateId.G0.value, GateId.G1.value, GateId.G2.value} <= seen


def test_demo_lifecycles_follow_the_transitions_and_cooldowns(tmp_path: Path) -> None:
    settings = DemoSettings(rounds=2, steps=25, rollback_p=0.5, seed=2)
    rows = read_type(run_demo(tmp_path, "c", settings).run_dir, "seed_stage_changed")
    by_slot: dict[tuple[int, int, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_slot[(row["round"], row["env"], row["slot"])].append(row)
    cooldowns = 0
    for changes in by_slot.values():
        stage = SeedStage.DORMANT
        cooldown = 0
        for row in changes:
            src, dst = SeedStage(row["from_stage"]), SeedStage(row["to_stage"])
            assert src == stage and dst in TRANSITIONS[src], row
            if (src, dst) == (SeedStage.TRAINING, SeedStage.BLENDING):  # through G2
                assert row["epochs_in_prev_stage"] >= DEMO_G2_EPOCHS
            if src in COOLDOWN_STAGES:
                cooldown += row["epochs_in_prev_stage"]
            if dst == SeedStage.DORMANT and src == SeedStage.RESETTING:
                assert cooldown == COOLDOWN_EPOCHS
                cooldowns, cooldown = cooldowns + 1, 0
            stage = dst
    assert cooldowns > 0


def test_slot_state_takes_g2_threshold() -> None:
    """The torch-free slot the demo drives passes G2 after its own minimum epochs."""
    table = SlotTable(1, 1)
    slot = SlotState("s", table=table, g2_min_epochs=DEMO_G2_EPOCHS)
    events: list[LifecycleEvent] = []
    slot.emit = events.append
    slot.germinate(
        seed_id="s1", blueprint="conv_small", style=GerminationStyle.LINEAR_ADD, tempo=3,
        alpha_target=1.0, current_acc=50.0, n_params=1000, initiator=Initiator.POLICY,
    )  # fmt: skip
    assert slot.advance(Initiator.POLICY) and slot.stage == SeedStage.TRAINING
    for _ in range(DEMO_G2_EPOCHS):
        slot.record_gradients(0.3, 1.0, 10_000)
        tick_slots(table, np.array([0]), np.array([50.0]), lambda _r, _c: slot, auto_advance=False)
    assert slot.advance(Initiator.POLICY) and slot.stage == SeedStage.BLENDING
    g2 = [e for e in events if isinstance(e, GateEvaluated) and e.gate == GateId.G2.value]
    assert g2[0].checks_passed[1] == f"epochs_in_training>={DEMO_G2_EPOCHS}"
