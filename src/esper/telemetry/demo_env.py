"""The envs of one telemetry-demo round: hosts with three slots and synthetic seeds.

The round's seeds live in one real :class:`~esper.model.slot_table.SlotTable` (a row
per env) and are driven by the model's own torch-free code, in the trainer's order:
:func:`~esper.model.metrics.record_contributions` and
:func:`~esper.model.metrics.record_gradients` take the epoch's measurements,
:func:`~esper.model.ticks.tick_slots` runs the epoch (ages, alpha ramps, cooldowns,
scheduled prunes), :mod:`esper.policy.mask_rules` says which ops the synthetic policy
may choose and :class:`~esper.model.slot_state.SlotState` runs them through their
gates. Only the numbers fed in (accuracies, contributions, gradient norms) and the
policy's choices are synthetic, so the events are a training run's. Gate G2's minimum
training epochs is scaled down (:data:`DEMO_G2_EPOCHS`) so seeds can mature within a
short demo episode.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import numpy as np

from esper.core.constants import (
    ALL_BLUEPRINTS,
    ALPHA_SPEEDS,
    ALPHA_TARGETS,
    FORWARD_STAGES,
    HEAD_NAMES,
    OCCUPYING,
    PRUNABLE,
    RELEVANT_HEADS,
    TEMPOS,
)
from esper.core.enums import (
    AlphaCurve,
    AlphaMode,
    CounterfactualUnavailable,
    GerminationStyle,
    Initiator,
    LifecycleOp,
    PruneReason,
    RewardFamily,
    RollbackReason,
    Topology,
)
from esper.model.gates import gate_g0
from esper.model.lifecycle import LIVE_CODES, TRAINS_CODES, effective_alphas
from esper.model.metrics import record_contributions, record_gradients
from esper.model.reports import report_columns
from esper.model.slot_state import SlotState
from esper.model.slot_table import MODE_CODE, STAGE_CODE, SlotTable
from esper.model.ticks import tick_slots
from esper.policy.actions import ActionSpace, DecodedAction, encode_action
from esper.policy.mask_rules import op_mask, slot_op_mask
from esper.telemetry import events as ev
from esper.telemetry.events import LifecycleEvent, make_breakdown
from esper.telemetry.hub import Hub

SLOTS: Final = ("r0c0", "r0c1", "r1c0")
SPACE: Final = ActionSpace(slot_ids=SLOTS, topology=Topology.CNN)
MAX_SEEDS: Final = 3
#: G2's minimum training epochs in the demo (the real one outlasts a demo episode).
DEMO_G2_EPOCHS: Final = 2
#: The synthetic policy's menus (besides the blueprints) and its preferences there:
#: mostly it blends seeds fully in (weights over ALPHA_TARGETS); otherwise uniform.
_MENUS: Final[dict[str, Sequence[Any]]] = {
    "style": tuple(GerminationStyle),
    "tempo": TEMPOS,
    "alpha_target": ALPHA_TARGETS,
    "alpha_speed": ALPHA_SPEEDS,
    "alpha_curve": tuple(AlphaCurve),
}
_MENU_WEIGHTS: Final[dict[str, Sequence[float]]] = {"alpha_target": (1.0, 1.0, 6.0)}
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
#: Stage-shaping reward of an op that took effect.
SHAPING: Final[dict[LifecycleOp, float]] = {
    LifecycleOp.GERMINATE: 0.1,
    LifecycleOp.ADVANCE: 0.2,
    LifecycleOp.FOSSILIZE: 0.5,
}
#: Synthetic per-parameter RMS gradients: most seeds train healthily, a few explode (G2
#: and G5 then refuse them: gate_g2/gate_g5's gradient-health check).
HOST_GRAD_RMS: Final = 0.005
SEED_GRAD_RMS: Final = 0.01
EXPLODING_GRAD_RMS: Final = 3.0
EXPLODING_SEED_P: Final = 0.1
GRAD_NOISE: Final = 0.3
#: Spread (pp) of a measured contribution around the seed's true effect.
CONTRIBUTION_NOISE: Final = 0.2


#: Stage sets as codes, for one env's few cells.
_OCCUPYING: Final = frozenset(STAGE_CODE[s] for s in OCCUPYING)
_PRUNABLE: Final = frozenset(STAGE_CODE[s] for s in PRUNABLE)
_FORWARD: Final = frozenset(STAGE_CODE[s] for s in FORWARD_STAGES)
_HOLD: Final = MODE_CODE[AlphaMode.HOLD]


class DemoRound:
    """The envs of one round, their slots in one table: each step's measurements, tick
    and masks run over all envs at once, as in the trainer's round."""

    def __init__(
        self, hub: Hub, rng: random.Random, rnd: int, n_envs: int, blueprints: tuple[str, ...]
    ) -> None:
        self.rng = rng
        self.table = SlotTable(n_envs, len(SLOTS))
        self.envs = [DemoEnv(hub, rng, rnd, env, blueprints, self.table) for env in range(n_envs)]
        self._rows = np.arange(n_envs)

    def step(self, step: int, panics: set[int]) -> None:
        """One host epoch of every env, then one decision each (``panics``: the envs the
        governor rolls back)."""
        contributions = self._measure().tolist()
        for env in self.envs:
            env.epoch(step, contributions[env.env], panic=env.env in panics)
        val_acc = np.array([env.val_acc for env in self.envs])
        tick_slots(self.table, self._rows, val_acc, self._slot_of, auto_advance=False)
        slot_mask = slot_op_mask(
            report_columns(self.table), max_seeds=MAX_SEEDS, g2_min_epochs=DEMO_G2_EPOCHS
        )
        ops = op_mask(slot_mask)
        for env in self.envs:
            env.act(step, contributions[env.env], ops[env.env], slot_mask[env.env])

    def _slot_of(self, row: int, col: int) -> SlotState:
        return self.envs[row].slots[col]

    def _measure(self) -> np.ndarray:
        """The epoch's synthetic counterfactual contributions ``[N, S]`` (NaN: alpha 0)
        and gradient norms, recorded into the table for the cells the trainer records."""
        t, r = self.table, self.rng
        alpha = effective_alphas(t)
        rows, cols = np.nonzero((alpha > 0.0) & LIVE_CODES[t.stage])
        effect = [
            self.envs[i].quality[j] for i, j in zip(rows.tolist(), cols.tolist(), strict=True)
        ]
        noise = [r.gauss(0.0, CONTRIBUTION_NOISE) for _ in effect]
        contributions = np.full(t.shape, np.nan)
        contributions[rows, cols] = np.array(effect) * alpha[rows, cols] + noise
        record_contributions(t, (rows, cols), contributions[rows, cols])
        rows, cols = np.nonzero(TRAINS_CODES[t.stage] & ~t.scheduled_prune)
        rms = [self.envs[i].grad_rms[j] for i, j in zip(rows.tolist(), cols.tolist(), strict=True)]
        rms = [x * math.exp(r.gauss(0.0, GRAD_NOISE)) for x in rms]
        record_gradients(
            t,
            (rows, cols),
            np.array(rms) * np.sqrt(t.n_params[rows, cols]),
            np.full(len(rows), HOST_GRAD_RMS * math.sqrt(HOST_PARAMS)),
            np.full(len(rows), HOST_PARAMS),
        )
        return contributions


