"""Preallocated [n_envs, T] rollout storage for the recurrent PPO update.

One row per env is one episode. Everything lives on the policy device and is written
one whole-env step at a time, so the rollout loop never allocates or synchronises.

Rollbacks are per env: :meth:`RolloutBuffer.apply_rollback` touches only that env's
row. The rollback penalty and the segment end live in their own tensors that
:meth:`add` never overwrites, so the penalty lands on the panic step whether the
rollback is recorded before or after that step's transition is written.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from esper.core.constants import HEAD_NAMES
from esper.policy.masks import ActionMasks
from esper.policy.protocol import Hidden
from esper.training.envs.governor import penalized_step


class RolloutBuffer:
    """Transitions of one round. Values are raw-scale (denormalised) V(s) estimates.

    ``values`` (and the ``last_values`` given to GAE) must be raw-scale: denormalise the
    policy's value output with the :class:`ValueNormalizer` before writing it. The
    learning reward of a step is ``rewards_normalized`` plus any rollback penalty;
    ``rewards_raw`` keeps the unnormalised rewards for reporting.
    """

    def __init__(
        self,
        n_envs: int,
        horizon: int,
        obs_dim: int,
        n_slots: int,
        head_sizes: Mapping[str, int],
        lstm_hidden: int,
        device: torch.device | str,
    ) -> None:
        if tuple(head_sizes) != HEAD_NAMES:
            raise ValueError(f"head_sizes must list the heads in order {HEAD_NAMES}")
        self.n_envs, self.horizon, self.n_slots = n_envs, horizon, n_slots
        self.head_sizes = dict(head_sizes)
        self.lstm_hidden = lstm_hidden
        self.device = torch.device(device)
        n, t, dev = n_envs, horizon, self.device
        self.obs = torch.zeros(n, t, obs_dim, device=dev)
        self.blueprint_ids = torch.zeros(n, t, n_slots, dtype=torch.long, device=dev)
        self.actions = torch.zeros(n, t, len(HEAD_NAMES), dtype=torch.long, device=dev)
        self.log_probs = torch.zeros(n, t, len(HEAD_NAMES), device=dev)
        n_ops = head_sizes["op"]
        self.masks: dict[str, Tensor] = {
            name: torch.zeros(
                (n, t, n_ops, size) if name == "slot" else (n, t, size),
                dtype=torch.bool,
                device=dev,
            )
            for name, size in head_sizes.items()
        }
        self.values = torch.zeros(n, t, device=dev)
        self.rewards_normalized = torch.zeros(n, t, device=dev)
        self.rewards_raw = torch.zeros(n, t, device=dev)
        self.dones = torch.zeros(n, t, dtype=torch.bool, device=dev)
        # Rollback bookkeeping: kept apart from what ``add`` writes (order-independent).
        self.penalties = torch.zeros(n, t, device=dev)
        self.penalties_raw = torch.zeros(n, t, device=dev)
        self.segment_end = torch.zeros(n, t, dtype=torch.bool, device=dev)
        self.rolled_back = torch.zeros(n, t, dtype=torch.bool, device=dev)
        self.advantages = torch.zeros(n, t, device=dev)
        self.returns = torch.zeros(n, t, device=dev)
        self.hidden0: Hidden = (
            torch.zeros(1, n, lstm_hidden, device=dev),
            torch.zeros(1, n, lstm_hidden, device=dev),
        )
        # Recurrent state *after* each step's decision: a minibatch chunk starting at
        # step s > 0 resumes from hidden_after[:, s - 1] (stored-state recurrent PPO).
        self.hidden_after: Hidden = (
            torch.zeros(n, t, lstm_hidden, device=dev),
            torch.zeros(n, t, lstm_hidden, device=dev),
        )
        self._hidden_written = [False] * t
        #: Per step, the one done flag every env was written with (None: per env).
        self._host_done: list[bool | None] = [None] * t
        self.steps_written = 0
        self._written = [False] * t  # host-side: checking it never syncs the device
        self.advantages_ready = False

    # --- Writing ---------------------------------------------------------------------

    def start(self, hidden0: Hidden) -> None:
        """Begin a round: store each env's initial recurrent state, clear every flag."""
        h, c = hidden0
        if h.shape != self.hidden0[0].shape or c.shape != self.hidden0[1].shape:
            raise ValueError(f"hidden0 shapes {tuple(h.shape)} != {tuple(self.hidden0[0].shape)}")
        self.hidden0[0].copy_(h)
        self.hidden0[1].copy_(c)
        for flags in (self.dones, self.segment_end, self.rolled_back):
            flags.zero_()
        for values in (self.penalties, self.penalties_raw):
            values.zero_()
        self._written = [False] * self.horizon
        self._hidden_written = [False] * self.horizon
        self._host_done = [None] * self.horizon
        self.steps_written = 0
        self.advantages_ready = False

    def add(
        self,
        step: int,
        *,
        obs: Tensor,
        blueprint_ids: Tensor,
        masks: ActionMasks,
        actions: Tensor,
        log_probs: Tensor,
        values: Tensor,
        rewards_normalized: Tensor,
        rewards_raw: Tensor,
        dones: Tensor | bool,
        hidden: Hidden | None = None,
    ) -> None:
        """Write one step for all envs (tensors [N, ...]; ``values`` raw-scale).

        ``dones`` may be one flag for every env (the trainer's episode end): then the
        host knows it, and :meth:`compute_returns_and_advantages` needs no device read
        to check that every row ends done.

        ``hidden`` is the policy's recurrent state after this decision ([1, N, H] each);
        without it the update can only replay whole env rows from ``hidden0``.
        """
        self._check_step(step)
        if hidden is not None:
            self.hidden_after[0][:, step] = hidden[0][0]
            self.hidden_after[1][:, step] = hidden[1][0]
        self._hidden_written[step] = hidden is not None
        self.obs[:, step] = obs
        self.blueprint_ids[:, step] = blueprint_ids
        for name, store in self.masks.items():
            store[:, step] = getattr(masks, name)
        self.actions[:, step] = actions
        self.log_probs[:, step] = log_probs
        self.values[:, step] = values
        self.rewards_normalized[:, step] = rewards_normalized
        self.rewards_raw[:, step] = rewards_raw
        self.dones[:, step] = dones
        self._host_done[step] = dones if isinstance(dones, bool) else None
        if not self._written[step]:
            self._written[step] = True
            self.steps_written += 1
        self.advantages_ready = False

    def apply_rollback(
        self,
        env: int,
        from_step: int,
        to_step: int,
        penalty: float,
        *,
        penalty_normalized: float | None = None,
    ) -> int:
        """Env ``env``'s host was restored at panic step ``to_step`` to its ``from_step`` snapshot.

        Transition t is (observation after epoch t, action, reward), so a panic found
        after epoch ``to_step`` follows the decisions before it. Transitions
        ``from_step .. to_step - 1`` (whose effects the restore undid) are flagged
        ``rolled_back``. The panic step's transition, ``to_step - 1`` (the decision right
        before the failed epoch), ends its segment without bootstrapping (the next
        observation is the restored host, not its successor) and carries the penalty,
        which GAE credits back through the segment. A panic before any decision
        (``to_step == 0``) puts the penalty on transition 0. The penalty lives apart from
        what :meth:`add` writes, so it lands whether that transition is written before
        or after this call. ``penalty_normalized`` is the learning-scale penalty (the
        reward normaliser applied to ``penalty``; default ``penalty``). Other envs are
        untouched. Returns the number of transitions rolled back.
        """
        if not 0 <= env < self.n_envs:
            raise ValueError(f"env {env} out of range [0, {self.n_envs})")
        self._check_step(to_step)
        start = min(max(from_step, 0), to_step)
        blame = penalized_step(to_step)
        learn = penalty if penalty_normalized is None else penalty_normalized
        self.rolled_back[env, start:to_step] = True
        if to_step > 0:
            self.segment_end[env, blame] = True
        self.penalties[env, blame] += learn
        self.penalties_raw[env, blame] += penalty
        self.advantages_ready = False
        return to_step - start

    def _check_step(self, step: int) -> None:
        if not 0 <= step < self.horizon:
            raise ValueError(f"step {step} out of range [0, {self.horizon})")

    # --- Reading ---------------------------------------------------------------------

    @property
    def full(self) -> bool:
        return self.steps_written == self.horizon

    @property
    def hidden_stored(self) -> bool:
        """Every step's post-decision recurrent state was written (chunks can start anywhere)."""
        return all(self._hidden_written)

    def chunk_start_hidden(self, chunk_length: int) -> Hidden:
        """[1, N * K, H] states that start each chunk of ``chunk_length`` steps (env-major).

        Chunk k of env n starts at step k * L: ``hidden0`` for k == 0, else the stored
        state after step k * L - 1.
        """
        starts = list(range(0, self.horizon, chunk_length))
        parts = []
        for store, first in zip(self.hidden_after, self.hidden0, strict=True):
            rows = [first[0][:, None]] + [store[:, s - 1 : s] for s in starts[1:]]
            parts.append(torch.cat(rows, dim=1).reshape(1, -1, self.lstm_hidden))
        return parts[0], parts[1]

    def learning_rewards(self) -> Tensor:
        """What GAE discounts: normalised rewards plus rollback penalties."""
        return self.rewards_normalized + self.penalties

    def env_rewards(self, env: int) -> Tensor:
        """Env ``env``'s raw per-step rewards [T], rollback penalty included."""
        return self.rewards_raw[env] + self.penalties_raw[env]

    def stacked_masks(self) -> ActionMasks:
        """The stored masks as one [N, T, ...] :class:`ActionMasks`."""
        return ActionMasks(**self.masks)

    def compute_returns_and_advantages(
        self,
        last_values: Tensor | None = None,
        *,
        gamma: float,
        gae_lambda: float,
    ) -> None:
        """GAE(lambda) per env row, on raw-scale values.

        A done (the trainer marks every episode's last step done: the episode is a true
        terminal, see docs/training.md) or a rollback segment end bootstraps nothing. A row
        whose last step is *not* done was cut by a time limit and bootstraps from
        ``last_values`` = V(s_T) (required then).
        """
        if not self.full:
            raise RuntimeError(f"rollout incomplete: {self.steps_written}/{self.horizon} steps")
        if last_values is None:
            last_values = torch.zeros(self.n_envs, device=self.device)
            if self._host_done[-1] is not True:  # else known on the host: no device read
                open_end = ~(self.dones[:, -1] | self.segment_end[:, -1])
                if bool(open_end.any()):
                    raise ValueError("rows end without a done: pass last_values to bootstrap")
        rewards = self.learning_rewards()
        terminal = self.dones | self.segment_end
        next_value = last_values.to(self.device, self.values.dtype).reshape(self.n_envs)
        running = torch.zeros(self.n_envs, device=self.device)
        for t in reversed(range(self.horizon)):
            if t < self.horizon - 1:
                next_value = self.values[:, t + 1]
            boot = next_value.masked_fill(terminal[:, t], 0.0)
            delta = rewards[:, t] + gamma * boot - self.values[:, t]
            carry = (~terminal[:, t]).to(running.dtype)
            running = delta + gamma * gae_lambda * carry * running
            self.advantages[:, t] = running
        self.returns.copy_(self.advantages + self.values)
        self.advantages_ready = True
