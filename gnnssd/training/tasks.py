"""The task registry: `task:` in the config -> its trainer class, which knows the rest
(output width `output_dim`, the validation score `SELECTION` and its printed name
`SELECTION_NAME`, the checkpoint prefix of its node encoder `ENCODER_PREFIX`, whether it
labels nodes `CLASSIFIES`). The CLI, layer-wise inference and `Trainer(config)` ask here
instead of testing the task's name.

It sits above the trainers it names (gnnssd.training.node_task, gnnssd.training.link, both built on
gnnssd.training.trainer.TaskTrainer), so choosing a trainer imports nothing back."""
from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

from torch import nn

from gnnssd.core import Config, ConfigError, as_config

from .link import LinkTrainer
from .node_task import NodeTrainer
from .trainer import TaskTrainer

TASKS: dict[str, type[TaskTrainer]] = {"node": NodeTrainer, "link": LinkTrainer}


def trainer_class(task: str) -> type[TaskTrainer]:
    """The trainer of `task`."""
    if task not in TASKS:
        raise ConfigError(f"task: {task!r}; expected one of {tuple(TASKS)}")
    return TASKS[task]


class Trainer(abc.ABC):
    """`Trainer(config, overrides=None, model=None)`: the trainer of the config's `task`,
    a NodeTrainer or a LinkTrainer (every TaskTrainer is a Trainer to isinstance). To change
    what a task's trainer does, subclass that trainer (or TaskTrainer for a new task)."""

    def __new__(cls, config: Config | str | Path, overrides: dict[str, Any] | None = None,
                model: nn.Module | None = None) -> TaskTrainer:  # type: ignore[misc]
        config = as_config(config, overrides)
        return trainer_class(config.task)(config, model=model)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError(f"class {cls.__name__}: Trainer only picks the config's task's trainer; "
                        f"subclass one of {[t.__name__ for t in TASKS.values()]} or TaskTrainer")


Trainer.register(TaskTrainer)


def check_classifies(config: Config) -> None:
    """Refuse predicting classes for a task that has none."""
    if not trainer_class(config.task).CLASSIFIES:
        raise ConfigError(f"predict is for a node classification task, not task: {config.task}; "
                          "use `gnnssd embed`")
