"""Layer-wise inference: every node's embedding or prediction computed one layer at a
time over all nodes, its rows read from memory or the SSD."""
from .layerwise import embed, predict_layerwise

__all__ = ["embed", "predict_layerwise"]
