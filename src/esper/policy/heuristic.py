"""Rule-based baseline policy with the learned policy's interface.

Rules, in priority order for each env:
1. prune a seed whose measured contribution is below ``prune_threshold_pp`` (it hurts);
2. fossilize a HOLDING seed whose contribution clears ``fossilize_threshold_pp``;
3. prune a seed that has stalled (HOLDING without clearing the threshold, or stuck in
   TRAINING, for ``heuristic_stall_epochs`` epochs);
4. advance GERMINATED seeds, TRAINING seeds once G2 can pass, BLENDING seeds once alpha
   reached the target (retargeting to it first when the blend stopped short);
5. germinate when :meth:`HeuristicPolicy.germinate_now` says so (here: once the host is
   stabilised and has plateaued for ``plateau_patience`` epochs) in the first free slot,
   rotating through the :class:`Growth` blueprints (by default largest-capacity first)
   and avoiding recently pruned ones;
6. otherwise wait.
Every action is checked against the masks, so it is always valid. Its numbers (tempo,
alpha target, style, stall epochs, prune penalty and decay, rotation) are ``[policy]``
keys. Its memory (blueprint penalties and the rotation cursor) travels in the recurrent
``hidden`` slot, so fresh episodes start from :meth:`initial_hidden` exactly like the
learned policy's. :class:`esper.policy.eager.EagerPolicy` is the same rules with
another germination trigger and its own :class:`Growth`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from esper.config import EagerConfig, PolicyConfig
from esper.core.constants import (
    ALL_BLUEPRINTS,
    G2_MIN_GRADIENT_HEALTH,
    G2_MIN_TRAINING_EPOCHS,
)
from esper.core.enums import GerminationStyle, LifecycleOp, SeedStage
from esper.core.records import SlotReport
from esper.core.transfer import host_copy
from esper.errors import ConfigError
from esper.policy.actions import N_HEADS, N_OPS, ActionSpace, DecodedAction, encode_action
from esper.policy.masks import order_reports
from esper.policy.protocol import Hidden, PolicyInput, PolicyStep
from esper.policy.signals import SignalTracker

_N_BLUEPRINTS = len(ALL_BLUEPRINTS)
#: ``valid(op, slot_index)`` predicate handed to the rule helpers.
_Valid = Callable[[LifecycleOp, int], bool]


class _EnvMemory:
    """One env's heuristic memory, unpacked from / packed into the hidden state."""

    def __init__(self, penalties: np.ndarray, cursor: int) -> None:
        self.penalties = penalties
        self.cursor = cursor


@dataclass(frozen=True)
class Growth:
    """What a rule-based policy germinates, where and how."""

    #: Rotation order (names in ``ALL_BLUEPRINTS``).
    blueprints: tuple[str, ...]
    style: GerminationStyle
    #: Blend length at germination, also the retarget speed (in ``TEMPOS``).
    tempo: int
    alpha_target: float
    #: Slots to germinate in, first free one first; empty: every slot in host order.
    slot_order: tuple[str, ...] = ()
    #: The config key path these choices came from (named in errors).
    origin: str = "policy.heuristic_"

    @classmethod
    def of_heuristic(cls, cfg: PolicyConfig) -> Growth:
        """The heuristic's ``policy.heuristic_*`` keys."""
        return cls(
            blueprints=tuple(cfg.heuristic_blueprints),
            style=GerminationStyle[cfg.heuristic_style.upper()],
            tempo=cfg.heuristic_tempo,
            alpha_target=cfg.heuristic_alpha_target,
        )

    @classmethod
    def of_eager(cls, cfg: EagerConfig) -> Growth:
        """The eager grower's ``[policy.eager]`` keys."""
        return cls(
            blueprints=tuple(cfg.blueprints),
            style=GerminationStyle[cfg.style.upper()],
            tempo=cfg.tempo,
            alpha_target=cfg.alpha_target,
            slot_order=tuple(cfg.slot_order),
            origin="policy.eager.",
        )

    def slot_indices(self, space: ActionSpace) -> tuple[int, ...]:
        """Germination slots as indices into ``space.slot_ids``, in preference order."""
        if not self.slot_order:
            return tuple(range(space.n_slots))
        for i, slot in enumerate(self.slot_order):
            if slot not in space.slot_ids:
                raise ConfigError(
                    f"$.{self.origin}slot_order[{i}]: this host has no slot {slot!r} "
                    f"(its slots: {', '.join(space.slot_ids)})"
                )
        return tuple(space.slot_index(slot) for slot in self.slot_order)


