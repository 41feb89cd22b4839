"""Sampling on torch tensors (gnnssd.loading.tensor_sampling) against the numba sampler and
DGL, on CPU tensors: fanout -1 and LABOR give the numba sampler's blocks edge for edge;
uniform sampling keeps min(fanout, degree) distinct in-edges per node, each with
probability min(fanout, degree) / degree over many draws; DGL's sample_neighbors gives the
same structure; a (seed, batch) pair always draws the same blocks."""
from __future__ import annotations

import dgl
import numpy as np
import pytest
import torch

from gnnssd.compiler import CSCBlock
from gnnssd.loading.tensor_sampling import TensorSampler
from gnnssd.sampler import MFGs, NeighborSampler
from gnnssd.sampler.graphs import random_csc


@pytest.fixture(scope="module")
def graph() -> tuple[np.ndarray, np.ndarray]:
    return random_csc(400, 12, seed=5)


def _tensors(indptr: np.ndarray, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(indptr), torch.from_numpy(indices)


def _numba_csc(mfgs: MFGs, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Block i of the numba sampler's MFGs as (indptr, local sources): its edges come grouped
    by destination, in the order it sampled them."""
    src, dst = mfgs.edges(i)
    assert np.all(np.diff(dst) >= 0)
    indptr = np.zeros(mfgs.num_dst[i] + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=mfgs.num_dst[i]), out=indptr[1:])
    return indptr, src.astype(np.int64)


def _same_blocks(nodes: torch.Tensor, blocks: list[CSCBlock], mfgs: MFGs) -> None:
    np.testing.assert_array_equal(nodes.numpy(), mfgs.nodes)
    assert len(blocks) == mfgs.num_layers
    for i, block in enumerate(blocks):
        indptr, src = _numba_csc(mfgs, i)
        assert (block.num_src, block.num_dst) == (mfgs.num_src[i], mfgs.num_dst[i])
        np.testing.assert_array_equal(block.indptr.numpy(), indptr)
        np.testing.assert_array_equal(block.indices.numpy(), src)


def test_all_neighbours_give_the_numba_samplers_blocks(graph) -> None:
    indptr, indices = graph
    seeds = np.array([7, 3, 250, 99, 0, 398], np.int64)
    nodes, blocks = TensorSampler(*_tensors(indptr, indices), [-1, -1]).sample(torch.from_numpy(seeds), 1)
    _same_blocks(nodes, blocks, NeighborSampler(indptr, indices, [-1, -1]).sample(seeds, 1))
    for block in blocks:  # the edge IDs are the CSC positions of the edges
        dst = block.dst_index()
        np.testing.assert_array_equal(indices[block.edge_ids.numpy()], nodes[block.indices].numpy())
        assert torch.all(block.edge_ids >= torch.from_numpy(indptr)[nodes[dst]])


@pytest.mark.parametrize("method", ["labor", "uniform"])
@pytest.mark.parametrize("fanouts", [[4, 3], [-1, 2], [25, 1], [32, 32]])
def test_labor_and_uniform_up_to_32_give_the_numba_samplers_blocks_edge_for_edge(graph, method, fanouts) -> None:
    """LABOR's variates and uniform's Floyd draws are the numba sampler's, so are the blocks
    (uniform up to a fanout of 32, where the numba sampler turns to reservoir sampling)."""
    indptr, indices = graph
    seeds = np.arange(5, 400, 9, dtype=np.int64)
    sampler = TensorSampler(*_tensors(indptr, indices), fanouts, method=method)
    reference = NeighborSampler(indptr, indices, fanouts, method=method)
    for seed, batch in ((3, 0), (12345, 7), (2**40 + 1, (5 << 32) + 2)):
        nodes, blocks = sampler.sample(torch.from_numpy(seeds), seed, batch)
        _same_blocks(nodes, blocks, reference.sample(seeds, seed, batch))


def test_uniform_keeps_min_fanout_degree_distinct_in_edges_of_each_node(graph) -> None:
    indptr, indices = graph
    seeds = np.arange(400, dtype=np.int64)
    nodes, (block,) = TensorSampler(*_tensors(indptr, indices), [5]).sample(torch.from_numpy(seeds), 9, 4)
    degree = np.diff(indptr)
    np.testing.assert_array_equal(block.in_degrees().numpy(), np.minimum(degree, 5))
    src = nodes[block.indices].numpy()
    dst = block.dst_index().numpy()
    pairs = set(zip(src.tolist(), dst.tolist()))
    assert len(pairs) == block.num_edges  # without replacement
    graph_pairs = set(zip(indices.tolist(), np.repeat(np.arange(400), degree).tolist()))
    assert pairs <= graph_pairs


@pytest.mark.parametrize("method, fanout", [("uniform", 4), ("uniform", 40), ("labor", 4)])
def test_each_in_edge_is_sampled_with_probability_fanout_over_degree(method, fanout) -> None:
    """Over 1000 draws (batch IDs) the count of every edge is binomial(1000, p) with p =
    min(fanout, degree) / degree: each within 5 standard deviations (about 1 in 3.5 million
    per edge by chance), and their mean deviation near 0. Fanout 40: the random-key draws
    above Floyd's range."""
    indptr, indices = random_csc(60, 15, seed=2) if fanout < 10 else random_csc(100, 45, seed=2)
    draws = 1000
    sampler = TensorSampler(*_tensors(indptr, indices), [fanout], method=method)
    seeds = torch.arange(len(indptr) - 1)
    counts = np.zeros(len(indices))
    for batch in range(draws):
        _, (block,) = sampler.sample(seeds, 11, batch)
        counts += np.bincount(block.edge_ids.numpy(), minlength=len(indices))
    degree = np.diff(indptr)
    p = np.repeat(np.minimum(fanout, degree) / np.maximum(degree, 1), degree)
    varied = (p > 0) & (p < 1)
    assert varied.sum() > 200, varied.sum()  # edges of nodes with more than `fanout`
    z = (counts - draws * p)[varied] / np.sqrt(draws * p * (1 - p))[varied]
    assert np.abs(z).max() < 5
    assert np.all(counts[p == 1] == draws)
    assert abs(z.mean()) < 5 / np.sqrt(varied.sum())  # no bias shared by the edges


def test_uniform_has_the_structure_of_dgls_sample_neighbors(graph) -> None:
    """DGL's sample_neighbors on the same graph and seeds: every node has as many sampled
    in-edges, fanout -1 gives the same edges; our sources are DGL's to_block's set."""
    indptr, indices = graph
    g = dgl.graph(("csc", (torch.from_numpy(indptr), torch.from_numpy(indices.astype(np.int64)), torch.tensor([]))),
                  num_nodes=400)
    seeds = torch.arange(0, 400, 7)
    for fanout in (3, 8, -1):
        frontier = dgl.sampling.sample_neighbors(g, seeds, fanout)
        theirs = dgl.to_block(frontier, seeds)
        nodes, (block,) = TensorSampler(*_tensors(indptr, indices), [fanout]).sample(seeds, 0)
        np.testing.assert_array_equal(block.in_degrees().numpy(), theirs.in_degrees().numpy())
        assert block.num_dst == theirs.num_dst_nodes()
        if fanout == -1:
            src, dst = frontier.edges()
            mine = set(zip(nodes[block.indices].tolist(), nodes[block.dst_index()].tolist()))
            assert mine == set(zip(src.tolist(), dst.tolist()))
            assert set(nodes.tolist()) == set(theirs.srcdata[dgl.NID].tolist())


def test_a_seed_and_batch_draw_the_same_blocks_and_others_differ(graph) -> None:
    indptr, indices = graph
    sampler = TensorSampler(*_tensors(indptr, indices), [5, 5])
    seeds = torch.arange(0, 400, 5)
    first = sampler.sample(seeds, 3, 1)
    again = sampler.sample(seeds, 3, 1)
    other = sampler.sample(seeds, 3, 2)
    assert torch.equal(first[0], again[0])
    assert all(torch.equal(a.indices, b.indices) and torch.equal(a.indptr, b.indptr)
               for a, b in zip(first[1], again[1]))
    assert not torch.equal(first[1][1].edge_ids, other[1][1].edge_ids)


def test_bad_arguments_are_refused_naming_them(graph) -> None:
    indptr, indices = _tensors(*graph)
    with pytest.raises(ValueError, match="method: 'topk'"):
        TensorSampler(indptr, indices, [2], method="topk")
    with pytest.raises(ValueError, match=r"fanouts \[2, -3\]"):
        TensorSampler(indptr, indices, [2, -3])
    with pytest.raises(ValueError, match="int64 indptr"):
        TensorSampler(indptr.int(), indices, [2])
