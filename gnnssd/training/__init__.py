"""Training a task: the task trainer and its node and link tasks, their registry,
checkpoints and metrics, the run directory, data-parallel ranks."""
from . import distributed
from .checkpoint import METRICS, CheckpointError, load_checkpoint
from .link import LinkTrainer
from .node_task import NodeTrainer
from .rundir import check_output, reading
from .tasks import TASKS, Trainer, check_classifies, trainer_class
from .trainer import RUN_CONFIG, TaskTrainer, TrainingError

__all__ = ["CheckpointError", "LinkTrainer", "METRICS", "NodeTrainer", "RUN_CONFIG", "TASKS",
           "TaskTrainer", "Trainer", "TrainingError", "check_classifies", "check_output",
           "distributed", "load_checkpoint", "reading", "trainer_class"]
