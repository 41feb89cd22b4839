"""Random CSC graphs for tests and benchmarks that run without a store."""
from __future__ import annotations

import numpy as np


def random_csc(num_nodes: int, avg_degree: float, seed: int = 0, communities: int = 0, local: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64, indices int32) of a directed graph with power-law in- and out-degrees.

    With `communities` > 0, nodes are split into that many ID ranges and a fraction `local`
    of each node's in-neighbours come from its own range. Duplicate edges are removed.
    """
    rng = np.random.default_rng(seed)
    num_edges = int(num_nodes * avg_degree)
    weight = 1.0 / (1.0 + rng.permutation(num_nodes)) ** 0.8  # Zipf-like popularity
    weight /= weight.sum()
    src = rng.choice(num_nodes, num_edges, p=weight)
    dst = rng.choice(num_nodes, num_edges, p=rng.permutation(weight))
    if communities:
        size = -(-num_nodes // communities)
        near = rng.random(num_edges) < local
        src[near] = (dst[near] // size) * size + src[near] % size
        src = np.minimum(src, num_nodes - 1)
    key = np.unique(dst.astype(np.int64) * num_nodes + src)
    dst, src = key // num_nodes, key % num_nodes
    indptr = np.zeros(num_nodes + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    return indptr, src.astype(np.int32)
