"""One synthetic environment of the telemetry demo: a host with three slots and seeds.

It follows the real lifecycle rules (transition table, op masks, embargo and reset
durations, minimum prune age) with synthetic numbers, so the events it emits look like
a training run's. Gate G2 is scaled down (:data:`DEMO_G2_EPOCHS`) so seeds can mature
within a short demo episode.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import msgspec

from esper.core.constants import (
    ALPHA_TARGETS,
    EMBARGO_EPOCHS,
    GERMINATE_BLOCKING,
    HEAD_NAMES,
    MIN_PRUNE_AGE,
    OCCUPYING,
    PRUNABLE,
    RELEVANT_HEADS,
    RESETTING_EPOCHS,
    RETARGETABLE,
    STYLE_BLEND,
    TEMPOS,
    TRANSITIONS,
)
from esper.core.enums import (
    CounterfactualUnavailable,
    GateId,
    GerminationStyle,
    Initiator,
    LifecycleOp,
    PruneReason,
    RewardFamily,
    RollbackReason,
    SeedStage,
)
from esper.telemetry import events as ev
from esper.telemetry.events import make_breakdown
from esper.telemetry.hub import Hub

SLOTS: Final = ("r0c0", "r0c1", "r1c0")
MAX_SEEDS: Final = 3
DEMO_G2_EPOCHS: Final = 2
#: The synthetic policy mostly blends seeds fully in (weights over ALPHA_TARGETS).
ALPHA_TARGET_WEIGHTS: Final = (1.0, 1.0, 6.0)
UNREADY_ADVANCE_FACTOR: Final = 0.1
HOST_PARAMS: Final = 120_000
ROLLBACK_PENALTY: Final = -10.0
SNAPSHOT_EVERY: Final = 5
#: Relative preference of the synthetic policy for each op (when the op is valid).
OP_WEIGHTS: Final[dict[LifecycleOp, float]] = {
    LifecycleOp.WAIT: 1.0,
    LifecycleOp.GERMINATE: 3.0,
    LifecycleOp.SET_ALPHA_TARGET: 0.3,
    LifecycleOp.PRUNE: 0.6,
    LifecycleOp.FOSSILIZE: 4.0,
    LifecycleOp.ADVANCE: 4.0,
}
_BLOCKS_GERMINATION: Final = frozenset(GERMINATE_BLOCKING)  # the policy mask's rule
_ADVANCE_TO: Final = {
    SeedStage.GERMINATED: (SeedStage.TRAINING, GateId.G1),
    SeedStage.TRAINING: (SeedStage.BLENDING, GateId.G2),
    SeedStage.BLENDING: (SeedStage.HOLDING, GateId.G3),
}
_OCCUPYING: Final = frozenset(OCCUPYING)  # the policy mask's rules, as sets
_PRUNABLE: Final = frozenset(PRUNABLE)


@dataclass
class _Slot:
    name: str
    stage: SeedStage = SeedStage.DORMANT
    seed_id: str = ""
    blueprint: str = ""
    age: int = 0
    in_stage: int = 0
    alpha: float = 0.0
    alpha_target: float = 1.0
    tempo: int = TEMPOS[0]
    quality: float = 0.0
    contribution: float = math.nan
    params: int = 0

    @property
    def at_rest(self) -> bool:
        return self.stage != SeedStage.BLENDING or self.alpha >= self.alpha_target


class DemoEnv:
    def __init__(
        self, hub: Hub, rng: random.Random, rnd: int, env: int, blueprints: tuple[str, ...]
    ) -> None:
        self.hub, self.rng, self.rnd, self.env = hub, rng, rnd, env
        self.blueprints = blueprints
        self.slots = [_Slot(name) for name in SLOTS]
        self.val_acc = rng.uniform(35.0, 45.0)
        self.val_loss = 2.3 - self.val_acc / 50.0
        self.seeds = {"germinated": 0, "fossilized": 0, "pruned": 0}
        self.params_added = 0
        self.episode_reward = 0.0
        self.rollbacks = 0
        self.rollback_penalty = 0.0
        self._pending_penalty = 0.0
        self._n_seeds = 0
        self._step = -1
        self._last: tuple[LifecycleOp, bool, float, int] | None = None

    # --- per step ---------------------------------------------------------------------

    def step(self, step: int, *, panic: bool = False) -> None:
        """One host epoch, then one policy decision (``panic``: the governor rolls back).

        As in the trainer, a decision's reward is known only after the next epoch, so
        the reward of the previous decision is emitted here; a rollback's penalty lands
        on that transition (``penalized_step = max(step - 1, 0)``).
        """
        self._step = step
        self._tick()
        self._host_epoch()
        if panic:
            self._rollback()
        if self._last is not None:
            self._reward(*self._last, terminal=False)
        self._counterfactual()
        mask = self._op_mask()
        ops = [op for op in LifecycleOp if mask[op]]
        op = self.rng.choices(ops, weights=[self._weight(o) for o in ops])[0]
        slot = self._pick_slot(op)
        executed, shaping = self._execute(op, slot)
        self._action(op, slot, executed, mask)
        self._last = (op, executed, shaping, step)

    def _emit_stage(self, slot: _Slot, to: SeedStage, initiator: Initiator) -> None:
        if to not in TRANSITIONS[slot.stage]:
            raise ValueError(f"illegal transition {slot.stage} -> {to}")
        self.hub.emit(
            ev.SeedStageChanged(
                round=self.rnd,
                env=self.env,
                step=self._step,
                slot=slot.name,
                seed_id=slot.seed_id,
                blueprint=slot.blueprint,
                from_stage=slot.stage.value,
                to_stage=to.value,
                epochs_in_prev_stage=slot.in_stage,
                alpha=slot.alpha,
                initiator=initiator.value,
            )
        )
        slot.stage, slot.in_stage = to, 0

    def _tick(self) -> None:
        for slot in self.slots:
            slot.age += 1
            slot.in_stage += 1
            if slot.stage == SeedStage.BLENDING and not slot.at_rest:
                slot.alpha = min(slot.alpha_target, slot.alpha + slot.alpha_target / slot.tempo)
            elif slot.stage == SeedStage.PRUNED:
                self._emit_stage(slot, SeedStage.EMBARGOED, Initiator.SYSTEM)
            elif slot.stage == SeedStage.EMBARGOED and slot.in_stage > EMBARGO_EPOCHS:
                self._emit_stage(slot, SeedStage.RESETTING, Initiator.SYSTEM)
            elif slot.stage == SeedStage.RESETTING and slot.in_stage > RESETTING_EPOCHS:
                self._emit_stage(slot, SeedStage.DORMANT, Initiator.SYSTEM)
                slot.seed_id, slot.blueprint, slot.alpha = "", "", 0.0
            if slot.stage in (SeedStage.BLENDING, SeedStage.HOLDING, SeedStage.FOSSILIZED):
                slot.contribution = slot.quality * slot.alpha + self.rng.gauss(0.0, 0.2)
            else:
                slot.contribution = math.nan

    def _host_epoch(self) -> None:
        r = self.rng
        boost = sum(s.contribution for s in self.slots if not math.isnan(s.contribution))
        self.val_acc = min(99.0, self.val_acc + (95.0 - self.val_acc) * 0.08 + 0.05 * boost)
        self.val_loss = max(0.05, 2.3 * (1.0 - self.val_acc / 100.0) + r.gauss(0.0, 0.02))
        active = [s for s in self.slots if s.stage in _OCCUPYING]
        self.hub.emit(
            ev.EnvStep(
                round=self.rnd,
                env=self.env,
                step=self._step,
                train_loss=self.val_loss * r.uniform(0.85, 0.95),
                train_acc=min(100.0, self.val_acc + r.uniform(0.5, 3.0)),
                val_loss=self.val_loss,
                val_acc=self.val_acc,
                active_seeds=len(active),
                host_params=HOST_PARAMS,
                seed_params=sum(s.params for s in active),
                train_ms=r.uniform(20.0, 30.0),
                val_ms=r.uniform(5.0, 8.0),
                features_ms=r.uniform(0.2, 0.4),
                policy_ms=r.uniform(0.8, 1.5),
            )
        )

    def _counterfactual(self) -> None:
        contributions, reasons = [], []
        for slot in self.slots:
            if slot.stage not in _OCCUPYING:
                reason = CounterfactualUnavailable.NO_SEED
            elif math.isnan(slot.contribution):
                reason = CounterfactualUnavailable.ALPHA_ZERO
            else:
                reason = CounterfactualUnavailable.AVAILABLE
            reasons.append(reason.value)
            contributions.append(slot.contribution if reason == reason.AVAILABLE else math.nan)
        measured = [c for c in contributions if not math.isnan(c)]
        interaction = self.rng.gauss(0.0, 0.1) if len(measured) > 1 else 0.0
        self.hub.emit(
            ev.CounterfactualComputed(
                round=self.rnd,
                env=self.env,
                step=self._step,
                slots=list(SLOTS),
                contributions=contributions,
                unavailable_reasons=reasons,
                shapley=[c + interaction / len(measured) if measured else c for c in contributions],
                interaction=interaction,
                real_acc=self.val_acc,
                all_off_acc=self.val_acc - sum(measured) - interaction,
                n_configs=2 ** len(measured),
                exact_shapley=True,
            )
        )

    def _op_mask(self) -> dict[LifecycleOp, bool]:
        stages = [s.stage for s in self.slots]
        # Unlike the real mask (OCCUPYING), the demo does not count fossilized seeds
        # against MAX_SEEDS; kept so that the demo stream stays the same.
        live = sum(1 for s in stages if s in _PRUNABLE)
        return {
            LifecycleOp.WAIT: True,
            LifecycleOp.GERMINATE: SeedStage.DORMANT in stages
            and live < MAX_SEEDS
            and not any(s in _BLOCKS_GERMINATION for s in stages),
            LifecycleOp.SET_ALPHA_TARGET: any(
                s.stage in RETARGETABLE and s.at_rest for s in self.slots
            ),
            LifecycleOp.PRUNE: any(self._prunable(s) for s in self.slots),
            LifecycleOp.FOSSILIZE: SeedStage.HOLDING in stages,
            LifecycleOp.ADVANCE: any(s in _ADVANCE_TO for s in stages),
        }

    def _weight(self, op: LifecycleOp) -> float:
        """The synthetic policy has learned to advance mostly seeds that pass the gate."""
        if op == LifecycleOp.ADVANCE and not any(self._ready(s) for s in self.slots):
            return OP_WEIGHTS[op] * UNREADY_ADVANCE_FACTOR
        return OP_WEIGHTS[op]

    @staticmethod
    def _ready(slot: _Slot) -> bool:
        if slot.stage == SeedStage.TRAINING:
            return slot.in_stage >= DEMO_G2_EPOCHS
        if slot.stage == SeedStage.BLENDING:
            return slot.alpha >= 1.0
        return slot.stage == SeedStage.GERMINATED

    @staticmethod
    def _prunable(slot: _Slot) -> bool:
        return slot.stage in _PRUNABLE and slot.age >= MIN_PRUNE_AGE and slot.at_rest

    def _pick_slot(self, op: LifecycleOp) -> _Slot:
        wanted: Callable[[_Slot], bool] = {
            LifecycleOp.WAIT: lambda s: s is self.slots[0],
            LifecycleOp.GERMINATE: lambda s: s.stage == SeedStage.DORMANT,
            LifecycleOp.SET_ALPHA_TARGET: lambda s: (
                s.stage in (SeedStage.BLENDING, SeedStage.HOLDING) and s.at_rest
            ),
            LifecycleOp.PRUNE: self._prunable,
            LifecycleOp.FOSSILIZE: lambda s: s.stage == SeedStage.HOLDING,
            LifecycleOp.ADVANCE: lambda s: s.stage in _ADVANCE_TO,
        }[op]
        candidates = [s for s in self.slots if wanted(s)]
        if op == LifecycleOp.ADVANCE:
            candidates = [s for s in candidates if self._ready(s)] or candidates
        return self.rng.choice(candidates)

    # --- actions ----------------------------------------------------------------------

    def _execute(self, op: LifecycleOp, slot: _Slot) -> tuple[bool, float]:
        """Apply ``op``; return (executed, stage-shaping reward)."""
        if op == LifecycleOp.GERMINATE:
            self._germinate(slot)
            return True, 0.1
        if op == LifecycleOp.ADVANCE:
            target, gate = _ADVANCE_TO[slot.stage]
            if not self._gate(slot, gate, target):
                return False, 0.0
            if target == SeedStage.HOLDING:
                slot.alpha = 1.0
            self._emit_stage(slot, target, Initiator.POLICY)
            return True, 0.2
        if op == LifecycleOp.FOSSILIZE:
            if not self._gate(slot, GateId.G5, SeedStage.FOSSILIZED):
                return False, 0.0
            self._fossilize(slot)
            return True, 0.5
        if op == LifecycleOp.PRUNE:
            self._prune(slot, PruneReason.POLICY, Initiator.POLICY)
            return True, 0.0
        if op == LifecycleOp.SET_ALPHA_TARGET:
            slot.alpha_target = self.rng.choices(ALPHA_TARGETS, weights=ALPHA_TARGET_WEIGHTS)[0]
            if slot.stage == SeedStage.HOLDING and slot.alpha_target < 1.0:
                self._emit_stage(slot, SeedStage.BLENDING, Initiator.POLICY)
            return True, 0.0
        return True, 0.0

    def _gate(self, slot: _Slot, gate: GateId, target: SeedStage) -> bool:
        checks: dict[str, bool]
        if gate == GateId.G2:
            checks = {"training_epochs": slot.in_stage >= DEMO_G2_EPOCHS, "gradient_health": True}
        elif gate == GateId.G3:
            checks = {"alpha_target_reached": slot.alpha >= 1.0, "alpha_at_rest": slot.at_rest}
        elif gate == GateId.G5:
            measured = not math.isnan(slot.contribution)
            checks = {"contribution_measured": measured, "healthy": slot.quality > -1.0}
        else:
            checks = {"stage_ok": True}
        passed = all(checks.values())
        failed = [name for name, ok in checks.items() if not ok]
        self.hub.emit(
            ev.GateEvaluated(
                round=self.rnd,
                env=self.env,
                step=self._step,
                slot=slot.name,
                seed_id=slot.seed_id,
                gate=gate.value,
                target_stage=target.value,
                passed=passed,
                checks_passed=[name for name, ok in checks.items() if ok],
                checks_failed=failed,
                message="ok" if passed else "failed: " + ", ".join(failed),
                strict=False,
            )
        )
        return passed

    def _germinate(self, slot: _Slot) -> None:
        r = self.rng
        self._n_seeds += 1
        style = r.choice(list(GerminationStyle))
        slot.seed_id = f"e{self.env}-s{self._n_seeds}"
        slot.blueprint = r.choice(self.blueprints)
        slot.tempo = r.choice(TEMPOS)
        slot.alpha_target = r.choices(ALPHA_TARGETS, weights=ALPHA_TARGET_WEIGHTS)[0]
        slot.alpha, slot.age, slot.quality = 0.0, 0, r.gauss(0.8, 1.0)
        slot.params = r.randint(500, 20_000)
        self._gate(slot, GateId.G0, SeedStage.GERMINATED)
        self.hub.emit(
            ev.SeedGerminated(
                round=self.rnd,
                env=self.env,
                step=self._step,
                slot=slot.name,
                seed_id=slot.seed_id,
                blueprint=slot.blueprint,
                style=int(style),
                blend_op=STYLE_BLEND[style].value,
                tempo=slot.tempo,
                alpha_target=slot.alpha_target,
                params=slot.params,
                acc_at_germination=self.val_acc,
            )
        )
        self._emit_stage(slot, SeedStage.GERMINATED, Initiator.POLICY)
        self.seeds["germinated"] += 1

    def _fossilize(self, slot: _Slot) -> None:
        self.hub.emit(
            ev.SeedFossilized(
                round=self.rnd,
                env=self.env,
                step=self._step,
                slot=slot.name,
                seed_id=slot.seed_id,
                blueprint=slot.blueprint,
                contribution=slot.contribution,
                params=slot.params,
                age_epochs=slot.age,
            )
        )
        self._emit_stage(slot, SeedStage.FOSSILIZED, Initiator.POLICY)
        self.seeds["fossilized"] += 1
        self.params_added += slot.params

    def _prune(self, slot: _Slot, reason: PruneReason, initiator: Initiator) -> None:
        self.hub.emit(
            ev.SeedPruned(
                round=self.rnd,
                env=self.env,
                step=self._step,
                slot=slot.name,
                seed_id=slot.seed_id,
                blueprint=slot.blueprint,
                reason=reason.value,
                initiator=initiator.value,
                age_epochs=slot.age,
                stage_at_prune=slot.stage.value,
                contribution=slot.contribution,
                scheduled=False,
            )
        )
        slot.alpha = 0.0
        self._emit_stage(slot, SeedStage.PRUNED, initiator)
        self.seeds["pruned"] += 1

    def _action(
        self, op: LifecycleOp, slot: _Slot, executed: bool, mask: dict[LifecycleOp, bool]
    ) -> None:
        r = self.rng
        n_valid = sum(mask.values())
        op_prob = OP_WEIGHTS[op] / sum(OP_WEIGHTS[o] for o in LifecycleOp if mask[o])
        self.hub.emit(
            ev.ActionTaken(
                round=self.rnd,
                env=self.env,
                step=self._step,
                op=op.name,
                slot=slot.name,
                blueprint=slot.blueprint or self.blueprints[0],
                style=0,
                tempo=TEMPOS.index(slot.tempo),
                alpha_target=slot.alpha_target,
                alpha_speed=0,
                alpha_curve=0,
                executed=executed,
                op_mask=[mask[o] for o in LifecycleOp],
                n_valid_ops=n_valid,
                masked_heads=[h for h in HEAD_NAMES if h not in RELEVANT_HEADS[op]],
                value=r.gauss(0.0, 1.0),
                log_prob=math.log(op_prob),
                op_prob=op_prob,
            )
        )

    def _reward(
        self, op: LifecycleOp, executed: bool, shaping: float, step: int, *, terminal: bool
    ) -> None:
        """Reward of the decision taken at ``step`` (components sum to the total)."""
        live = [s for s in self.slots if s.stage in _PRUNABLE]
        measured = [s.contribution for s in live if not math.isnan(s.contribution)]
        breakdown = make_breakdown(
            attribution=0.1 * sum(measured),
            stage_shaping=shaping,
            rent=-0.02 * len(live),
            alpha_shock=-0.01 * sum(1 for s in live if not s.at_rest),
            germinate_cost=-0.05 if op == LifecycleOp.GERMINATE and executed else 0.0,
            fossilize_bonus=0.5 if op == LifecycleOp.FOSSILIZE and executed else 0.0,
            prune_penalty=-0.1 if op == LifecycleOp.PRUNE and executed else 0.0,
            invalid_penalty=0.0 if executed else -0.1,
            terminal=0.05 * self.val_acc / 10.0 if terminal else 0.0,
            rollback_penalty=self._pending_penalty,
        )
        self._pending_penalty = 0.0
        self.episode_reward += breakdown.total
        self.hub.emit(  # the breakdown is the event, with its context
            msgspec.structs.replace(
                breakdown,
                round=self.rnd,
                env=self.env,
                step=step,
                family=RewardFamily.CONTRIBUTION.value,
                op=op.name,
                normalized=breakdown.total / 2.0,
            )
        )

    # --- governor and episode end -------------------------------------------------------

    def _rollback(self) -> None:
        """Divergence in this epoch: restore the snapshot, prune live seeds, penalise.

        The penalty is added to this step's reward, so it reaches the buffer.
        """
        step = self._step
        last_snapshot = step - step % SNAPSHOT_EVERY
        loss = self.val_loss * 40.0
        pruned = [s for s in self.slots if s.stage in _PRUNABLE]
        for slot in pruned:
            self._prune(slot, PruneReason.GOVERNOR_ROLLBACK, Initiator.GOVERNOR)
        self.hub.emit(
            ev.GovernorRollback(
                round=self.rnd,
                env=self.env,
                step=step,
                reason=RollbackReason.DIVERGENCE.value,
                loss=loss,
                threshold=12.0,
                restored_to_step=last_snapshot,
                penalized_step=max(step - 1, 0),
                seeds_pruned=[s.seed_id for s in pruned],
                transitions_affected=step - last_snapshot + 1,
                penalty=ROLLBACK_PENALTY,
            )
        )
        self.rollbacks += 1
        self.rollback_penalty += ROLLBACK_PENALTY
        self._pending_penalty += ROLLBACK_PENALTY

    def finish(self, steps: int) -> tuple[float, float]:
        """Reward the last decision (terminal), emit the episode summary.

        Returns (episode reward, final accuracy).
        """
        if self._last is not None:
            self._reward(*self._last, terminal=True)
            self._last = None
        self.hub.emit(
            ev.EpisodeFinished(
                round=self.rnd,
                env=self.env,
                step=steps - 1,
                final_val_acc=self.val_acc,
                final_val_loss=self.val_loss,
                host_params=HOST_PARAMS,
                params_added=self.params_added,
                seeds_germinated=self.seeds["germinated"],
                seeds_fossilized=self.seeds["fossilized"],
                seeds_pruned=self.seeds["pruned"],
                episode_reward=self.episode_reward,
                rollbacks=self.rollbacks,
                rollback_penalty=self.rollback_penalty,
            )
        )
        return self.episode_reward, self.val_acc
