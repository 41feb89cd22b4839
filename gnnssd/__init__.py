"""gnnssd: out-of-core GNN training with node features streamed from an SSD."""
import os

# DGL picks its tensor backend from this variable at import; gnnssd is PyTorch-only.
os.environ.setdefault("DGLBACKEND", "pytorch")

__version__ = "0.1.0"


def compile(layer):  # noqa: A001 - the public name the design gives the compiler
    """Compile a DGL-style message-passing layer (see gnnssd.compiler.compile)."""
    from .compiler import compile as compile_layer

    return compile_layer(layer)


_PUBLIC = {"NodeLoader": ".node_loader", "Store": ".storage_format", "Trainer": ".trainer"}


def __getattr__(name: str):
    """`gnnssd.NodeLoader`, `gnnssd.Store`, `gnnssd.Trainer`, imported on first use (the CLI
    starts without torch and DGL)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'gnnssd' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_PUBLIC[name], __name__), name)


__all__ = ["NodeLoader", "Store", "Trainer", "compile"]
