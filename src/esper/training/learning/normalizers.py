"""Running statistics that keep PPO's inputs and targets on a stable scale.

All statistics live on the policy device and are updated with batched tensor maths
(no host sync), so a normaliser can sit in the rollout loop. State dicts hold plain
tensors only, so checkpoints load with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from esper.core.constants import OBS_CLIP

#: Added to variances before the square root so a constant stream never divides by 0.
DEFAULT_EPSILON = 1e-8
#: Reward normaliser clip (in units of the running std), as in the spec.
REWARD_CLIP = 10.0

_STAT_DTYPE = torch.float64  # statistics accumulate in float64: counts reach millions

#: Multi-rank runs: (count, mean, var) of a local batch -> those of all ranks' batches.
MomentMerge = Callable[[int, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]
#: Multi-rank runs: (count, mean) of a local batch -> those of all ranks' batches.
MeanMerge = Callable[[int, Tensor], tuple[Tensor, Tensor]]


class RunningMeanStd:
    """Mean and variance of a stream of vectors, merged batch by batch (Chan et al.).

    ``update`` is a no-op while frozen: the trainer freezes the observation normaliser
    during a rollout so every transition of a round is normalised identically, and
    updates it once per round.
    """

    def __init__(
        self,
        shape: int | Sequence[int],
        *,
        clip: float = OBS_CLIP,
        epsilon: float = DEFAULT_EPSILON,
        device: str | torch.device = "cpu",
    ) -> None:
        self.shape: tuple[int, ...] = (shape,) if isinstance(shape, int) else tuple(shape)
        self.clip = float(clip)
        self.epsilon = float(epsilon)
        self.device = torch.device(device)
        self.mean = torch.zeros(self.shape, dtype=_STAT_DTYPE, device=self.device)
        self.var = torch.ones(self.shape, dtype=_STAT_DTYPE, device=self.device)
        self.count = torch.zeros((), dtype=_STAT_DTYPE, device=self.device)
        self.frozen = False
        #: Set by a multi-rank run (esper.training.loop.distributed) so every rank merges
        #: the same global batch statistics; None: this process's batch only.
        self.merge: MomentMerge | None = None

    def freeze(self) -> None:
        self.frozen = True

    def unfreeze(self) -> None:
        self.frozen = False

    def _flatten(self, x: Tensor) -> Tensor:
        n_feat = len(self.shape)
        if tuple(x.shape[x.dim() - n_feat :]) != self.shape:
            raise ValueError(f"expected trailing shape {self.shape}, got {tuple(x.shape)}")
        return x.detach().to(device=self.device, dtype=_STAT_DTYPE).reshape(-1, *self.shape)

    def update(self, x: Tensor) -> None:
        """Merge a batch ``[..., *shape]`` into the running statistics (on device)."""
        if self.frozen:
            return
        batch = self._flatten(x)
        b_count = batch.shape[0]
        if b_count == 0:
            return
        b_mean = batch.mean(dim=0)
        b_var = batch.var(dim=0, unbiased=False)
        if self.merge is not None:
            b_count, b_mean, b_var = self.merge(b_count, b_mean, b_var)  # type: ignore[assignment]
        total = self.count + b_count
        delta = b_mean - self.mean
        new_mean = self.mean + delta * (b_count / total)
        m2 = (
            self.var * self.count
            + b_var * b_count
            + delta.square() * (self.count * b_count / total)
        )
        # First batch: the prior var (1.0) has weight count=0 and drops out exactly.
        self.mean = new_mean
        self.var = m2 / total
        self.count = total

    @property
    def std(self) -> Tensor:
        return torch.sqrt(self.var + self.epsilon)

    def normalize(self, x: Tensor) -> Tensor:
        """``(x - mean) / std`` clipped to ``+-clip``, in ``x``'s dtype and device."""
        mean = self.mean.to(device=x.device, dtype=x.dtype)
        std = self.std.to(device=x.device, dtype=x.dtype)
        return ((x - mean) / std).clamp(-self.clip, self.clip)

    def state_dict(self) -> dict[str, Tensor]:
        return {
            "mean": self.mean.clone(),
            "var": self.var.clone(),
            "count": self.count.clone(),
            "frozen": torch.tensor(self.frozen),
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        mean = state["mean"].to(device=self.device, dtype=_STAT_DTYPE)
        if tuple(mean.shape) != self.shape:
            raise ValueError(f"state shape {tuple(mean.shape)} != normaliser shape {self.shape}")
        self.mean = mean.clone()
        self.var = state["var"].to(device=self.device, dtype=_STAT_DTYPE).clone()
        self.count = state["count"].to(device=self.device, dtype=_STAT_DTYPE).clone()
        self.frozen = bool(state["frozen"]) if "frozen" in state else False


class RewardNormalizer:
    """Divides rewards by a running std (no mean shift, so the sign of a reward survives).

    With ``gamma`` the std is that of each env's discounted running return (the usual
    PPO recipe: it makes the *return* scale ~1); without it, the std of raw rewards.
    """

    def __init__(
        self,
        clip: float = REWARD_CLIP,
        *,
        gamma: float | None = None,
        epsilon: float = DEFAULT_EPSILON,
        device: str | torch.device = "cpu",
    ) -> None:
        self.clip = float(clip)
        self.gamma = gamma
        self.device = torch.device(device)
        self.rms = RunningMeanStd((), clip=float("inf"), epsilon=epsilon, device=self.device)
        self._returns: Tensor | None = None

    @property
    def frozen(self) -> bool:
        return self.rms.frozen

    def freeze(self) -> None:
        self.rms.freeze()

    def unfreeze(self) -> None:
        self.rms.unfreeze()

    def update(self, rewards: Tensor, dones: Tensor | None = None) -> None:
        """Fold one step of per-env rewards ``[N]`` in; ``dones`` resets those returns."""
        rewards = rewards.detach().to(device=self.device, dtype=_STAT_DTYPE)
        if self.gamma is None:
            self.rms.update(rewards)
            return
        if self._returns is None or self._returns.shape != rewards.shape:
            self._returns = torch.zeros_like(rewards)
        self._returns = self._returns * self.gamma + rewards
        self.rms.update(self._returns)
        if dones is not None:
            self._returns = torch.where(
                dones.to(self.device, torch.bool),
                torch.zeros_like(self._returns),
                self._returns,
            )

    def reset_returns(self) -> None:
        """Forget the running returns (every round starts fresh episodes)."""
        self._returns = None

    def normalize(self, rewards: Tensor) -> Tensor:
        std = self.rms.std.to(device=rewards.device, dtype=rewards.dtype)
        return (rewards / std).clamp(-self.clip, self.clip)

    def normalize_scalar(self, value: float) -> float:
        """One reward on the learning scale (syncs the device: for rare events, rollbacks)."""
        x = torch.tensor([value], dtype=torch.float32, device=self.device)
        return float(self.normalize(x)[0])

    def state_dict(self) -> dict[str, Tensor]:
        return {f"rms.{k}": v for k, v in self.rms.state_dict().items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.rms.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("rms.")})


