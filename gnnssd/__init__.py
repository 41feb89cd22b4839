"""gnnssd: out-of-core GNN training with node features streamed from an SSD."""
import os

# DGL picks its tensor backend from this variable at import; gnnssd is PyTorch-only.
os.environ.setdefault("DGLBACKEND", "pytorch")

__version__ = "0.1.0"


def compile(layer):  # noqa: A001 - the public name the design gives the compiler
    """Compile a DGL-style message-passing layer (see gnnssd.compiler.compile)."""
    from .compiler import compile as compile_layer

    return compile_layer(layer)


#: What users build, receive and catch: name -> the module that defines it.
_PUBLIC = {"NodeLoader": ".loading", "EdgeLoader": ".loading", "FeatureSource": ".loading",
           "MiniBatch": ".loading", "EdgeBatch": ".loading", "Store": ".storage_format",
           "Trainer": ".training", "TASKS": ".training", "TaskTrainer": ".training", "NodeTrainer": ".training",
           "LinkTrainer": ".training", "ConfigError": ".core", "StoreError": ".storage_format",
           "DatasetError": ".storage_format", "PageChecksumError": ".storage_format", "ChecksumError": ".io_engine",
           "CheckpointError": ".training", "TrainingError": ".training", "layerwise": ".inference.layerwise"}


def __getattr__(name: str):
    """The public names, imported on first use (the CLI starts without torch and DGL)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'gnnssd' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_PUBLIC[name], __name__), name)


def __dir__() -> list[str]:
    """The module's own names and the public ones imported on first use."""
    return sorted({*globals(), *_PUBLIC})


__all__ = [*_PUBLIC, "compile"]
