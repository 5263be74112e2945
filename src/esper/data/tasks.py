"""Task descriptions and the loader that dispatches on the task name.

:class:`TaskSpec` is torch-free (policies, configs and analysis can use it);
:class:`TaskData` carries the CPU tensors: float32 images already normalised, long
targets (for text, long byte ids for inputs too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from esper.config import TaskConfig
from esper.core.enums import TaskName, Topology

if TYPE_CHECKING:
    from torch import Tensor

IMAGE_CLASSES = 10
TEXT_VOCAB = 256
DIGITS_SHAPE = (1, 8, 8)
IMAGE_32_SHAPE = (3, 32, 32)


class TaskSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a model needs to know about a task's inputs and outputs."""

    name: TaskName
    topology: Topology
    #: (C, H, W) for images; (seq_len,) for text.
    input_shape: tuple[int, ...]
    #: Classes, or the vocabulary size for language modelling.
    num_classes: int
    #: Cross-entropy of a uniform guess, ln(num_classes): the governor's "lobotomy" level.
    random_guess_loss: float
    #: Language modelling: logits are [B, T, vocab] and accuracy is per token.
    is_lm: bool = False


@dataclass(frozen=True)
class TaskData:
    spec: TaskSpec
    train_x: Tensor
    train_y: Tensor
    val_x: Tensor
    val_y: Tensor


def task_spec(cfg: TaskConfig) -> TaskSpec:
    """The spec of ``cfg``'s task without loading any data."""
    if cfg.name == TaskName.TEXT:
        return TaskSpec(
            name=cfg.name,
            topology=Topology.TRANSFORMER,
            input_shape=(cfg.seq_len,),
            num_classes=TEXT_VOCAB,
            random_guess_loss=math.log(TEXT_VOCAB),
            is_lm=True,
        )
    shape = DIGITS_SHAPE if cfg.name == TaskName.DIGITS else IMAGE_32_SHAPE
    return TaskSpec(
        name=cfg.name,
        topology=Topology.CNN,
        input_shape=shape,
        num_classes=IMAGE_CLASSES,
        random_guess_loss=math.log(IMAGE_CLASSES),
    )


def load_task(cfg: TaskConfig, *, seed: int) -> TaskData:
    """Load (or generate) the task's train/validation tensors on the CPU."""
    spec = task_spec(cfg)
    if cfg.name == TaskName.DIGITS:
        from esper.data.digits import load_digits_split

        return TaskData(spec, *load_digits_split(seed=seed))
    if cfg.name == TaskName.CIFAR10:
        from esper.data.cifar10 import load_cifar10

        return TaskData(spec, *load_cifar10(cfg.data_path))
    if cfg.name == TaskName.SYNTHETIC:
        from esper.data.synthetic import synthetic_split

        return TaskData(
            spec,
            *synthetic_split(cfg.synthetic_train_size, cfg.synthetic_val_size, seed=seed),
        )
    from esper.data.text import load_text

    return TaskData(spec, *load_text(cfg.data_path, seq_len=cfg.seq_len))