class ValueNormalizer:
    """Std-only scale for value targets: the critic learns ``V / scale``.

    The scale is the running root-mean-square of the returns. It equals the std when
    returns are centred, never collapses when all returns are alike, and leaves 0
    meaning 0, so denormalising a prediction never needs a mean.
    """

    def __init__(
        self,
        *,
        epsilon: float = DEFAULT_EPSILON,
        device: str | torch.device = "cpu",
    ) -> None:
        self.epsilon = float(epsilon)
        self.device = torch.device(device)
        self.second_moment = torch.ones((), dtype=_STAT_DTYPE, device=self.device)
        self.count = torch.zeros((), dtype=_STAT_DTYPE, device=self.device)
        #: Multi-rank runs: merges the batch's (count, mean square) over the ranks.
        self.merge: MeanMerge | None = None

    def update(self, returns: Tensor) -> None:
        x = returns.detach().to(device=self.device, dtype=_STAT_DTYPE).reshape(-1)
        if x.numel() == 0:
            return
        n: int | Tensor = x.numel()
        mean_sq = x.square().mean()
        if self.merge is not None:
            n, mean_sq = self.merge(x.numel(), mean_sq)
        total = self.count + n
        self.second_moment = self.second_moment + (mean_sq - self.second_moment) * (n / total)
        self.count = total

    @property
    def scale(self) -> Tensor:
        return torch.sqrt(self.second_moment + self.epsilon)

    def normalize(self, values: Tensor) -> Tensor:
        return values / self.scale.to(device=values.device, dtype=values.dtype)

    def denormalize(self, values: Tensor) -> Tensor:
        return values * self.scale.to(device=values.device, dtype=values.dtype)

    def state_dict(self) -> dict[str, Tensor]:
        return {"second_moment": self.second_moment.clone(), "count": self.count.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.second_moment = state["second_moment"].to(self.device, _STAT_DTYPE).clone()
        self.count = state["count"].to(self.device, _STAT_DTYPE).clone()
