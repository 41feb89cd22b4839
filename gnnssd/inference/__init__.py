"""Layer-wise inference: every node's embedding or prediction computed one layer at a
time over all nodes, its rows read from memory or the SSD. The commands that run it on a
trained run (`embed`, `predict --layerwise`) are gnnssd.cli's."""
from .layerwise import layerwise, layerwise_inference, output_rows, ssd_runner

__all__ = ["layerwise", "layerwise_inference", "output_rows", "ssd_runner"]
