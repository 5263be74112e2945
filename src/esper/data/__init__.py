"""Tasks and data: digits (default), CIFAR-10 binary, synthetic images, byte-level text.

Datasets are never downloaded; a missing one is a :class:`esper.errors.DatasetError`
that says what to put where. One shared, seeded batch iterator feeds all envs.
"""

from esper.data.tasks import TaskData, TaskSpec, load_task, task_spec

__all__ = ["TaskData", "TaskSpec", "load_task", "task_spec"]
