"""Mini-batches from a store: the types every feature backend shares, the backends
(memory, ssd, baselines) behind FeatureSource, and the NodeLoader / EdgeLoader users drive."""
from .edge_loader import EdgeBatch, EdgeLoader
from .feature_source import FeatureSource, as_store, backend_class, private_scratch
from .node_loader import NodeLoader, check_nodes
from .types import MiniBatch, load_features

__all__ = ["EdgeBatch", "EdgeLoader", "FeatureSource", "MiniBatch", "NodeLoader", "as_store", "backend_class",
           "check_nodes", "load_features", "private_scratch"]
