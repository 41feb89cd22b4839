"""Building a compiled program records its shapes on a few of the graph's edges: the first
mini-batch does not run the unfused capture (a row per edge) on the whole block."""
from __future__ import annotations

import dgl
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from gnnssd.compiler import GATConvUDF, SAGEConvUDF
from gnnssd.compiler import compile as compile_layer
from gnnssd.compiler.block import SHAPE_SAMPLE_EDGES, CSCBlock, few_edges

FEATURES = 64


def _block(dst: int = 2000, fanout: int = 30, nodes: int = 5000) -> dgl.DGLGraph:
    """Edges far outnumber the sources: an edge-sized tensor stands out from node-sized ones."""
    torch.manual_seed(0)
    graph = dgl.rand_graph(nodes, 40 * nodes)
    _, _, blocks = dgl.dataloading.MultiLayerNeighborSampler([fanout]).sample_blocks(graph, torch.arange(dst))
    return blocks[0]


def _largest_allocation(run) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    return max(e.cpu_memory_usage for e in prof.events())


@pytest.mark.parametrize("layer", [lambda: SAGEConvUDF(FEATURES, FEATURES, "mean"),
                                   lambda: GATConvUDF(FEATURES, FEATURES // 4, 4)], ids=["sage", "gat"])
def test_the_first_call_allocates_no_edge_sized_copy_of_the_features(layer):
    block = _block()
    x = torch.randn(block.num_src_nodes(), FEATURES)
    compiled = compile_layer(layer())
    edge_copy = block.num_edges() * FEATURES * 4
    first = _largest_allocation(lambda: compiled(block, x))  # builds the program
    assert first < edge_copy / 4, (first, edge_copy)
    torch.testing.assert_close(compiled(block, x), compiled._layer(block, x), rtol=1e-5, atol=1e-5)


def test_few_edges_keeps_the_node_counts_frames_and_first_edges_of_a_block_and_a_csc_block():
    block = _block(dst=50, fanout=5, nodes=500)
    block.edata["w"] = torch.rand(block.num_edges())
    block.srcdata["h"] = torch.rand(block.num_src_nodes(), 3)
    small = few_edges(block)
    k = SHAPE_SAMPLE_EDGES
    assert small.is_block and small.num_edges() == k
    assert (small.num_src_nodes(), small.num_dst_nodes()) == (block.num_src_nodes(), block.num_dst_nodes())
    assert [t.tolist() for t in small.edges()] == [t[:k].tolist() for t in block.find_edges(torch.arange(k))]
    assert torch.equal(small.edata["w"], block.edata["w"][:k]) and small.srcdata["h"] is block.srcdata["h"]

    csc = CSCBlock.from_dgl(block)
    csc.edata["w"] = torch.rand(csc.num_edges)
    part = few_edges(csc)
    assert (part.num_src, part.num_dst, part.num_edges) == (csc.num_src, csc.num_dst, k)
    assert torch.equal(part.indptr, csc.indptr.clamp(max=k)) and torch.equal(part.indices, csc.indices[:k])
    assert torch.equal(part.edge_ids, csc.edge_ids[:k]) and torch.equal(part.edata["w"], csc.edata["w"][:k])

    graph = dgl.rand_graph(30, 200)
    whole = few_edges(graph)
    assert not whole.is_block and whole.num_nodes() == 30 and whole.num_edges() == k
