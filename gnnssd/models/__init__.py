"""The built-in models (GraphSAGE, GCN, GAT, GIN; R-GCN and R-GAT for typed stores), built
from a config, their layers compiled by gnnssd.compiler."""
from .builtin import BlockGNN, store_model

__all__ = ["BlockGNN", "store_model"]
