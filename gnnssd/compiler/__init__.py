"""MP-DFG compiler: DGL-style message/reduce layers run as fused message passing.

>>> layer = gnnssd.compiler.compile(GATConvUDF(16, 8, num_heads=4))
>>> out = layer(block, feat); layer.explain()
"""
from gnnssd.compiler.api import CompiledLayer, compile
from gnnssd.compiler.block import CSCBlock, TypedCSCBlock
from gnnssd.compiler.errors import LoweringError
from gnnssd.compiler.hetero import HeteroGraphConvCompiled
from gnnssd.compiler.layers import GATConvUDF, GraphConvUDF, SAGEConvUDF

__all__ = ["compile", "CompiledLayer", "CSCBlock", "TypedCSCBlock", "HeteroGraphConvCompiled", "LoweringError",
           "SAGEConvUDF", "GraphConvUDF", "GATConvUDF"]
