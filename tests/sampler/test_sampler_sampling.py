"""Neighbour sampling: distribution against DGL, exact cases, determinism."""
import os

os.environ.setdefault("DGLBACKEND", "pytorch")

import dgl
import numpy as np
import pytest
import torch
from scipy import stats

from gnnssd.sampler.graphs import random_csc
from gnnssd.sampler.sampling import NeighborSampler


def _graph_with_degrees(degrees: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """CSC graph on 100 nodes where node v has in-degree degrees[v] (0 past the list)."""
    rng = np.random.default_rng(seed)
    n = 100
    degrees = degrees + [0] * (n - len(degrees))
    src = [rng.choice(n, d, replace=False) for d in degrees]
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
    return indptr, np.concatenate(src).astype(np.int32)


def _inclusion_counts_ours(indptr, indices, fanout, draws):
    n = len(indptr) - 1
    seeds = np.arange(n)
    mfgs = NeighborSampler(indptr, indices, [fanout]).sample_many(
        np.tile(seeds, draws), np.arange(0, n * draws + 1, n), seed=1234
    )
    keys = []
    for m in mfgs:
        s, d = m.edges(0)
        keys.append(m.nodes[d] * n + m.nodes[s])
    return _count_edges(indptr, indices, np.concatenate(keys))


def _inclusion_counts_dgl(indptr, indices, fanout, draws):
    n = len(indptr) - 1
    dst = np.repeat(np.arange(n), np.diff(indptr))
    g = dgl.graph((torch.from_numpy(indices.astype(np.int64)), torch.from_numpy(dst)), num_nodes=n)
    dgl.seed(4321)
    keys = []
    for _ in range(draws):
        s, d = dgl.sampling.sample_neighbors(g, torch.arange(n), fanout).edges()
        keys.append(d.numpy() * n + s.numpy())
    return _count_edges(indptr, indices, np.concatenate(keys))


def _count_edges(indptr, indices, keys):
    n = len(indptr) - 1
    edge_keys = np.repeat(np.arange(n), np.diff(indptr)) * n + indices
    order = np.argsort(edge_keys)
    pos = np.searchsorted(edge_keys[order], keys)
    assert np.array_equal(edge_keys[order][pos], keys), "sampled an edge that is not in the graph"
    return np.bincount(order[pos], minlength=len(indices))


def _uniformity_statistic(indptr, fanout, draws, diff):
    """Chi-square statistic and dof for per-edge count deviations `diff` (count - expected,
    or a difference of two independent samplers' counts) under uniform sampling without
    replacement: counts of one node's edges have covariance R p(1-p) d/(d-1) (I - 11'/d)."""
    stat, dof = 0.0, 0
    for v in range(len(indptr) - 1):
        d = int(indptr[v + 1] - indptr[v])
        if d <= fanout:
            continue
        p = fanout / d
        x = diff[indptr[v] : indptr[v + 1]]
        stat += float((x**2).sum()) / (draws * p * (1 - p)) * (d - 1) / d
        dof += d - 1
    return stat, dof


@pytest.mark.parametrize("fanout", [3, 40])  # Floyd's algorithm, reservoir sampling
def test_inclusion_frequencies_match_dgl(fanout):
    degrees = [0, 1, 2, 3, 5, 8, 13, 21, 34, 41, 55, 60, 77, 90] * 2
    indptr, indices = _graph_with_degrees(degrees)
    draws = 1500
    ours = _inclusion_counts_ours(indptr, indices, fanout, draws)
    ref = _inclusion_counts_dgl(indptr, indices, fanout, draws)
    deg = np.repeat(np.diff(indptr), np.diff(indptr))
    expected = draws * np.minimum(1.0, fanout / deg)
    # nodes with degree <= fanout: every edge every time, in both samplers
    full = deg <= fanout
    assert np.array_equal(ours[full], expected[full]) and np.array_equal(ref[full], expected[full])
    for counts in (ours, ref):
        stat, dof = _uniformity_statistic(indptr, fanout, draws, counts - expected)
        assert stats.chi2.sf(stat, dof) > 1e-3, (stat, dof)
    stat, dof = _uniformity_statistic(indptr, fanout, 2 * draws, ours - ref)  # two-sample: variance doubles
    assert stats.chi2.sf(stat, dof) > 1e-3, (stat, dof)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])  # the store uses int32 when it fits
