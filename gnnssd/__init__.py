"""gnnssd: out-of-core GNN training with node features streamed from an SSD."""
import os

# DGL picks its tensor backend from this variable at import; gnnssd is PyTorch-only.
os.environ.setdefault("DGLBACKEND", "pytorch")

__version__ = "0.1.0"


def compile(layer):  # noqa: A001 - the public name the design gives the compiler
    """Compile a DGL-style message-passing layer (see gnnssd.compiler.compile)."""
    from .compiler import compile as compile_layer

    return compile_layer(layer)


def __getattr__(name: str):
    """`gnnssd.EdgeLoader`, imported on first use (it pulls in DGL and torch)."""
    if name == "EdgeLoader":
        from .edge_loader import EdgeLoader

        return EdgeLoader
    raise AttributeError(f"module 'gnnssd' has no attribute {name!r}")
