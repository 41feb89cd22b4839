"""The task registry: `task:` in the config -> its trainer class, which knows the rest
(output width `output_dim`, the validation score `SELECTION` and its printed name
`SELECTION_NAME`, the checkpoint prefix of its node encoder `ENCODER_PREFIX`). The CLI,
layer-wise inference and `Trainer(config)` ask here instead of testing the task's name."""
from __future__ import annotations

from .config import ConfigError
from .link import LinkTrainer
from .trainer import Trainer

TASKS: dict[str, type[Trainer]] = {"node": Trainer, "link": LinkTrainer}


def trainer_class(task: str) -> type[Trainer]:
    """The trainer of `task`."""
    if task not in TASKS:
        raise ConfigError(f"task: {task!r}; expected one of {tuple(TASKS)}")
    return TASKS[task]
