"""gnnssd: out-of-core GNN training with node features streamed from an SSD."""
import os

# DGL picks its tensor backend from this variable at import; gnnssd is PyTorch-only.
os.environ.setdefault("DGLBACKEND", "pytorch")

from gnnssd.storage_format import exported_names, lazy_exports  # noqa: E402 - after DGLBACKEND

__version__ = "0.1.0"


def compile(layer):  # noqa: A001 - the public name the design gives the compiler
    """Compile a DGL-style message-passing layer (see gnnssd.compiler.compile)."""
    from .compiler import compile as compile_layer

    return compile_layer(layer)


#: What users build, receive and catch, by the module that defines it (imported on first use:
#: the CLI starts without torch and DGL). A new public name goes into its module's tuple.
_PUBLIC = {".loading": ("NodeLoader", "EdgeLoader", "FeatureSource", "MiniBatch", "EdgeBatch"),
           ".storage_format": ("Store", "StoreError", "DatasetError", "PageChecksumError"),
           ".training": ("Trainer", "TASKS", "TaskTrainer", "NodeTrainer", "LinkTrainer", "CheckpointError",
                         "TrainingError"),
           ".core": ("ConfigError",),
           ".io_engine": ("ChecksumError",)}
__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC)

__all__ = [*exported_names(_PUBLIC), "compile"]