class HeuristicPolicy:
    """Baseline: deterministic rules over slot reports and the signal tracker."""

    def __init__(self, space: ActionSpace, cfg: PolicyConfig, growth: Growth | None = None) -> None:
        self.space = space
        self.cfg = cfg
        self.growth = growth or Growth.of_heuristic(cfg)
        self.style = self.growth.style
        self.order = self.growth.blueprints
        #: Index into ALL_BLUEPRINTS (the blueprint head) of each rotation position.
        self.rotation = tuple(ALL_BLUEPRINTS.index(name) for name in self.order)
        #: Slot indices (report order) germination may use, most preferred first.
        self.germination_slots = self.growth.slot_indices(space)

    def initial_hidden(self, n: int, device: torch.device | str) -> Hidden:
        """(blueprint penalties [1, N, B], rotation cursor [1, N, 1]) for fresh episodes."""
        return (
            torch.zeros(1, n, _N_BLUEPRINTS, device=device),
            torch.zeros(1, n, 1, device=device),
        )

    def act(
        self,
        inp: PolicyInput,
        hidden: Hidden,
        *,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> PolicyStep:
        """Rule-based actions for all envs (``generator``/``deterministic`` are unused)."""
        del generator, deterministic  # the rules are deterministic
        n = len(inp.reports)
        device = inp.obs.device
        # One device->host transfer for the masks and the memory together.
        packed_masks = inp.masks.packed()
        packed = np.array(
            host_copy(
                torch.cat([packed_masks.float(), hidden[0][0].float(), hidden[1][0].float()], dim=1)
            ),
            dtype=np.float32,
        )
        width = packed_masks.shape[1]
        masks = inp.masks.unpack(packed[:, :width] > 0.5)
        penalties = packed[:, width : width + _N_BLUEPRINTS].astype(np.float64)
        cursors = packed[:, width + _N_BLUEPRINTS].astype(np.int64)
        rows: list[tuple[int, ...]] = []
        for e in range(n):
            memory = _EnvMemory(penalties[e] * self.cfg.heuristic_penalty_decay, int(cursors[e]))
            action = self.decide(
                order_reports(inp.reports[e], self.space),
                inp.trackers[e],
                {name: m[e] for name, m in masks.items()},
                memory,
            )
            rows.append(encode_action(action, self.space))
            penalties[e], cursors[e] = memory.penalties, memory.cursor
        actions = torch.from_numpy(np.array(rows, dtype=np.int64).reshape(n, N_HEADS)).to(device)
        zeros = torch.zeros(n, N_HEADS, device=device)
        new_hidden = (
            torch.from_numpy(penalties.astype(np.float32)).to(device)[None],
            torch.from_numpy(cursors.astype(np.float32)).to(device).view(1, n, 1),
        )
        return PolicyStep(
            actions=actions,
            log_probs=zeros,
            value=torch.zeros(n, device=device),
            op_probs=torch.eye(N_OPS, device=device)[actions[:, 0]],  # no one_hot sync
            entropy=zeros.clone(),
            hidden=new_hidden,
        )

    # --- rules (host-side, one env) -------------------------------------------------

    def decide(
        self,
        reports: Sequence[SlotReport],
        tracker: SignalTracker,
        masks: dict[str, np.ndarray],
        memory: _EnvMemory,
    ) -> DecodedAction:
        """The first rule that applies and is valid under ``masks`` (op [ops], slot [ops, S])."""
        valid = validity(masks)
        for s, r in enumerate(reports):
            if (
                _measured(r)
                and r.contribution < self.cfg.prune_threshold_pp
                and valid(LifecycleOp.PRUNE, s)
            ):
                return self._prune(r, memory)
        for s, r in enumerate(reports):
            if (
                r.stage == SeedStage.HOLDING
                and _measured(r)
                and r.contribution >= self.cfg.fossilize_threshold_pp
                and valid(LifecycleOp.FOSSILIZE, s)
            ):
                return DecodedAction(op=LifecycleOp.FOSSILIZE, slot_id=r.slot_id)
        for s, r in enumerate(reports):
            if self._stalled(r) and valid(LifecycleOp.PRUNE, s):
                return self._prune(r, memory)
        for s, r in enumerate(reports):
            action = self._progress(r, s, valid)
            if action is not None:
                return action
        if self.germinate_now(tracker):
            slots = [s for s in self.germination_slots if valid(LifecycleOp.GERMINATE, s)]
            germinate = (
                self._germinate(reports[slots[0]], masks["blueprint"], memory) if slots else None
            )
            if germinate is not None:
                return germinate
        return DecodedAction(op=LifecycleOp.WAIT)

    def germinate_now(self, tracker: SignalTracker) -> bool:
        """Rule 5's trigger: the host is stabilised and has plateaued long enough."""
        return tracker.host_stabilised and tracker.plateau_count >= self.cfg.plateau_patience

    def _stalled(self, r: SlotReport) -> bool:
        if r.stage == SeedStage.HOLDING:
            below = not (_measured(r) and r.contribution >= self.cfg.fossilize_threshold_pp)
            return below and r.epochs_in_stage >= self.cfg.heuristic_stall_epochs
        if r.stage == SeedStage.TRAINING:
            stall = G2_MIN_TRAINING_EPOCHS + self.cfg.heuristic_stall_epochs
            return r.epochs_in_stage >= stall
        return False

    def _progress(self, r: SlotReport, s: int, valid: _Valid) -> DecodedAction | None:
        """Move a seed along its lifecycle when the next gate can pass."""
        advance = DecodedAction(op=LifecycleOp.ADVANCE, slot_id=r.slot_id)
        if r.stage == SeedStage.GERMINATED and valid(LifecycleOp.ADVANCE, s):
            return advance
        if r.stage == SeedStage.TRAINING and valid(LifecycleOp.ADVANCE, s):
            healthy = not (r.grad_health < G2_MIN_GRADIENT_HEALTH)  # NaN: let the gate judge
            return advance if r.epochs_in_stage >= G2_MIN_TRAINING_EPOCHS and healthy else None
        if r.stage != SeedStage.BLENDING or not r.alpha_at_rest:
            return None
        target = self.growth.alpha_target
        if r.alpha >= target and valid(LifecycleOp.ADVANCE, s):
            return advance
        if r.alpha_target < target and valid(LifecycleOp.SET_ALPHA_TARGET, s):
            return DecodedAction(
                op=LifecycleOp.SET_ALPHA_TARGET,
                slot_id=r.slot_id,
                style=self.style,
                alpha_target=target,
                alpha_speed=self.growth.tempo,
            )
        return None

    def _prune(self, r: SlotReport, memory: _EnvMemory) -> DecodedAction:
        if r.blueprint in ALL_BLUEPRINTS:
            memory.penalties[ALL_BLUEPRINTS.index(r.blueprint)] += self.cfg.heuristic_prune_penalty
        return DecodedAction(op=LifecycleOp.PRUNE, slot_id=r.slot_id)

    def _germinate(
        self, r: SlotReport, blueprint_mask: np.ndarray, memory: _EnvMemory
    ) -> DecodedAction | None:
        """Next blueprint in rotation order among the least-penalised valid ones
        (``memory.cursor`` is a position in ``self.order``); None when the host offers
        none of the rotation's blueprints."""
        candidates = [k for k, i in enumerate(self.rotation) if blueprint_mask[i]]
        if not candidates:
            return None
        best = min(
            candidates,
            key=lambda k: (
                round(float(memory.penalties[self.rotation[k]]), 6),
                (k - memory.cursor) % len(self.order),
            ),
        )
        memory.cursor = (best + 1) % len(self.order)
        return DecodedAction(
            op=LifecycleOp.GERMINATE,
            slot_id=r.slot_id,
            blueprint=self.order[best],
            style=self.style,
            tempo=self.growth.tempo,
            alpha_target=self.growth.alpha_target,
        )


def validity(masks: dict[str, np.ndarray]) -> _Valid:
    """``valid(op, slot_index)`` for one env's host-side masks (op [ops], slot [ops, S])."""

    def valid(op: LifecycleOp, s: int) -> bool:
        return bool(masks["op"][op] and masks["slot"][op, s])

    return valid


def _measured(r: SlotReport) -> bool:
    return math.isfinite(r.contribution)
