"""Mini-batches from a store: the types every feature backend shares, the backends
(memory, ssd, baselines) behind FeatureSource, and the NodeLoader / EdgeLoader users drive."""
from .edge_loader import EdgeBatch, EdgeLoader
from .feature_source import FeatureSource, as_store, backend_class, private_scratch
from .form import plain_form_only, typed_form
from .node_loader import NodeLoader, check_nodes
from .types import MiniBatch, load_features

__all__ = ["EdgeBatch", "EdgeLoader", "FeatureSource", "MiniBatch", "NodeLoader", "as_store", "backend_class",
           "check_nodes", "load_features", "plain_form_only", "private_scratch", "typed_form"]
