"""Node orders: valid permutations; hot rows first; hotness matches sampled frequencies."""
import numpy as np

from gnnssd.sampler.graphs import random_csc
from gnnssd.sampler.order import degree_order, hotness, locality_order
from gnnssd.sampler.sampling import NeighborSampler


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
