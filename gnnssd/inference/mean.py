"""Layer-wise inference of mean-aggregation layers by sequential passes over the input file.

Chunks of destinations over their gathered in-neighbour rows (gnnssd.inference.layerwise) are what a
general layer needs, but on a graph without neighbourhood locality every chunk's
in-neighbours are spread over the whole file: the reads are one small request per row, and a
layer takes hours on a 20M-node graph. A layer whose neighbour input is the mean of its
in-neighbours' rows (GraphSAGE-mean) needs no gathered rows at all: the sum is accumulated.
Destinations are cut into ranges whose float32 sums fit half the budget; for each range the
input file is read once from start to end in segments of large sequential requests, and every
in-edge adds its source's row to its destination's sum as the segment holding that source
goes by (the range's edges are bucketed by segment first). Then the layer runs on each
destination's own row and its mean, over a block with one edge per destination, so the
model's own layer code computes the output (summation order aside, the same numbers).

Reads per layer: one pass over the file per range, (nodes x width x 4 B) / (budget / 2)
passes, all sequential at the drive's bandwidth.
"""
from __future__ import annotations

from typing import Iterator

import dgl
import numba as nb
import numpy as np
import torch
from torch import nn

from .rows import Rows

SEGMENT_BYTES = 16 << 20  # input rows read and added at once
SUM_SHARE = 2  # a range's sums and bucketed edges take at most 1/SUM_SHARE of the budget
EDGE_BYTES = 12  # a bucketed edge: its source (int64) and its destination in the range (int32)


def sum_ranges(indptr: np.ndarray, width: int, budget: int) -> list[tuple[int, int]]:
    """Destination ranges [lo, hi) whose float32 sums of `width` and bucketed in-edges fit
    budget // SUM_SHARE (at least one node each)."""
    nodes = np.arange(len(indptr), dtype=np.int64)
    return cost_ranges(nodes * (width * 4) + np.asarray(indptr, np.int64) * EDGE_BYTES,
                       max(budget // SUM_SHARE, 1))


def cost_ranges(cost: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Consecutive node ranges [lo, hi) with cost[hi] - cost[lo] <= limit (cost: a
    non-decreasing prefix sum over the nodes, len nodes + 1), at least one node each."""
    n = len(cost) - 1
    bounds, lo = [], 0
    while lo < n:
        hi = int(np.searchsorted(cost, cost[lo] + limit, side="right")) - 1
        hi = min(max(hi, lo + 1), n)
        bounds.append((lo, hi))
        lo = hi
    return bounds


@nb.njit(cache=True, nogil=True)
def bucket_in_edges(indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int,
                    segment_rows: int, num_segments: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The in-edges of destinations lo..hi-1 grouped by the segment of their source:
    (sources, destinations - lo, starts) with segment k's edges at starts[k]:starts[k+1],
    in destination order inside each segment (a counting sort)."""
    starts = np.zeros(num_segments + 1, np.int64)
    for e in range(indptr[lo], indptr[hi]):
        starts[indices[e] // segment_rows + 1] += 1
    for k in range(num_segments):
        starts[k + 1] += starts[k]
    fill = starts[:-1].copy()
    count = indptr[hi] - indptr[lo]
    sources, dests = np.empty(count, np.int64), np.empty(count, np.int32)
    for v in range(lo, hi):
        for e in range(indptr[v], indptr[v + 1]):
            src = indices[e]
            k = src // segment_rows
            sources[fill[k]] = src
            dests[fill[k]] = v - lo
            fill[k] += 1
    return sources, dests, starts


@nb.njit(cache=True, nogil=True)
def add_rows(sums: np.ndarray, rows: np.ndarray, first_row: int, sources: np.ndarray,
             dests: np.ndarray, a: int, b: int) -> None:
    """sums[dests[e]] += rows[sources[e] - first_row] for the edges a..b-1."""
    width = rows.shape[1]
    for e in range(a, b):
        r, d = sources[e] - first_row, dests[e]
        for j in range(width):
            sums[d, j] += rows[r, j]


def neighbour_sums(source: Rows, indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int,
                   num_nodes: int) -> np.ndarray:
    """The float32 sums of the in-neighbours' rows of destinations lo..hi-1, from one
    sequential pass over the rows of `source`."""
    segment_rows = max(SEGMENT_BYTES // (source.dim * 4), 1)
    num_segments = -(-num_nodes // segment_rows)
    sources, dests, starts = bucket_in_edges(indptr, indices, lo, hi, segment_rows, num_segments)
    sums = np.zeros((hi - lo, source.dim), np.float32)
    for k in range(num_segments):
        a, b = int(starts[k]), int(starts[k + 1])
        if a == b:
            continue
        first = k * segment_rows
        rows = source.read(np.arange(first, min(first + segment_rows, num_nodes), dtype=np.int64))
        add_rows(sums, rows.numpy(), first, sources, dests, a, b)
    return sums


def mean_block(count: int) -> dgl.DGLGraph:
    """A block of `count` destinations whose sources are the destinations themselves and
    then one source per destination (its neighbours' mean), joined by one edge each."""
    dst = torch.arange(count)
    return dgl.create_block((dst + count, dst), num_src_nodes=2 * count, num_dst_nodes=count)


def mean_layer_chunks(model: nn.Module, i: int, source: Rows, indptr: np.ndarray,
                      indices: np.ndarray, budget: int, chunk_rows: int) -> Iterator[torch.Tensor]:
    """Layer i's output rows in store order, for a layer whose neighbour input is the mean
    of its in-neighbours' rows, in chunks of at most `chunk_rows` destinations."""
    num_nodes = len(indptr) - 1
    degree = np.diff(np.asarray(indptr, np.int64)).astype(np.float32)
    for lo, hi in sum_ranges(indptr, source.dim, budget):
        sums = neighbour_sums(source, indptr, indices, lo, hi, num_nodes)
        for c in range(lo, hi, chunk_rows):
            d = min(c + chunk_rows, hi)
            means = sums[c - lo:d - lo] / np.maximum(degree[c:d], 1)[:, None]  # no in-edges: 0
            own = source.read(np.arange(c, d, dtype=np.int64))
            yield model.layer(i, mean_block(d - c), torch.cat([own, torch.from_numpy(means)]))
