"""Node orders for the store, from the CSC topology: perm[new_position] = old_id.

The hot cache takes the front of the order in one read, so hot rows come first; the rest
are laid out so that nodes sampled together (graph neighbours) share pages, which makes a
mega-batch's rows dense on disk.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numba as nb
import numpy as np

from gnnssd.storage_format import release_pages

if TYPE_CHECKING:
    import scipy.sparse


@nb.njit(cache=True)
def _spread(indptr, indices, frontier, fanout, out):
    """out[u] += frontier[v] * min(1, fanout / in-degree(v)) (fanout < 0: the whole
    frontier[v]) for every in-neighbour u of every node v; returns the first node whose
    in-edges are no range of `indices` or name no node of the graph (-1: none), and writes
    nothing outside `out` (a tampered store must not corrupt memory). The take is computed
    per node here, not as node-sized float64 arrays (5.8 GiB at 122M nodes)."""
    n, m = indptr.shape[0] - 1, indices.shape[0]
    for v in range(n):
        a, b = indptr[v], indptr[v + 1]
        take = 1.0 if fanout < 0 else min(1.0, fanout / max(float(b - a), 1.0))
        w = frontier[v] * take
        if w != 0.0:
            if a < 0 or b < a or b > m:
                return v
            for e in range(a, b):
                u = indices[e]
                if u < 0 or u >= n:
                    return v
                out[u] += w
    return -1


def hotness(indptr: np.ndarray, indices: np.ndarray, fanouts: Sequence[int], seeds: np.ndarray | None = None) -> np.ndarray:
    """Expected number of times each node is an input of a mini-batch, per seed (float64).

    Propagates the seed distribution (uniform over `seeds`, default all nodes) outwards
    layer by layer as the sampler does: every frontier node stays in the frontier, and an
    in-neighbour of v is drawn with probability min(1, fanout / in-degree(v)). Memory: two
    node-sized float64 arrays.
    """
    n = len(indptr) - 1
    indptr = np.asarray(indptr, np.int64)
    frontier = np.zeros(n)
    if seeds is None:
        frontier[:] = 1.0 / n
    else:
        frontier[np.asarray(seeds)] = 1.0 / len(seeds)
    reached = np.empty(n)
    for layer in reversed(list(fanouts)):
        # per-relation fanouts (typed graphs) count as their sum over all in-edges
        fanout = -1 if (np.asarray(layer) < 0).any() else int(np.sum(layer))
        reached[:] = 0.0
        bad = _spread(indptr, indices, frontier, fanout, reached)
        if bad >= 0:
            raise IndexError(f"node {bad}: its in-edges (indptr, indices) are not valid; the topology "
                             "is invalid (`gnnssd verify` names the file)")
        frontier += reached
    return frontier


def hot_order(indptr: np.ndarray, indices: np.ndarray, fanouts: Sequence[Any], seeds: np.ndarray | None = None,
              rows: int | None = None) -> np.ndarray:
    """The first `rows` nodes (default all) hottest first by `hotness`, ties in ID order: the
    one ranking behind every cache of hot rows. The training hot cache ranks with the
    sampler's fanouts from the training seeds; layer-wise inference, which reads every
    in-neighbour list once per layer, with fanouts [-1] (a node's rank is then how many
    lists name it)."""
    heat = np.negative(hotness(indptr, indices, fanouts, seeds)[:rows])  # one node-sized copy, not two
    return np.argsort(heat, kind="stable")


@nb.njit(cache=True, nogil=True)
def _count_refs(indices, refs):
    for e in range(indices.shape[0]):
        refs[indices[e]] += 1


#: Edges counted per step by `degree_order` (the indices may be a map of a file larger than memory).
COUNT_CHUNK = 1 << 26


@nb.njit(cache=True)
def _by_count_descending(counts):
    """np.argsort(-counts, kind="stable") for small non-negative counts, as a counting
    sort: O(nodes + largest count) instead of a comparison sort of 10^8 keys."""
    top = counts.max() if counts.shape[0] else 0
    start = np.zeros(top + 2, np.int64)
    for c in counts:
        start[top - c + 1] += 1
    for k in range(top + 1):
        start[k + 1] += start[k]
    order = np.empty(counts.shape[0], np.int64)
    for v in range(counts.shape[0]):
        slot = top - counts[v]
        order[start[slot]] = v
        start[slot] += 1
    return order


def degree_order(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Nodes by how many in-neighbour lists name them (out-degree), most first; stable.
    Counted a chunk at a time, the mapped pages of `indices` released after each."""
    refs = np.zeros(len(indptr) - 1, dtype=np.int64)
    for lo in range(0, indices.shape[0], COUNT_CHUNK):
        _count_refs(indices[lo:lo + COUNT_CHUNK], refs)
        release_pages(indices)
    return _by_count_descending(refs)