def test_all_neighbours_and_no_duplicates(index_dtype):
    indptr, indices = random_csc(3000, 12, seed=1)
    indices = indices.astype(index_dtype)
    seeds = np.random.default_rng(0).permutation(3000)[:200]
    full = NeighborSampler(indptr, indices, [-1]).sample(seeds, seed=5)
    s, d = full.edges(0)
    for i, v in enumerate(seeds):
        got = np.sort(full.nodes[s[d == i]])
        assert np.array_equal(got, np.sort(indices[indptr[v] : indptr[v + 1]]))
    m = NeighborSampler(indptr, indices, [7, 5]).sample(seeds, seed=5)
    for layer in range(2):
        s, d = m.edges(layer)
        key = d.astype(np.int64) * len(m.nodes) + s
        assert len(np.unique(key)) == len(key)  # without replacement
        deg = np.diff(indptr)[m.nodes[: m.num_dst[layer]]]
        assert np.array_equal(np.bincount(d, minlength=m.num_dst[layer]), np.minimum(deg, [7, 5][layer]))
    assert len(np.unique(m.nodes)) == len(m.nodes)


def test_deterministic_and_independent_of_threads():
    import numba

    indptr, indices = random_csc(5000, 10, seed=2)
    seeds = np.random.default_rng(1).permutation(5000)[:1000]
    ptr = np.array([0, 300, 650, 1000])
    sampler = NeighborSampler(indptr, indices, [5, 4, 3])
    a = sampler.sample_many(seeds, ptr, seed=9, first_batch_id=4)
    numba.set_num_threads(1)
    try:
        b = sampler.sample_many(seeds, ptr, seed=9, first_batch_id=4)
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert all(x.equals(y) for x, y in zip(a, b))
    # a mini-batch re-sampled on its own is the same; another seed gives other samples
    assert sampler.sample(seeds[300:650], seed=9, batch_id=5).equals(a[1])
    assert not sampler.sample(seeds[300:650], seed=10, batch_id=5).equals(a[1])


def test_relabelling_when_the_sample_holds_every_node_of_the_graph():
    # a complete graph of 40 nodes taken whole in two layers: each layer's sources are
    # every node (the relabel table's bound is the graph's node count, not its edges);
    # per mini-batch the nodes are its seeds, then new sources in order of first
    # appearance in CSC order, and every edge maps back to its CSC source
    n = 40
    indices = np.concatenate([np.delete(np.arange(n), v) for v in range(n)]).astype(np.int32)
    indptr = np.arange(0, n * (n - 1) + 1, n - 1, dtype=np.int64)
    seeds = [np.array([7, 3]), np.array([0, 39, 12]), np.array([25])]
    ptr = np.array([0, 2, 5, 6])
    got = NeighborSampler(indptr, indices, [-1, -1]).sample_many(np.concatenate(seeds), ptr, seed=1)
    for m, own in zip(got, seeds):
        order = list(own)
        for v in own:
            order += [u for u in indices[indptr[v]:indptr[v + 1]].tolist() if u not in order]
        assert m.nodes.tolist() == order and len(order) == n
        for layer in range(2):
            s, d = m.edges(layer)
            dst = m.nodes[d]
            assert np.array_equal(m.nodes[s], np.concatenate([np.delete(np.arange(n), v) for v in
                                                             m.nodes[:m.num_dst[layer]]]))
            assert np.array_equal(dst, np.repeat(m.nodes[:m.num_dst[layer]], n - 1))
