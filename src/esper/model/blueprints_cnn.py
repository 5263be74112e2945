"""Seed blueprints for convolutional hosts: shape-preserving residual modules on [B, C, H, W].

Every seed computes ``x + f(x)`` with the last layer of ``f`` zero-initialised, so a
fresh seed is an exact identity on the host activation and germination never changes
the model's output. Seeds use GroupNorm, not BatchNorm, so their output does not depend
on batch composition (the fused counterfactual forward mixes configurations in a batch).
"""

from __future__ import annotations

from torch import Tensor, nn

from esper.model.initialization import zero_init

#: Channel reduction inside squeeze-excitation and bottleneck seeds.
SE_REDUCTION = 4
BOTTLENECK_REDUCTION = 4
LIGHT_REDUCTION = 4
MIN_HIDDEN_CHANNELS = 4
#: Largest GroupNorm group count used by seeds (the largest divisor of C up to this).
MAX_NORM_GROUPS = 8
KERNEL = 3
PADDING = 1


class SeedGroupNorm(nn.GroupNorm):
    """GroupNorm that hands the CPU kernel a contiguous (NCHW) tensor.

    Works around a torch CPU bug (seen in 2.13): GroupNorm's backward segfaults on a
    channels_last input that does not require grad, which is exactly a TRAINING seed
    reading the detached host activation. The copy is skipped when not needed.
    """

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type == "cpu" and not x.is_contiguous():
            x = x.contiguous()
        return super().forward(x)


def group_norm(channels: int) -> SeedGroupNorm:
    return SeedGroupNorm(norm_groups(channels), channels)


def norm_groups(channels: int) -> int:
    """Largest divisor of ``channels`` not above MAX_NORM_GROUPS."""
    return max([g for g in range(1, MAX_NORM_GROUPS + 1) if channels % g == 0])


def _hidden(channels: int, reduction: int) -> int:
    return max(MIN_HIDDEN_CHANNELS, channels // reduction)


def _conv3(c_in: int, c_out: int, *, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, KERNEL, padding=PADDING, groups=groups, bias=False)


class ResidualSeed(nn.Module):
    """x + body(x); subclasses build ``body`` with a zero-initialised last layer."""

    body: nn.Module

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.body(x)
        return out


class NormSeed(ResidualSeed):
    """A learned re-normalisation: x + GroupNorm(x) with zero affine (starts at 0)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = zero_init(group_norm(channels))


class SqueezeExciteSeed(nn.Module):
    """Channel attention: x * (1 + tanh(se(x))) with the last projection zero-initialised."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        hidden = _hidden(channels, SE_REDUCTION)
        self.fc1 = nn.Linear(channels, hidden)
        self.fc2 = zero_init(nn.Linear(hidden, channels))

    def forward(self, x: Tensor) -> Tensor:
        squeezed = x.mean(dim=(2, 3))
        scale = self.fc2(self.fc1(squeezed).relu()).tanh()
        out: Tensor = x + x * scale[:, :, None, None]
        return out


class ConvSmallSeed(ResidualSeed):
    """One 3x3 convolution, then a 1x1 projection back (zero-init)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            _conv3(channels, channels),
            nn.ReLU(),
            zero_init(nn.Conv2d(channels, channels, 1)),
        )


class DepthwiseSeed(ResidualSeed):
    """Depthwise 3x3, GroupNorm, ReLU, pointwise 1x1 (zero-init): cheap spatial mixing."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            _conv3(channels, channels, groups=channels),
            group_norm(channels),
            nn.ReLU(),
            zero_init(nn.Conv2d(channels, channels, 1)),
        )


class BottleneckSeed(ResidualSeed):
    """1x1 reduce, 3x3, 1x1 expand (zero-init), as in ResNet bottlenecks."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        hidden = _hidden(channels, BOTTLENECK_REDUCTION)
        self.body = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False),
            group_norm(hidden),
            nn.ReLU(),
            _conv3(hidden, hidden),
            group_norm(hidden),
            nn.ReLU(),
            zero_init(nn.Conv2d(hidden, channels, 1)),
        )


class ConvLightSeed(ResidualSeed):
    """A narrow 3x3 convolution into a few channels and a 1x1 back (zero-init)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        hidden = _hidden(channels, LIGHT_REDUCTION)
        self.body = nn.Sequential(
            _conv3(channels, hidden),
            nn.ReLU(),
            zero_init(nn.Conv2d(hidden, channels, 1)),
        )


class ConvHeavySeed(ResidualSeed):
    """A full residual block: two 3x3 convolutions, the second zero-initialised."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            _conv3(channels, channels),
            group_norm(channels),
            nn.ReLU(),
            zero_init(_conv3(channels, channels)),
        )


CNN_BLUEPRINT_CLASSES: dict[str, type[nn.Module]] = {
    "norm": NormSeed,
    "attention": SqueezeExciteSeed,
    "conv_small": ConvSmallSeed,
    "depthwise": DepthwiseSeed,
    "bottleneck": BottleneckSeed,
    "conv_light": ConvLightSeed,
    "conv_heavy": ConvHeavySeed,
}
