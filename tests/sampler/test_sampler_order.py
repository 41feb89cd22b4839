"""Node orders: valid permutations; hot rows first; hotness matches sampled frequencies;
METIS recovers a planted neighbourhood structure; RCM narrows the band."""
import numpy as np
import pytest

from gnnssd.datasets.synthetic import synthetic_source
from gnnssd.sampler.graphs import random_csc
from gnnssd.sampler.order import (degree_order, hot_order, hotness, locality_order, metis_order, node_order, rcm_order,
                                  window_locality)
from gnnssd.sampler.sampling import NeighborSampler
from gnnssd.storage_format.preprocess.csc import csc_from_edges


def test_orders_are_permutations_with_hot_rows_first():
    n = 5000
    indptr, indices = random_csc(n, 8, seed=5, communities=10)
    heat = hotness(indptr, indices, (5, 5))
    for perm in (degree_order(indptr, indices), locality_order(indptr, indices, 0.1, (5, 5))):
        assert np.array_equal(np.sort(perm), np.arange(n))
    perm = locality_order(indptr, indices, 0.1, (5, 5))
    assert np.all(np.diff(heat[perm[:500]]) <= 0)  # hottest first
    assert heat[perm[:500]].min() >= heat[perm[500:]].max()
    refs = np.bincount(indices, minlength=n)[degree_order(indptr, indices)]
    assert np.all(np.diff(refs) <= 0)


def test_hot_order_is_the_one_ranking():
    """With fanouts [-1] (layer-wise inference reads each in-neighbour list once) nodes rank
    by how many lists name them, ties by ID: NumPy's count; with the sampler's fanouts, by
    hotness; `rows` ranks a prefix only (the featured types of a typed store)."""
    n = 4000
    indptr, indices = random_csc(n, 6, seed=9)
    refs = np.bincount(indices, minlength=n)
    np.testing.assert_array_equal(hot_order(indptr, indices, [-1]), np.argsort(-refs, kind="stable"))
    heat = hotness(indptr, indices, (5, 3))
    np.testing.assert_array_equal(hot_order(indptr, indices, (5, 3), rows=1000),
                                  np.argsort(-heat[:1000], kind="stable"))


