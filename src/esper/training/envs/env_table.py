"""The state of a round's envs as arrays: one row per env.

Why: a step's bookkeeping (metrics, signals, the governor's watch, the reward's memory,
episode totals) is the same few numbers for every env, so it is kept as columns and
updated with array expressions over all envs at once; per-env Python runs only where a
model's structure changes. Each :class:`~esper.training.envs.env_state.EnvState` reads and
writes its own row (its properties), for the per-env code paths (lifecycle operations
on the envs that act, rollbacks, tests).

The seed slots' state is the :class:`~esper.model.slot_table.SlotTable` ``slots``; the
policy's signals are :class:`~esper.policy.signals.Signals`, the governor's watch a
:class:`~esper.training.envs.governor.Guard`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from esper.model.slot_table import SlotTable
from esper.policy.signals import Signals
from esper.telemetry.events import (
    LifecycleEvent,
    SeedFossilized,
    SeedGerminated,
    SeedPruned,
    set_fields,
)

if TYPE_CHECKING:
    from esper.config import Config
    from esper.data.tasks import TaskSpec
    from esper.training.envs.governor import Guard

#: Episode totals (``episode_finished``): float columns, then int columns.
EPISODE_FLOATS = ("reward_sum", "rollback_penalty")
EPISODE_INTS = ("seeds_germinated", "seeds_fossilized", "seeds_pruned", "rollbacks")
#: Which lifecycle record counts into which episode total.
COUNTED: dict[type, str] = {
    SeedGerminated: "seeds_germinated",
    SeedFossilized: "seeds_fossilized",
    SeedPruned: "seeds_pruned",
}
_force_setattr = msgspec.structs.force_setattr
_ENV_OF = operator.attrgetter("env")


class EnvTable:
    """Every env of a round: ``n`` rows, ``n_slots`` seed slots each."""

    def __init__(self, n: int, n_slots: int, *, signals: Signals, guard: Guard) -> None:
        self.n = n
        self.slots = SlotTable(n, n_slots)
        self.signals = signals
        self.guard = guard
        # The last two validations (accuracy in percent).
        self.val_acc = np.full(n, math.nan)
        self.val_loss = np.full(n, math.nan)
        self.prev_val_acc = np.full(n, math.nan)
        self.prev_val_loss = np.full(n, math.nan)
        # The last action and whether it took effect (observed by the policy).
        self.last_op = np.zeros(n, dtype=np.int64)
        self.last_success = np.ones(n, dtype=bool)
        self.seed_counter = np.zeros(n, dtype=np.int64)
        # Parameter counts that never change within a round (set by the env factory):
        # each host's, and per slot the host parameters its seed is compared with.
        self.host_params = np.zeros(n, dtype=np.int64)
        self.ref_params = np.zeros((n, n_slots), dtype=np.int64)
        # Whether each env's gates are strict (its model's setting, set with it): ADVANCE
        # runs the gates of every advancing env at once.
        self.strict_gates = np.zeros(n, dtype=bool)
        # The reward's memory of the previous step (shaping telescopes across steps).
        self.memory_set = np.zeros(n, dtype=bool)
        self.memory_alphas = np.zeros((n, n_slots))
        self.memory_potential = np.zeros(n)
        self.memory_seed_params = np.zeros(n, dtype=np.int64)
        #: Where the round is: its index and the step being played, what a lifecycle
        #: record is placed at when it is reported (:meth:`reporter`).
        self.round = -1
        self.step = -1
        #: Lifecycle records as reported, placed, in the order they happened.
        self.records: list[LifecycleEvent] = []
        #: Each row's global env index (what its records are placed at; set by the env
        #: factory with the env).
        self.env_index = np.zeros(n, dtype=np.int64)
        #: Rows whose seeds changed since their optimizers were last brought in line,
        #: and since a batched pass last adopted their seeds into its store.
        self.changed: set[int] = set()
        self.unadopted: set[int] = set()
        #: Per (env, slot): the seed there has an optimizer (it steps in a train pass).
        self.seed_sgd = np.zeros((n, n_slots), dtype=bool)
        #: The batched passes' stores for this round (``host_batching.round_stores``):
        #: (how many envs they cover, the stores or None for a per-env round).
        self.stores: tuple[int, Any] | None = None
        # Episode totals.
        self.episode: dict[str, np.ndarray] = {
            **{k: np.zeros(n) for k in EPISODE_FLOATS},
            **{k: np.zeros(n, dtype=np.int64) for k in EPISODE_INTS},
        }

    @classmethod
    def for_round(cls, cfg: Config, spec: TaskSpec, n_slots: int) -> EnvTable:
        """A fresh table for ``cfg``'s envs (signals and governor as configured)."""
        from esper.training.envs.governor import Guard

        n = cfg.run.n_envs
        signals = Signals(
            n,
            plateau_gain_pp=cfg.policy.plateau_gain_pp,
            stabilise_gain_pp=cfg.policy.stabilise_gain_pp,
            stabilise_epochs=cfg.policy.stabilise_epochs,
        )
        guard = Guard(n, cfg.governor, random_guess_loss=spec.random_guess_loss)
        return cls(n, n_slots, signals=signals, guard=guard)

    def reporter(self, row: int) -> Callable[[LifecycleEvent], None]:
        """Where env ``row``'s model reports its lifecycle records: into :attr:`records`
        (in the order they happen), placed where they happened (the round, the env's
        global index :attr:`env_index`, the step: a record is a fresh payload made for
        this alone, so it is placed, not copied) and counted into its episode totals. A
        counted record (a seed grown, fossilized or pruned) marks the env as changed in
        structure: its seed optimizers are brought in line and a batched pass adopts its
        seeds. Gate checks and other stage moves change no module, so they mark nothing."""
        env = int(self.env_index[row])

        def report(record: LifecycleEvent) -> None:
            _force_setattr(record, "round", self.round)
            _force_setattr(record, "env", env)
            _force_setattr(record, "step", self.step)
            self.records.append(record)
            name = COUNTED.get(type(record))
            if name is not None:
                self.episode[name][row] += 1
                self.changed.add(row)
                self.unadopted.add(row)

        return report

    def merge(self, start: int, records: Sequence[LifecycleEvent], rows: np.ndarray) -> None:
        """Place records made by table operations over many envs (record k: env row
        ``rows[k]``) and merge them, in env order, with those reported since ``start``
        (each env's own order kept). They are stage moves and gate checks: they change
        no module, so none is counted (a counted record goes through :meth:`reporter`).
        Each field is set over the batch in C (:func:`set_fields`): no Python per record."""
        counted = COUNTED.keys() & set(map(type, records))
        if counted:
            names = sorted(t.__name__ for t in counted)
            raise ValueError(f"counted records must be reported one by one: {names}")
        envs = self.env_index[rows].tolist()
        place = (("round", repeat(self.round)), ("env", envs), ("step", repeat(self.step)))
        set_fields(records, place)
        self.records[start:] = sorted([*self.records[start:], *records], key=_ENV_OF)

    def drain(self) -> list[LifecycleEvent]:
        """The records reported since the last drain."""
        records, self.records = self.records, []
        return records


class EpisodeStats:
    """One env's episode totals (a view of its row of :attr:`EnvTable.episode`)."""

    def __init__(self, table: EnvTable, row: int) -> None:
        self._episode = table.episode
        self._row = row

    def __getattr__(self, name: str) -> Any:
        column = self.__dict__["_episode"].get(name)
        if column is None:
            raise AttributeError(name)
        value = column[self.__dict__["_row"]]
        return float(value) if name in EPISODE_FLOATS else int(value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        self._episode[name][self._row] = value