@nb.njit(cache=True)
def _bfs_order(indptr, indices, placed, order, filled):
    """Breadth-first over in-edges from each unplaced node in ID order, skipping placed ones."""
    n = indptr.shape[0] - 1
    for root in range(n):
        if placed[root]:
            continue
        placed[root] = True
        head = filled
        order[filled] = root
        filled += 1
        while head < filled:
            v = order[head]
            head += 1
            for e in range(indptr[v], indptr[v + 1]):
                u = indices[e]
                if not placed[u]:
                    placed[u] = True
                    order[filled] = u
                    filled += 1
    return filled


@nb.njit(cache=True)
def _label_propagation(indptr, indices, visit, iterations, max_size):
    """Size-constrained asynchronous label propagation over in-edges: each node of `visit`,
    in turn, takes the label most common among its in-neighbours (ties: its own, else the
    first seen) among labels with fewer than `max_size` nodes. Without the size limit,
    hubs let one label swallow most of a power-law graph."""
    n = indptr.shape[0] - 1
    label = np.arange(n)
    size = np.ones(n, np.int64)
    count = np.zeros(n, np.int64)
    for _ in range(iterations):
        changed = 0
        for v in visit:
            best, best_count = label[v], 0
            for e in range(indptr[v], indptr[v + 1]):
                count[label[indices[e]]] += 1
            for e in range(indptr[v], indptr[v + 1]):
                u = indices[e]
                c = count[label[u]]
                if label[u] == label[v]:
                    if c >= best_count:
                        best, best_count = label[u], c
                elif c > best_count and size[label[u]] < max_size:
                    best, best_count = label[u], c
            for e in range(indptr[v], indptr[v + 1]):
                count[label[indices[e]]] = 0
            if best != label[v]:
                size[label[v]] -= 1
                size[best] += 1
                label[v] = best
                changed += 1
        if changed < n // 1000:
            break
    return label