def test_hotness_predicts_sampled_frequency():
    n = 3000
    indptr, indices = random_csc(n, 10, seed=6)
    fanouts = (4, 3)
    heat = hotness(indptr, indices, fanouts)
    rng = np.random.default_rng(0)
    seeds = np.concatenate([rng.permutation(n)[:100] for _ in range(300)])
    mfgs = NeighborSampler(indptr, indices, fanouts).sample_many(seeds, np.arange(0, len(seeds) + 1, 100), seed=3)
    freq = np.bincount(np.concatenate([m.input_nodes for m in mfgs]), minlength=n) / len(seeds)
    # an upper bound per node (duplicates within a mini-batch are counted once when sampled) ...
    assert np.all(freq <= heat * 1.2 + 0.01)
    # ... and a good ranking: the predicted top 10% holds most of the sampled accesses
    top = np.argsort(-heat)[: n // 10]
    best = np.sort(freq)[::-1][: n // 10].sum()
    assert freq[top].sum() >= 0.9 * best


def test_locality_order_keeps_neighbours_close():
    n = 20000
    indptr, indices = random_csc(n, 8, seed=8, communities=40)
    shuffled = np.random.default_rng(1).permutation(n)  # hide the communities' ID ranges
    inv = np.argsort(shuffled)
    dst = np.repeat(np.arange(n), np.diff(indptr))
    new_dst, new_src = inv[dst], inv[indices]
    o = np.argsort(new_dst, kind="stable")
    s_indptr = np.concatenate([[0], np.cumsum(np.bincount(new_dst, minlength=n))])
    s_indices = new_src[o].astype(np.int32)
    perm = locality_order(s_indptr, s_indices, 0.05, (5, 5))
    pos = np.argsort(perm)
    s_dst = np.repeat(np.arange(n), np.diff(s_indptr))
    cold = (pos[s_dst] >= n // 20) & (pos[s_indices] >= n // 20)  # hot rows sit at the front
    gap_local = np.abs(pos[s_dst] - pos[s_indices])[cold]
    gap_shuffled = np.abs(s_dst - s_indices.astype(np.int64))[cold]
    assert np.median(gap_local) < np.median(gap_shuffled) / 4
    community = n // 40
    assert (gap_local < community).mean() > 5 * (gap_shuffled < community).mean()


def _planted(n: int, local_size: int):
    """A synthetic graph with 80% of edges inside neighbourhoods of `local_size` nodes (node
    IDs random), as CSC, its edges, and the generator's own neighbourhood order (the oracle)."""
    source = synthetic_source(num_nodes=n, feat_dim=4, avg_degree=15, num_classes=8, local_fraction=0.8,
                              local_size=local_size)
    s, d = source.load_edges()
    indptr, indices = csc_from_edges(s, d, n)
    return indptr, indices, s, d, source.neighbourhood_order()


def test_metis_order_recovers_a_planted_neighbourhood_structure():
    n, size = 30_000, 512
    indptr, indices, s, d, oracle = _planted(n, size)
    window = 4 * size
    recovered = {name: window_locality(perm, s, d, window) for name, perm in (
        ("original", np.arange(n)), ("oracle", oracle), ("metis", metis_order(indptr, indices, part_size=size)),
        ("locality", locality_order(indptr, indices)))}
    assert recovered["oracle"] > 0.75  # 80% of edges planted inside neighbourhoods
    assert recovered["original"] < recovered["oracle"] - 0.3
    assert recovered["metis"] > 0.9 * recovered["oracle"]
    assert recovered["metis"] > recovered["locality"] + 0.2  # hot rows up front cut the hubs' edges


def test_orders_by_name_are_permutations_and_rcm_recovers_a_band():
    n = 5000
    indptr, indices = random_csc(n, 8, seed=5, communities=10)
    for name in ("rcm", "metis"):
        perm = node_order(name).permutation(indptr, indices, None)
        assert np.array_equal(np.sort(perm), np.arange(n))
    # a 100 x 30 grid under shuffled IDs: RCM brings the bandwidth back to about the width
    rows, cols = 100, 30
    node = np.arange(rows * cols).reshape(rows, cols)
    pairs = np.concatenate([np.stack([node[:, :-1].ravel(), node[:, 1:].ravel()], 1),
                            np.stack([node[:-1].ravel(), node[1:].ravel()], 1)])
    shuffled = np.random.default_rng(2).permutation(rows * cols)
    s, d = shuffled[pairs[:, 0]], shuffled[pairs[:, 1]]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(d, minlength=rows * cols))]).astype(np.int64)
    indices = s[np.argsort(d, kind="stable")].astype(np.int32)
    pos = np.empty(rows * cols, np.int64)
    pos[rcm_order(indptr, indices)] = np.arange(rows * cols)
    assert np.abs(pos[s] - pos[d]).max() <= 2 * cols
    assert np.abs(s - d).max() > 10 * cols
    with pytest.raises(ValueError, match="expected one of"):
        node_order("bfs")


def _numpy_hotness(indptr, indices, fanouts, seeds=None):
    """hotness written with NumPy's node-sized arrays: the reference."""
    n = len(indptr) - 1
    deg = np.diff(indptr).astype(np.float64)
    frontier = np.zeros(n)
    frontier[np.arange(n) if seeds is None else seeds] = 1.0 / (n if seeds is None else len(seeds))
    dst = np.repeat(np.arange(n), np.diff(indptr))
    for layer in reversed(list(fanouts)):
        fanout = -1 if (np.asarray(layer) < 0).any() else int(np.sum(layer))
        take = np.ones(n) if fanout < 0 else np.minimum(1.0, fanout / np.maximum(deg, 1.0))
        reached = np.zeros(n)
        np.add.at(reached, indices, (frontier * take)[dst])
        frontier = frontier + reached
    return frontier


@pytest.mark.parametrize("fanouts, with_seeds", [((5, 3), False), ([-1], False), ((10, 5), True),
                                                 ([[2, 3], 4], True)])
def test_hotness_equals_numpy_and_holds_two_node_sized_arrays(fanouts, with_seeds):
    """Equal to NumPy's node-sized arithmetic (the same float64 operations, in-edge order
    kept: bit for bit), with a peak of about two float64 arrays of the nodes (it was six:
    5.8 GiB at 122M nodes)."""
    import tracemalloc
    n = 20000
    indptr, indices = random_csc(n, 10, seed=3)
    seeds = np.arange(0, n, 7) if with_seeds else None
    tracemalloc.start()
    heat = hotness(indptr, indices, fanouts, seeds)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    np.testing.assert_array_equal(heat, _numpy_hotness(indptr, indices, fanouts, seeds))
    assert peak < 3 * 8 * n + indptr.nbytes, peak