class DemoEnv:
    """One env of a :class:`DemoRound`: its row of the table, its synthetic host and
    policy, and its events."""

    def __init__(
        self,
        hub: Hub,
        rng: random.Random,
        rnd: int,
        env: int,
        blueprints: tuple[str, ...],
        table: SlotTable,
    ) -> None:
        self.hub, self.rng, self.rnd, self.env = hub, rng, rnd, env
        self.blueprints = blueprints
        self.table = table
        self.slots = [
            SlotState(name, table=table, row=env, col=col, g2_min_epochs=DEMO_G2_EPOCHS)
            for col, name in enumerate(SLOTS)
        ]
        for slot in self.slots:
            slot.emit = self._report
        #: Per slot, the synthetic seed's true effect (pp at alpha 1) and gradient RMS.
        self.quality = [0.0] * len(SLOTS)
        self.grad_rms = [SEED_GRAD_RMS] * len(SLOTS)
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
        self._last: tuple[LifecycleOp, bool, int] | None = None

    # --- per step ---------------------------------------------------------------------

    def epoch(self, step: int, contributions: list[float], *, panic: bool) -> None:
        """The host epoch (its accuracy moved by the seeds' contributions), then the
        governor's rollback if ``panic``."""
        self._step = step
        self._host_epoch(sum(c for c in contributions if not math.isnan(c)))
        if panic:
            self._rollback()

    def act(
        self, step: int, contributions: list[float], ops: np.ndarray, slot_mask: np.ndarray
    ) -> None:
        """After the tick: the previous decision's reward, the counterfactual, then this
        step's decision.

        As in the trainer, a decision's reward is known only after the next epoch; a
        rollback's penalty lands on that transition (``penalized_step = max(step - 1,
        0)``).
        """
        row = self._row()
        if self._last is not None:
            self._reward(*self._last, row, terminal=False)
        self._counterfactual(contributions, row["stage"])
        self._decide(step, ops.tolist(), slot_mask)

    def _row(self) -> dict[str, list[Any]]:
        """This env's cells of the table columns the synthetic numbers read."""
        t, i = self.table, self.env
        return {
            "stage": t.stage[i].tolist(),
            "alpha_mode": t.alpha_mode[i].tolist(),
            "contribution": t.contribution[i].tolist(),
            "n_params": t.n_params[i].tolist(),
        }

    def _report(self, event: LifecycleEvent) -> None:
        """A slot's lifecycle event, stamped like the recorder does; counted for the
        episode summary."""
        if isinstance(event, ev.SeedGerminated):
            self.seeds["germinated"] += 1
        elif isinstance(event, ev.SeedFossilized):
            self.seeds["fossilized"] += 1
            self.params_added += event.params
        elif isinstance(event, ev.SeedPruned):
            self.seeds["pruned"] += 1
        self.hub.emit(msgspec.structs.replace(event, round=self.rnd, env=self.env, step=self._step))

    def _host_epoch(self, boost: float) -> None:
        r = self.rng
        self.val_acc = min(99.0, self.val_acc + (95.0 - self.val_acc) * 0.08 + 0.05 * boost)
        self.val_loss = max(0.05, 2.3 * (1.0 - self.val_acc / 100.0) + r.gauss(0.0, 0.02))
        row = self._row()
        occupied = [code in _OCCUPYING for code in row["stage"]]
        self.hub.emit(
            ev.EnvStep(
                round=self.rnd,
                env=self.env,
                step=self._step,
                train_loss=self.val_loss * r.uniform(0.85, 0.95),
                train_acc=min(100.0, self.val_acc + r.uniform(0.5, 3.0)),
                val_loss=self.val_loss,
                val_acc=self.val_acc,
                active_seeds=sum(occupied),
                host_params=HOST_PARAMS,
                seed_params=sum(p for p, occ in zip(row["n_params"], occupied, strict=True) if occ),
                train_ms=r.uniform(20.0, 30.0),
                val_ms=r.uniform(5.0, 8.0),
                features_ms=r.uniform(0.2, 0.4),
                policy_ms=r.uniform(0.8, 1.5),
            )
        )

    def _counterfactual(self, contributions: list[float], stages: list[int]) -> None:
        """The epoch's synthetic counterfactual; NaN contributions say why."""
        reasons = [
            CounterfactualUnavailable.AVAILABLE
            if not math.isnan(c)
            else CounterfactualUnavailable.NO_SEED
            if code not in _OCCUPYING
            else CounterfactualUnavailable.NOT_IN_FORWARD
            if code not in _FORWARD
            else CounterfactualUnavailable.ALPHA_ZERO
            for c, code in zip(contributions, stages, strict=True)
        ]
        measured = [c for c in contributions if not math.isnan(c)]
        interaction = self.rng.gauss(0.0, 0.1) if len(measured) > 1 else 0.0
        self.hub.emit(
            ev.CounterfactualComputed(
                round=self.rnd,
                env=self.env,
                step=self._step,
                slots=list(SLOTS),
                contributions=contributions,
                unavailable_reasons=[reason.value for reason in reasons],
                shapley=[c + interaction / len(measured) if measured else c for c in contributions],
                interaction=interaction,
                real_acc=self.val_acc,
                all_off_acc=self.val_acc - sum(measured) - interaction,
                n_configs=2 ** len(measured),
                exact_shapley=True,
            )
        )

    # --- the synthetic policy -------------------------------------------------------------

    def _decide(self, step: int, mask: list[bool], slot_mask: np.ndarray) -> None:
        """Choose an op the real mask allows (by :data:`OP_WEIGHTS`) and a legal slot for
        it, run it through the slot, report the action."""
        r = self.rng
        ops = [op for op in LifecycleOp if mask[op]]
        op = r.choices(ops, weights=[OP_WEIGHTS[o] for o in ops])[0]
        col = r.choice(np.flatnonzero(slot_mask[op]).tolist())
        menus = {"blueprint": self.blueprints, **_MENUS}
        action = DecodedAction(
            op=op,
            slot_id=SLOTS[col],
            **{  # the op's heads drawn; the others keep their canonical values
                head: r.choices(menu, weights=_MENU_WEIGHTS.get(head))[0]
                for head, menu in menus.items()
                if head in RELEVANT_HEADS[op]
            },
        )
        executed = self._execute(action, self.slots[col])
        op_prob = OP_WEIGHTS[op] / sum(OP_WEIGHTS[o] for o in ops)
        self._action(action, executed, mask, op_prob)
        self._last = (op, executed, step)

    def _execute(self, a: DecodedAction, slot: SlotState) -> bool:
        """Run the op through the slot's own operation; returns whether it took effect."""
        if a.op == LifecycleOp.GERMINATE:
            return self._germinate(a, slot)
        if a.op == LifecycleOp.ADVANCE:
            return slot.advance(Initiator.POLICY)
        if a.op == LifecycleOp.FOSSILIZE:
            return slot.fossilize(Initiator.POLICY)
        if a.op == LifecycleOp.PRUNE:
            return slot.prune(
                speed=a.alpha_speed,
                curve=a.alpha_curve,
                reason=PruneReason.POLICY,
                initiator=Initiator.POLICY,
            )
        if a.op == LifecycleOp.SET_ALPHA_TARGET:
            return slot.set_alpha_target(
                a.alpha_target, a.alpha_speed, a.alpha_curve, Initiator.POLICY
            )
        return True

    def _germinate(self, a: DecodedAction, slot: SlotState) -> bool:
        """Through G0, as the model germinates; the seed's synthetic numbers drawn."""
        assert a.blueprint is not None
        r = self.rng
        seed_id = f"e{self.env}-s{self._n_seeds + 1}"
        result = gate_g0(
            seed_id=seed_id,
            blueprint=a.blueprint,
            blueprint_known=a.blueprint in self.blueprints,
            stage=slot.stage,
            live_seeds=int(LIVE_CODES[self.table.stage[self.env]].sum()),
            max_seeds=MAX_SEEDS,
            strict=False,
        )
        slot.emit_gate(result, seed_id=seed_id)
        if not result.passed:
            return False
        self._n_seeds += 1
        col = slot.life.col
        self.quality[col] = r.gauss(0.8, 1.0)
        exploding = r.random() < EXPLODING_SEED_P
        self.grad_rms[col] = EXPLODING_GRAD_RMS if exploding else SEED_GRAD_RMS
        slot.germinate(
            seed_id=seed_id,
            blueprint=a.blueprint,
            style=a.style,
            tempo=a.tempo,
            alpha_target=a.alpha_target,
            current_acc=self.val_acc,
            n_params=r.randint(500, 20_000),
            initiator=Initiator.POLICY,
        )
        return True

    def _action(self, a: DecodedAction, executed: bool, mask: list[bool], op_prob: float) -> None:
        """The ``action_taken`` event, built from head indices as the recorder does."""
        h = dict(zip(HEAD_NAMES, encode_action(a, SPACE), strict=True))
        relevant = RELEVANT_HEADS[a.op]
        self.hub.emit(
            ev.ActionTaken(
                round=self.rnd,
                env=self.env,
                step=self._step,
                op=a.op.name,
                slot=SLOTS[h["slot"]] if "slot" in relevant else "",
                blueprint=ALL_BLUEPRINTS[h["blueprint"]] if "blueprint" in relevant else "",
                style=h["style"],
                tempo=h["tempo"],
                alpha_target=ALPHA_TARGETS[h["alpha_target"]],
                alpha_speed=h["alpha_speed"],
                alpha_curve=h["alpha_curve"],
                executed=executed,
                op_mask=mask,
                n_valid_ops=sum(mask),
                masked_heads=[n for n in HEAD_NAMES if n not in relevant],
                value=self.rng.gauss(0.0, 1.0),
                log_prob=math.log(op_prob),
                op_prob=op_prob,
            )
        )

    def _reward(
        self,
        op: LifecycleOp,
        executed: bool,
        step: int,
        row: dict[str, list[Any]],
        *,
        terminal: bool,
    ) -> None:
        """Reward of the decision taken at ``step`` (components sum to the total)."""
        live = [code in _PRUNABLE for code in row["stage"]]
        measured = [
            c for c, on in zip(row["contribution"], live, strict=True) if on and math.isfinite(c)
        ]
        moving = [on and mode != _HOLD for mode, on in zip(row["alpha_mode"], live, strict=True)]
        done = executed and op in SHAPING
        breakdown = make_breakdown(
            attribution=0.1 * sum(measured),
            stage_shaping=SHAPING[op] if done else 0.0,
            rent=-0.02 * sum(live),
            alpha_shock=-0.01 * sum(moving),
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
        pruned = [
            s.life.seed_id
            for s in self.slots
            if s.force_prune(PruneReason.GOVERNOR_ROLLBACK, Initiator.GOVERNOR)
        ]
        self.hub.emit(
            ev.GovernorRollback(
                round=self.rnd,
                env=self.env,
                step=step,
                reason=RollbackReason.DIVERGENCE.value,
                loss=self.val_loss * 40.0,
                threshold=12.0,
                restored_to_step=last_snapshot,
                penalized_step=max(step - 1, 0),
                seeds_pruned=pruned,
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
            self._reward(*self._last, self._row(), terminal=True)
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
