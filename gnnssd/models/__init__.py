"""The built-in models (GraphSAGE, GCN, GAT, GIN; R-GCN and R-GAT for typed stores), built
from a config, their layers compiled by gnnssd.compiler."""
from .builtin import BlockGNN, is_mean_aggregation, store_model
from .device import device_for

__all__ = ["BlockGNN", "device_for", "is_mean_aggregation", "store_model"]
