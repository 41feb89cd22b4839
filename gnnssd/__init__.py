"""gnnssd: out-of-core GNN training with node features streamed from an SSD."""
import os

# DGL picks its tensor backend from this variable at import; gnnssd is PyTorch-only.
os.environ.setdefault("DGLBACKEND", "pytorch")

__version__ = "0.1.0"
