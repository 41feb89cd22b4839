"""gnnssd: out-of-core GNN training with node features streamed from an SSD."""
import os

# DGL picks its tensor backend from this variable at import; gnnssd is PyTorch-only.
os.environ.setdefault("DGLBACKEND", "pytorch")
# numba's parallel kernels run on OpenMP, whose idle workers spin by default: beside the
# loader's other threads and its packer processes (which inherit this) on shared cores, the
# spinning took about half of the ssd loader's CPU (docs/BENCHMARKS.md, issue 46). Read when
# numba first loads its OpenMP pool (its first parallel kernel); a user's own setting is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from gnnssd.storage_format import lazy_exports  # noqa: E402 - after DGLBACKEND

__version__ = "0.1.0"


def compile(layer):  # noqa: A001 - the public name the design gives the compiler
    """Compile a DGL-style message-passing layer (see gnnssd.compiler.compile)."""
    from .compiler import compile as compile_layer

    return compile_layer(layer)


#: What users build, receive and catch: name -> the module that defines it, imported on first
#: use (storage_format.lazy: the CLI starts without torch and DGL). A new public name is one
#: more entry here.
_PUBLIC = {"NodeLoader": ".loading", "EdgeLoader": ".loading", "FeatureSource": ".loading",
           "MiniBatch": ".loading", "EdgeBatch": ".loading", "Store": ".storage_format",
           "Trainer": ".training", "TASKS": ".training", "TaskTrainer": ".training", "NodeTrainer": ".training",
           "LinkTrainer": ".training", "ConfigError": ".core", "StoreError": ".storage_format",
           "DatasetError": ".storage_format", "PageChecksumError": ".storage_format", "ChecksumError": ".io_engine",
           "CheckpointError": ".training", "TrainingError": ".training",
           "layerwise": ".inference.layerwise"}
__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC)

__all__ = [*_PUBLIC, "compile"]