def locality_order(
    indptr: np.ndarray,
    indices: np.ndarray,
    hot_fraction: float = 0.05,
    fanouts: Sequence[int] = (15, 10, 5),
    seeds: np.ndarray | None = None,
    max_community: int | None = None,
) -> np.ndarray:
    """Hottest `hot_fraction` of nodes first (hottest first), then the rest by community.

    Communities come from label propagation over the whole graph (without the hubs the
    rest is too sparse to agree on labels), at most `max_community` nodes each (default
    n/8, at least 1024); inside a community nodes keep BFS order. A
    plain BFS is not enough: its frontier spreads over the whole graph within a few levels.
    """
    n = len(indptr) - 1
    heat = hotness(indptr, indices, fanouts, seeds)
    num_hot = int(round(hot_fraction * n))
    order = np.empty(n, np.int64)
    order[:num_hot] = np.argsort(-heat, kind="stable")[:num_hot]
    placed = np.zeros(n, np.bool_)
    placed[order[:num_hot]] = True
    indptr = np.asarray(indptr, np.int64)
    filled = _bfs_order(indptr, indices, placed, order, num_hot)
    assert filled == n
    rest = order[num_hot:]
    max_community = max_community or max(n // 8, 1024)
    label = _label_propagation(indptr, indices, np.random.default_rng(0).permutation(n), 10, max_community)
    order[num_hot:] = rest[np.argsort(label[rest], kind="stable")]
    return order


def _symmetric(indptr: np.ndarray, indices: np.ndarray) -> scipy.sparse.csr_matrix:
    """The undirected graph (A + A^T) as a boolean scipy CSR matrix."""
    import scipy.sparse as sp

    n = len(indptr) - 1
    a = sp.csr_matrix((np.ones(len(indices), np.bool_), np.asarray(indices), np.asarray(indptr)), shape=(n, n))
    return (a + a.T).tocsr()


def rcm_order(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Reverse Cuthill-McKee order (scipy) of the undirected graph: a bandwidth-reducing
    BFS that visits low-degree nodes first."""
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    return reverse_cuthill_mckee(_symmetric(indptr, indices), symmetric_mode=True).astype(np.int64)


def metis_parts(indptr: np.ndarray, indices: np.ndarray, num_parts: int) -> np.ndarray:
    """METIS partition (DGL's `metis_partition_assignment`: balanced, minimum edge cut) of
    the undirected graph: a part ID per node."""
    import dgl
    import torch

    n = len(indptr) - 1
    if num_parts < 2:
        return np.zeros(n, np.int64)
    sym = _symmetric(indptr, indices)
    sym.setdiag(0)
    sym.eliminate_zeros()
    csr = (torch.from_numpy(sym.indptr.astype(np.int64)), torch.from_numpy(sym.indices.astype(np.int64)),
           torch.empty(0, dtype=torch.int64))
    return dgl.metis_partition_assignment(dgl.graph(("csr", csr), num_nodes=n), num_parts).numpy().astype(np.int64)


def metis_order(indptr: np.ndarray, indices: np.ndarray, part_size: int = 1024) -> np.ndarray:
    """METIS parts of about `part_size` nodes, each laid out contiguously, in reverse
    Cuthill-McKee order inside a part. No hot prefix: hubs belong to their part, and the
    loader picks the hot cache's rows by `hotness` wherever they are."""
    n = len(indptr) - 1
    part = metis_parts(indptr, indices, n // part_size)
    rcm_position = np.empty(n, np.int64)
    rcm_position[rcm_order(indptr, indices)] = np.arange(n)
    return np.lexsort((rcm_position, part)).astype(np.int64)


def window_locality(perm: np.ndarray, src: np.ndarray, dst: np.ndarray, window: int) -> float:
    """Share of the edges (src, dst) whose two ends land in the same aligned window of
    `window` rows of the order `perm` (perm[row] = node): how much of a neighbourhood
    structure of about `window` nodes the order recovers (1 = every edge inside a window)."""
    row = np.empty(len(perm), np.int64)
    row[perm] = np.arange(len(perm))
    return float(np.mean(row[src] // window == row[dst] // window))


@dataclass(frozen=True)
class NodeOrder:
    """A named node order for `write_store`: `permutation(indptr, indices, train_idx)` is
    perm with perm[store_id] = original_id. The store records the name. `hot_first`: the
    order puts the rows sampling reaches most first, so the hot cache is the front of the
    file (one sequential read) and needs no ranking of its own."""

    name: str
    permutation: Callable[[np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]
    hot_first: bool = False


def _original(indptr: np.ndarray, indices: np.ndarray, train_idx: np.ndarray | None) -> np.ndarray:
    return np.arange(indptr.shape[0] - 1, dtype=np.int64)


def _degree(indptr: np.ndarray, indices: np.ndarray, train_idx: np.ndarray | None) -> np.ndarray:
    return degree_order(indptr, indices)


def _locality(indptr: np.ndarray, indices: np.ndarray, train_idx: np.ndarray | None) -> np.ndarray:
    """The hottest 5% of rows (expected sampling frequency from `train_idx` with fanouts
    15,10,5) first, then the rest grouped by graph community."""
    return locality_order(indptr, indices, hot_fraction=0.05, fanouts=(15, 10, 5), seeds=train_idx)


def _rcm(indptr: np.ndarray, indices: np.ndarray, train_idx: np.ndarray | None) -> np.ndarray:
    return rcm_order(indptr, indices)


def _metis(indptr: np.ndarray, indices: np.ndarray, train_idx: np.ndarray | None) -> np.ndarray:
    return metis_order(indptr, indices)


ORDERS = {o.name: o for o in (NodeOrder("original", _original), NodeOrder("degree", _degree, hot_first=True),
                              NodeOrder("locality", _locality, hot_first=True), NodeOrder("rcm", _rcm),
                              NodeOrder("metis", _metis))}


def node_order(name: str) -> NodeOrder:
    """The order called `name`: original, degree (most-referenced rows first), locality
    (label-propagation communities), rcm (reverse Cuthill-McKee) or metis (METIS parts)."""
    if name not in ORDERS:
        raise ValueError(f"order {name!r}: expected one of {tuple(ORDERS)}")
    return ORDERS[name]
