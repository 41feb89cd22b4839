"""Blocks from the sampler equal DGL's to_block for the same sampled edges."""
import os

os.environ.setdefault("DGLBACKEND", "pytorch")

import dgl
import numpy as np
import torch
from dgl.nn import SAGEConv

from gnnssd.sampler.blocks import to_dgl_blocks
from gnnssd.sampler.graphs import random_csc
from gnnssd.sampler.sampling import NeighborSampler


def _reference_blocks(mfgs, num_nodes):
    """DGL's to_block on each layer's sampled edges (as global IDs), output layer first."""
    blocks, dst_nodes = [], torch.from_numpy(mfgs.seeds.copy())
    for i in reversed(range(mfgs.num_layers)):
        s, d = mfgs.edges(i)
        frontier = dgl.graph(
            (torch.from_numpy(mfgs.nodes[s]), torch.from_numpy(mfgs.nodes[d])), num_nodes=num_nodes
        )
        block = dgl.to_block(frontier, dst_nodes=dst_nodes)
        blocks.insert(0, block)
        dst_nodes = block.srcdata[dgl.NID]
    return blocks


def test_layer_outputs_match_to_block():
    n = 4000
    indptr, indices = random_csc(n, 9, seed=3)
    seeds = np.random.default_rng(2).permutation(n)[:150]
    mfgs = NeighborSampler(indptr, indices, [6, -1, 3]).sample(seeds, seed=11)
    ours, ref = to_dgl_blocks(mfgs), _reference_blocks(mfgs, n)

    for a, b in zip(ours, ref):
        assert (a.num_src_nodes(), a.num_dst_nodes(), a.num_edges()) == (b.num_src_nodes(), b.num_dst_nodes(), b.num_edges())
        for kind in ("srcdata", "dstdata"):  # same nodes; the order of non-seed nodes may differ
            assert torch.equal(getattr(a, kind)[dgl.NID].sort()[0], getattr(b, kind)[dgl.NID].sort()[0])
    assert torch.equal(ours[-1].dstdata[dgl.NID], ref[-1].dstdata[dgl.NID])
    assert np.array_equal(ours[0].srcdata[dgl.NID].numpy(), mfgs.input_nodes)

    torch.manual_seed(0)
    x = torch.randn(n, 16)
    layers = [SAGEConv(16, 16, "mean"), SAGEConv(16, 16, "gcn"), SAGEConv(16, 8, "pool")]

    def forward(blocks):
        h = x[blocks[0].srcdata[dgl.NID]]
        for layer, block in zip(layers, blocks):
            h = torch.relu(layer(block, h))
        return h

    with torch.no_grad():
        assert torch.allclose(forward(ours), forward(ref), atol=1e-5)
