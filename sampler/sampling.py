"""Uniform neighbour sampling without replacement on a CSC graph, and layer-neighbour
sampling (LABOR), in numba.

Randomness is counter-based: every (seed, mini-batch, layer, node) has its own stream, so
the result does not depend on thread count or schedule, and one mini-batch can be
re-sampled on its own. Sampling is parallel over destination nodes; relabelling (dedup
into block-local IDs) is parallel over mini-batches, each with a hash table sized by its
sample or the graph, whichever is smaller (DGL's fused sampler keeps a node-sized map per
thread instead: 0.4 GiB per thread at 10^8 nodes).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

from gnnssd.storage_format import ONE_RELATION, sampling_method

from .blocks import MFGs
from .fanouts import relation_array

#: One hop's (ptr, sampled node IDs, their relations).
_Hop = tuple[np.ndarray, np.ndarray, np.ndarray]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_FLOYD_MAX = 32  # above this fanout, reservoir sampling (O(degree)) beats Floyd (O(k^2))
_TASKS_PER_THREAD = 4  # LABOR's hop: parts of a layer per thread, so that uneven parts even out
#: LABOR's hop: in-edges a thread is worth (~0.3 ms of hashing): a layer with fewer runs on
#: fewer threads, since waking and joining a thread costs more than it saves (on a busy
#: machine, a wait for a time slice).
_EDGES_PER_THREAD = 1 << 18
#: LABOR's hop: destinations ahead of the one scanned whose in-edge run (its first
#: _PREFETCH_EDGES), and twice as many whose indptr entry, are prefetched: the destinations
#: of a layer lie anywhere in the graph, so each run starts at a cache miss, and a run of a
#: few cache lines ends before the CPU's own prefetcher has caught on (the whole run ahead
#: scanned 10% faster than its first two lines; docs/BENCHMARKS.md, issue 49's seventh look).
_PREFETCH_AHEAD = 8
_PREFETCH_EDGES = 512


@intrinsic
def _prefetch(typingctx, array, index):
    """Ask the CPU to bring array[index]'s cache line in (LLVM's prefetch: a hint, never a
    fault, so an index past the end is harmless)."""
    sig = types.void(array, types.intp)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        byte_pointer = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32]), "llvm.prefetch.p0i8")
        # read, keep in every cache level, data (not instructions)
        builder.call(prefetch, [builder.bitcast(builder.gep(data, [args[1]]), byte_pointer), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(inline="always")
def _mix(x):
    """splitmix64 finaliser: a bijective 64-bit hash."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@nb.njit(inline="always")
def _prefix(seed, batch, layer):
    """What _stream(seed, batch, layer, node) hashes before the node: per-edge loops
    compute it once per destination (LABOR's variates: one mix an edge, not four)."""
    h = _mix(np.uint64(seed) + _GOLDEN)
    h = _mix(h ^ np.uint64(batch))
    return _mix(h ^ np.uint64(layer))


@nb.njit(inline="always")
def _stream(seed, batch, layer, node):
    return _mix(_prefix(seed, batch, layer) ^ np.uint64(node))


@nb.njit(inline="always")
def _below(state, j, n):
    """Draw number j of stream `state`, uniform in [0, n) (n < 2**32)."""
    r = _mix(state + np.uint64(j) * _GOLDEN)
    return np.int64(((r >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32))


@nb.njit(cache=True, nogil=True)
def _kept_neighbours(indices, start, d, keys, lo, hi, base, out):
    """indices[start:start+d] without the sources u whose key base + u is in keys[lo:hi]
    (both sorted), written to out when it is not empty; returns how many are kept."""
    j, c = lo, 0
    for e in range(start, start + d):
        key = base + indices[e]
        while j < hi and keys[j] < key:
            j += 1
        if j < hi and keys[j] == key:
            continue
        if out.shape[0]:
            out[c] = indices[e]
        c += 1
    return c


@nb.njit(inline="always")
def _exclusion_range(ex_ptr, ex_keys, local, base, num_nodes):
    """[lo, hi) of ex_keys: the excluded keys of mini-batch `local` that fall on destination
    base // num_nodes (keys base + u, u a source)."""
    a, z = ex_ptr[local], ex_ptr[local + 1]
    return a + np.searchsorted(ex_keys[a:z], base), a + np.searchsorted(ex_keys[a:z], base + num_nodes)


@nb.njit(inline="always")
def _run_offsets(take):
    """Where each (destination, relation) run of samples starts in the flat output, and the
    total last: the prefix sums of take (n, relations) in row order."""
    n, num_rel = take.shape
    flat = np.empty(n * num_rel + 1, np.int64)
    flat[0] = 0
    for i in range(n):
        for r in range(num_rel):
            flat[i * num_rel + r + 1] = flat[i * num_rel + r] + take[i, r]
    return flat


@nb.njit(parallel=True, cache=True, nogil=True)
def _sample_hop(indptr, indices, dst, dst_batch, fanout, seed, layer, dst_local, ex_ptr, ex_keys):
    """Sample in-neighbours of every node in `dst`; returns (ptr, sampled node IDs).

    Edges excluded per mini-batch: node i's in-edge u -> dst[i] is never sampled when
    dst[i] * num_nodes + u is among ex_keys[ex_ptr[b]:ex_ptr[b+1]] (sorted), b = dst_local[i]."""
    n = dst.shape[0]
    num_nodes = indptr.shape[0] - 1
    excluding = ex_keys.shape[0] > 0
    none = np.empty(0, indices.dtype)
    avail = np.empty(n, np.int64)
    ex_lo = np.zeros(n, np.int64)
    ex_hi = np.zeros(n, np.int64)
    for i in nb.prange(n):
        v = dst[i]
        d = indptr[v + 1] - indptr[v]
        if excluding:
            base = np.int64(v) * num_nodes
            ex_lo[i], ex_hi[i] = _exclusion_range(ex_ptr, ex_keys, dst_local[i], base, num_nodes)
            if ex_hi[i] > ex_lo[i]:
                d = _kept_neighbours(indices, indptr[v], d, ex_keys, ex_lo[i], ex_hi[i], base, none)
        avail[i] = d
    ptr = np.empty(n + 1, np.int64)
    ptr[0] = 0
    for i in range(n):
        d = avail[i]
        ptr[i + 1] = ptr[i] + (d if fanout < 0 or fanout >= d else fanout)
    out = np.empty(ptr[n], np.int64)
    for i in nb.prange(n):
        v = dst[i]
        cand = indices
        start = indptr[v]
        d = avail[i]
        if ex_hi[i] > ex_lo[i]:  # sample from the neighbours left after the exclusion
            cand = np.empty(d, indices.dtype)
            _kept_neighbours(indices, start, indptr[v + 1] - start, ex_keys, ex_lo[i], ex_hi[i],
                             np.int64(v) * num_nodes, cand)
            start = 0
        o = ptr[i]
        k = ptr[i + 1] - o
        if k == d:
            for j in range(d):
                out[o + j] = cand[start + j]
            continue
        _draw_positions(_stream(seed, dst_batch[i], layer, v), d, k, out, o)
        for j in range(o, o + k):
            out[j] = cand[start + out[j]]
    return ptr, out


@nb.njit(inline="always")
def _draw_positions(state, d, k, out, o):
    """k distinct positions in [0, d) drawn from stream `state`, into out[o:o+k]."""
    if k <= _FLOYD_MAX:  # Floyd's algorithm: k draws, each position chosen once
        for j in range(d - k, d):
            t = _below(state, j, j + 1)
            q = o + j - (d - k)
            for s in range(o, q):
                if out[s] == t:
                    t = j
                    break
            out[q] = t
    else:  # reservoir sampling (algorithm R)
        for j in range(k):
            out[o + j] = j
        for j in range(k, d):
            t = _below(state, j, j + 1)
            if t < k:
                out[o + t] = j


@nb.njit(parallel=True, cache=True, nogil=True)
def _sample_hop_typed(indptr, indices, etypes, dst, dst_batch, fanouts, seed, layer, dst_local, ex_ptr, ex_keys):
    """Per relation r, up to fanouts[r] in-neighbours of every node in `dst` over the
    edges of relation r (a node's in-edges are grouped by relation: etypes, sorted within
    each node); returns (ptr, sampled node IDs, their relations). Relation r of node v
    draws from its own stream, so fanouts of other relations do not change its sample.
    Excluded edges as in _sample_hop (a pair's key holds no relation: excluded in every one)."""
    n = dst.shape[0]
    num_nodes = indptr.shape[0] - 1
    num_rel = fanouts.shape[0]
    excluding = ex_keys.shape[0] > 0
    none = np.empty(0, indices.dtype)
    runs = np.empty((n, num_rel + 1), np.int64)
    avail = np.empty((n, num_rel), np.int64)
    take = np.empty((n, num_rel), np.int64)
    ex_lo = np.zeros(n, np.int64)
    ex_hi = np.zeros(n, np.int64)
    for i in nb.prange(n):
        v = dst[i]
        a, b = indptr[v], indptr[v + 1]
        if excluding:
            ex_lo[i], ex_hi[i] = _exclusion_range(ex_ptr, ex_keys, dst_local[i], np.int64(v) * num_nodes, num_nodes)
        for r in range(num_rel + 1):
            runs[i, r] = a + np.searchsorted(etypes[a:b], r)
        for r in range(num_rel):
            d = runs[i, r + 1] - runs[i, r]
            if ex_hi[i] > ex_lo[i]:
                d = _kept_neighbours(indices, runs[i, r], d, ex_keys, ex_lo[i], ex_hi[i],
                                     np.int64(v) * num_nodes, none)
            avail[i, r] = d
            f = fanouts[r]
            take[i, r] = d if f < 0 or f >= d else f
    flat = _run_offsets(take)
    out = np.empty(flat[n * num_rel], np.int64)
    out_rel = np.empty(flat[n * num_rel], etypes.dtype)
    for i in nb.prange(n):
        v = dst[i]
        base = _stream(seed, dst_batch[i], layer, v)
        for r in range(num_rel):
            o = flat[i * num_rel + r]
            k, start, d = take[i, r], runs[i, r], avail[i, r]
            cand = indices
            if ex_hi[i] > ex_lo[i]:  # sample from the relation's neighbours left after the exclusion
                cand = np.empty(d, indices.dtype)
                _kept_neighbours(indices, start, runs[i, r + 1] - start, ex_keys, ex_lo[i], ex_hi[i],
                                 np.int64(v) * num_nodes, cand)
                start = 0
            if k < d:
                _draw_positions(_mix(base ^ np.uint64(r + 1)), d, k, out, o)
            else:
                for j in range(k):
                    out[o + j] = j
            for j in range(o, o + k):
                out[j] = cand[start + out[j]]
                out_rel[j] = r
    return flat[::num_rel].copy(), out, out_rel


@nb.njit(inline="always")
def _variate(prefix, node):
    """LABOR's variate of source `node` from the _prefix of its (seed, mini-batch, layer)."""
    return np.float64(_mix(prefix ^ np.uint64(node)) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@nb.njit(inline="always")
def _uniform01(seed, batch, layer, node):
    """LABOR's variate r_u of source `node`: uniform in [0, 1), one per (seed, mini-batch,
    layer, node), shared by every destination that node is a neighbour of."""
    return _variate(_prefix(seed, batch, layer), node)


@nb.njit(inline="always")
def _variate_bound(threshold):
    """The largest 53-bit integer m with m / 2**53 <= threshold (threshold in [0, 1]): the
    variate r_u = (h >> 11) / 2**53 of _variate is <= threshold iff h >> 11 <= this bound
    (both sides exact in float64), so the per-edge test needs no float conversion."""
    return np.uint64(np.floor(threshold * 9007199254740992.0))


@nb.njit(inline="always")
def _labor_keep(indices, start, d, keys, lo, hi, base, prefix, threshold, out, o):
    """The sources u of indices[start:start+d] (less excluded keys base + u in keys[lo:hi])
    with r_u <= threshold (r_u: _variate(prefix, u)), written in order to out[o:] when out
    is not empty; returns how many.

    Without an exclusion, a run at or under the fanout (threshold 1) is copied unhashed,
    and a longer one is tested 64 edges at a time: the tests of a block fill one 64-bit
    mask (no branch an edge: the block's hashes pipeline), whose set bits,
    fanout / degree of them on average, are then copied out. Inlined into the hop kernel:
    a call a destination cost ~10% of it."""
    writing = out.shape[0] > 0
    if hi == lo and threshold >= 1.0:
        if writing:
            out[o:o + d] = indices[start:start + d]
        return d
    c = 0
    bound = _variate_bound(threshold)
    if hi == lo:
        for s in range(start, start + d, 64):
            mask = np.uint64(0)
            for k in range(min(64, start + d - s)):
                kept = (_mix(prefix ^ np.uint64(indices[s + k])) >> np.uint64(11)) <= bound
                mask |= np.uint64(kept) << np.uint64(k)
            while mask:
                if writing:
                    out[o + c] = indices[s + trailing_zeros(mask)]
                c += 1
                mask &= mask - np.uint64(1)
        return c
    j = lo
    for p in range(start, start + d):
        u = indices[p]
        key = base + u
        while j < hi and keys[j] < key:
            j += 1
        if j < hi and keys[j] == key:
            continue
        if threshold < 1.0 and _mix(prefix ^ np.uint64(u)) >> np.uint64(11) > bound:
            continue
        if writing:
            out[o + c] = u
        c += 1
    return c


@nb.njit(cache=True, nogil=True)
def _edge_ends(indptr, dst):
    """The in-edges of dst[:i] for i in 0..n (n + 1 values, the last their total): where
    dst[i]'s part of LABOR's scratch starts, and what its threads are counted by."""
    n = dst.shape[0]
    edge_end = np.empty(n + 1, np.int64)
    edge_end[0] = 0
    for i in range(n):
        edge_end[i + 1] = edge_end[i] + indptr[dst[i] + 1] - indptr[dst[i]]
    return edge_end


@nb.njit(parallel=True, cache=True, nogil=True)
def _sample_hop_labor(indptr, indices, etypes, dst, dst_batch, fanouts, seed, layer, dst_local, ex_ptr, ex_keys,
                      edge_end, tasks):
    """Layer-neighbour sampling (LABOR-0, Balin & Catalyurek 2023; DGL's LaborSampler with
    importance_sampling=0): the in-edge u -> v of relation r is kept iff r_u <= k_r / d_r(v),
    k_r the relation's fanout (-1: all) and d_r(v) v's in-degree in it after the
    exclusion; each destination keeps k_r edges on average, and destinations that share a
    source share its variate, so fewer distinct sources are drawn than by independent
    uniform samples. A homogeneous graph is one relation (etypes empty). Returns (ptr,
    sampled node IDs, their relations: empty for one relation, as etypes). `edge_end`:
    _edge_ends(indptr, dst), which the caller counts threads by.

    One parallel loop, over `tasks` runs of consecutive destinations with about equal
    in-edges (_TASKS_PER_THREAD a thread, as the caller counts threads): each in-edge's
    variate is hashed once, and a task writes its kept sources compactly
    into its own part of a scratch array (the part its in-edges would fill, so no bound is
    needed beforehand); the tasks' parts are then concatenated. A parallel loop's start
    and end cost more than the loop on a busy machine, hence one. The destinations' runs
    start anywhere in `indices`, each at a cache miss: the runs _PREFETCH_AHEAD ahead are
    prefetched while one is scanned. (A table of every node's variate, hashed once a
    layer, looked up instead of hashed per in-edge, was 9-13% slower with the runs
    prefetched: the scan waits on memory, not on the hash.)"""
    n = dst.shape[0]
    num_nodes = indptr.shape[0] - 1
    num_rel = fanouts.shape[0]
    typed = etypes.shape[0] > 0
    no_output = np.empty(0, indices.dtype)
    line = max(1, 64 // indices.itemsize)  # in-edges a cache line
    total = edge_end[n]
    tasks = max(1, min(n, tasks))
    bounds = np.searchsorted(edge_end, np.arange(tasks + 1) * total // tasks)  # task t: dst[bounds[t]:bounds[t+1]]
    bounds[0], bounds[tasks] = 0, n
    scratch = np.empty(total, indices.dtype)
    take = np.empty((n, num_rel), np.int64)
    for t in nb.prange(tasks):
        o = edge_end[bounds[t]]
        for i in range(bounds[t], bounds[t + 1]):
            if i + 2 * _PREFETCH_AHEAD < n:
                _prefetch(indptr, dst[i + 2 * _PREFETCH_AHEAD])
            if i + _PREFETCH_AHEAD < n:
                w = dst[i + _PREFETCH_AHEAD]
                for p in range(indptr[w], min(indptr[w + 1], indptr[w] + _PREFETCH_EDGES), line):
                    _prefetch(indices, p)
            v = dst[i]
            a, b = indptr[v], indptr[v + 1]
            base = np.int64(v) * num_nodes
            prefix = _prefix(seed, dst_batch[i], layer)
            ex_lo = ex_hi = np.int64(0)
            if ex_keys.shape[0] > 0:
                ex_lo, ex_hi = _exclusion_range(ex_ptr, ex_keys, dst_local[i], base, num_nodes)
            run = a
            for r in range(num_rel):
                end = (a + np.searchsorted(etypes[a:b], r + 1)) if typed else b
                d = end - run
                if ex_hi > ex_lo:  # the relation's in-degree after the exclusion
                    d = _labor_keep(indices, run, d, ex_keys, ex_lo, ex_hi, base, prefix, 1.0, no_output, 0)
                f = fanouts[r]
                c = _labor_keep(indices, run, end - run, ex_keys, ex_lo, ex_hi, base, prefix,
                                1.0 if f < 0 or f >= d else f / d, scratch, o)
                take[i, r] = c
                o += c
                run = end
    flat = _run_offsets(take)
    out = np.empty(flat[n * num_rel], np.int64)
    out_rel = np.empty(flat[n * num_rel] if typed else 0, etypes.dtype)
    for t in range(tasks):
        first, last, part = flat[bounds[t] * num_rel], flat[bounds[t + 1] * num_rel], edge_end[bounds[t]]
        out[first:last] = scratch[part:part + last - first]
    if typed:  # run (i, r) of the output holds relation r
        for i in range(n):
            for r in range(num_rel):
                out_rel[flat[i * num_rel + r]:flat[i * num_rel + r + 1]] = r
    return flat[::num_rel].copy(), out, out_rel


@nb.njit(inline="always")
def _slot(table, node, mask):
    """The slot of `node` in an open-addressing table (linear probing): its own, or the
    empty one (-1) where it belongs."""
    h = np.int64(((np.uint64(node) * _GOLDEN) >> np.uint64(20)) & np.uint64(mask))
    while table[h] != -1 and table[h] != node:
        h = (h + 1) & mask
    return h


@nb.njit(cache=True, nogil=True)
def _first_bad_destination(indptr, num_edges, dst):
    """Index i of the first dst[i] that is not a node, or whose indptr range is not within
    0..num_edges in order; -1 if none. Run before _sample_hop indexes with them."""
    num_nodes = indptr.shape[0] - 1
    for i in range(dst.shape[0]):
        v = dst[i]
        if v < 0 or v >= num_nodes or indptr[v] < 0 or indptr[v] > indptr[v + 1] or indptr[v + 1] > num_edges:
            return i
    return -1


@nb.njit(cache=True, nogil=True)
def _first_out_of_range(values, n):
    """Index of the first value outside 0..n-1, -1 if none. Run on sampled sources before
    they become node IDs of a block."""
    for i in range(values.shape[0]):
        if values[i] < 0 or values[i] >= n:
            return i
    return -1


def _check_destinations(indptr: np.ndarray, indices: np.ndarray, dst: np.ndarray) -> None:
    bad = _first_bad_destination(indptr, indices.shape[0], dst)
    if bad < 0:
        return
    v, n = int(dst[bad]), len(indptr) - 1
    if not 0 <= v < n:
        raise IndexError(f"node {v}: not a node of the graph (0..{n - 1})")
    raise IndexError(f"node {v}: indptr gives its in-edges as {int(indptr[v])}..{int(indptr[v + 1])}, "
                     f"outside 0..{len(indices)} or reversed; the topology is invalid "
                     "(`gnnssd verify` names the file)")


def _check_sources(nbrs: np.ndarray, num_nodes: int) -> None:
    bad = _first_out_of_range(nbrs, num_nodes)
    if bad >= 0:
        raise IndexError(f"sampled in-neighbour {int(nbrs[bad])}: not a node of the graph "
                         f"(0..{num_nodes - 1}); the topology is invalid (`gnnssd verify` names "
                         "the file)")


@nb.njit(parallel=True, cache=True, nogil=True)
def _relabel(nodes, node_ptr, eptr, nbrs, num_nodes):
    """Per mini-batch: append new sampled nodes after the current ones, local edge IDs.

    Dedup uses a hash table per mini-batch sized by what it can hold (not a node-sized map
    per thread: memory grows with the sample, not with threads x graph size): at most its
    destinations and sampled edges, and at most the graph's `num_nodes` distinct IDs. The
    second bound matters on a small dense graph, where the edges' bound is many times the
    nodes (tolokers' input layer: a 2^18-slot table, 3 MiB allocated and faulted in per
    call, for 11,758 nodes; sized by the nodes, 2^15 slots stay in cache: 3-4x faster).
    Returns (new node_ptr, new nodes, local edge src, local edge dst)."""
    nbatch = node_ptr.shape[0] - 1
    ub = np.empty(nbatch + 1, np.int64)
    ub[0] = 0
    for b in range(nbatch):
        ub[b + 1] = ub[b] + (node_ptr[b + 1] - node_ptr[b]) + (eptr[node_ptr[b + 1]] - eptr[node_ptr[b]])
    scratch = np.empty(ub[nbatch], np.int64)
    counts = np.empty(nbatch, np.int64)
    esrc = np.empty(nbrs.shape[0], np.int32)
    edst = np.empty(nbrs.shape[0], np.int32)
    for b in nb.prange(nbatch):
        cap = 16
        while cap < 2 * min(ub[b + 1] - ub[b], num_nodes):
            cap *= 2
        table = np.full(cap, -1, np.int64)
        local = np.empty(cap, np.int32)
        mask = cap - 1
        base = ub[b]
        n = 0
        for i in range(node_ptr[b], node_ptr[b + 1]):
            h = _slot(table, nodes[i], mask)
            table[h] = nodes[i]
            local[h] = n
            scratch[base + n] = nodes[i]
            n += 1
        for i in range(node_ptr[b], node_ptr[b + 1]):
            for e in range(eptr[i], eptr[i + 1]):
                u = nbrs[e]
                h = _slot(table, u, mask)
                if table[h] == -1:
                    table[h] = u
                    local[h] = n
                    scratch[base + n] = u
                    n += 1
                esrc[e] = local[h]
                edst[e] = i - node_ptr[b]
        counts[b] = n
    new_ptr = np.empty(nbatch + 1, np.int64)
    new_ptr[0] = 0
    for b in range(nbatch):
        new_ptr[b + 1] = new_ptr[b] + counts[b]
    new_nodes = np.empty(new_ptr[nbatch], np.int64)
    for b in nb.prange(nbatch):
        new_nodes[new_ptr[b] : new_ptr[b + 1]] = scratch[ub[b] : ub[b] + counts[b]]
    return new_ptr, new_nodes, esrc, edst


def relabel_layer(nodes: np.ndarray, node_ptr: np.ndarray, eptr: np.ndarray, nbrs: np.ndarray,
                  num_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """_relabel (node IDs below `num_nodes`, the graph's) on at most a thread per
    mini-batch: its parallel loop is over them, so for one (memory mode samples a
    mini-batch at a time) a second thread would be woken only to wait at its end."""
    with _on_threads(min(len(node_ptr) - 1, nb.get_num_threads())):
        return _relabel(nodes, node_ptr, eptr, nbrs, num_nodes)


def exclusion_keys(exclude: Sequence[np.ndarray] | None, num_nodes: int,
                   nbatch: int) -> tuple[np.ndarray, np.ndarray]:
    """Per mini-batch, the sorted keys dst * num_nodes + src of its excluded in-edges: each
    listed pair (u, v) in both directions, u -> v and v -> u (DGL's exclude="reverse_id")."""
    if exclude is None:
        return np.zeros(nbatch + 1, np.int64), np.empty(0, np.int64)
    if len(exclude) != nbatch:
        raise ValueError(f"exclude lists {len(exclude)} edge sets for {nbatch} mini-batches")
    keys = []
    for pairs in exclude:
        pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
        u, v = pairs[:, 0], pairs[:, 1]
        keys.append(np.unique(np.concatenate([v * num_nodes + u, u * num_nodes + v])))
    ptr = np.zeros(nbatch + 1, np.int64)
    np.cumsum([len(k) for k in keys], out=ptr[1:])
    return ptr, np.concatenate(keys) if keys else np.empty(0, np.int64)


@nb.njit(cache=True)
def _find_in_edges(indptr, indices, dst, src, out):
    """out[:count] = CSC positions of the in-edges src[i] -> dst[i] present in the graph."""
    count = 0
    for i in range(dst.shape[0]):
        lo, hi = indptr[dst[i]], indptr[dst[i] + 1]
        at = lo + np.searchsorted(indices[lo:hi], src[i])
        if at < hi and indices[at] == src[i]:
            out[count] = at
            count += 1
    return count


def csc_edge_ids(indptr: np.ndarray, indices: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Edge IDs (CSC positions: the IDs of a DGL graph built from this CSC) of the pairs
    (u, v) and (v, u) that are in the graph: what exclusion_keys excludes, for DGL's
    `exclude_eids`."""
    n = len(indptr) - 1
    _, keys = exclusion_keys([pairs], n, 1)  # dst * n + src, both directions
    out = np.empty(len(keys), np.int64)
    dst = keys // n
    _check_destinations(np.asarray(indptr), np.asarray(indices), dst)
    count = _find_in_edges(np.asarray(indptr), np.asarray(indices), dst,
                           (keys % n).astype(indices.dtype), out)
    return out[:count]


class NeighborSampler:
    """Samples the blocks of many mini-batches at once on one CSC graph.

    fanouts[i] is the fanout of block i (input layer first, as in DGL); -1 takes all
    in-neighbours: the (layers, relations) array of a store's `Fanouts` (sampler.fanouts),
    or per layer one number (every relation) or one per relation. Holds nothing node-sized
    besides the graph it is given.

    `etypes` is the relation of every edge (see storage_format.schema); empty, its default
    (`ONE_RELATION`), for a graph of one relation. A typed graph (etypes not empty) takes a
    fanout per relation: fanouts[i] is then an (R,) array (one number: all relations), and
    the blocks record each edge's relation (`MFGs.edge_type`, empty for one relation). The
    hop kernel is chosen here, once: one relation takes `_sample_hop`, which skips the
    per-relation runs (the same draws as before the typed kernel existed, and faster).
    `feature_rows`: nodes 0..feature_rows-1 have feature rows (the blocks' `input_rows`);
    default all.

    `method`: "uniform" (each destination draws min(fanout, degree) in-neighbours without
    replacement) or "labor" (layer-neighbour sampling, `_sample_hop_labor`: fanout
    in-neighbours on average, fewer distinct sources per layer).
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, fanouts: Sequence[Any],
                 etypes: np.ndarray = ONE_RELATION, num_relations: int = 1, feature_rows: int = -1,
                 method: str = "uniform"):
        self.method = sampling_method(method)
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(indices)
        self.etypes = np.ascontiguousarray(etypes)
        self.feature_rows = int(feature_rows)
        self._hop = (self._labor_hop if self.method == "labor" else
                     self._typed_hop if len(self.etypes) else self._one_relation_hop)
        array = relation_array(fanouts, num_relations)  # (layers, relations)
        self.fanouts = tuple(array) if len(self.etypes) else tuple(array[:, 0].tolist())

    def sample(self, seeds: np.ndarray, seed: int, batch_id: int = 0,
               exclude: np.ndarray | None = None) -> MFGs:
        """Blocks of one mini-batch; `seeds` must be unique; `exclude`: see sample_many."""
        ex = None if exclude is None else [exclude]
        return self.sample_many(seeds, np.array([0, len(seeds)]), seed, batch_id, ex)[0]

    def sample_many(self, seeds: np.ndarray, batch_ptr: np.ndarray, seed: int, first_batch_id: int = 0,
                    exclude: Sequence[np.ndarray] | None = None) -> list[MFGs]:
        """Blocks of the mini-batches seeds[batch_ptr[b]:batch_ptr[b+1]], IDs first_batch_id + b.

        exclude[b], an (E, 2) array of (source, destination) pairs, lists edges mini-batch b
        must not sample in any layer (with their reverses: link prediction's own edges)."""
        seed = int(seed) & 0x7FFFFFFFFFFFFFFF
        nodes = np.ascontiguousarray(seeds, dtype=np.int64)
        node_ptr = np.asarray(batch_ptr, dtype=np.int64)
        nbatch = len(node_ptr) - 1
        batch_ids = np.arange(first_batch_id, first_batch_id + nbatch, dtype=np.int64)
        ex_ptr, ex_keys = exclusion_keys(exclude, len(self.indptr) - 1, nbatch)
        hops = []  # output layer first
        for layer in reversed(range(len(self.fanouts))):
            counts = np.diff(node_ptr)
            dst_batch = np.repeat(batch_ids, counts)
            dst_local = np.repeat(np.arange(nbatch, dtype=np.int64), counts)
            _check_destinations(self.indptr, self.indices, nodes)
            eptr, nbrs, rels = self._hop(nodes, dst_batch, self.fanouts[layer], seed, layer, dst_local, ex_ptr, ex_keys)
            _check_sources(nbrs, len(self.indptr) - 1)
            new_ptr, new_nodes, esrc, edst = relabel_layer(nodes, node_ptr, eptr, nbrs, len(self.indptr) - 1)
            hops.append((node_ptr, new_ptr, eptr[node_ptr], esrc, edst, rels))
            nodes, node_ptr = new_nodes, new_ptr
        hops.reverse()
        out = []
        for b in range(nbatch):
            edges = [(esrc[e[b] : e[b + 1]], edst[e[b] : e[b + 1]]) for _, _, e, esrc, edst, _ in hops]
            out.append(
                MFGs(
                    nodes=nodes[node_ptr[b] : node_ptr[b + 1]].copy(),
                    num_src=np.array([sp[b + 1] - sp[b] for _, sp, _, _, _, _ in hops], np.int64),
                    num_dst=np.array([dp[b + 1] - dp[b] for dp, _, _, _, _, _ in hops], np.int64),
                    edge_ptr=np.concatenate([[0], np.cumsum([len(s) for s, _ in edges])]).astype(np.int64),
                    edge_src=np.concatenate([s for s, _ in edges]),
                    edge_dst=np.concatenate([d for _, d in edges]),
                    edge_type=np.concatenate([rels[e[b] : e[b + 1]] for _, _, e, _, _, rels in hops]),
                    feature_rows=self.feature_rows,
                )
            )
        return out

    # The hop kernels, each (ptr, sampled node IDs, their relations) of one layer's
    # destinations `nodes`; sample_many calls the one chosen at construction.

    def _one_relation_hop(self, nodes: np.ndarray, dst_batch: np.ndarray, fanout: Any, seed: int, layer: int,
                          dst_local: np.ndarray, ex_ptr: np.ndarray, ex_keys: np.ndarray) -> _Hop:
        eptr, nbrs = _sample_hop(self.indptr, self.indices, nodes, dst_batch, fanout, seed, layer, dst_local,
                                 ex_ptr, ex_keys)
        return eptr, nbrs, ONE_RELATION

    def _typed_hop(self, nodes: np.ndarray, dst_batch: np.ndarray, fanout: Any, seed: int, layer: int,
                   dst_local: np.ndarray, ex_ptr: np.ndarray, ex_keys: np.ndarray) -> _Hop:
        return _sample_hop_typed(self.indptr, self.indices, self.etypes, nodes, dst_batch, fanout, seed, layer,
                                 dst_local, ex_ptr, ex_keys)

    def _labor_hop(self, nodes: np.ndarray, dst_batch: np.ndarray, fanout: Any, seed: int, layer: int,
                   dst_local: np.ndarray, ex_ptr: np.ndarray, ex_keys: np.ndarray) -> _Hop:
        edge_end = _edge_ends(self.indptr, nodes)
        threads = max(1, min(nb.get_num_threads(), int(edge_end[-1]) // _EDGES_PER_THREAD))
        with _on_threads(threads):
            return _sample_hop_labor(self.indptr, self.indices, self.etypes, nodes, dst_batch,
                                     np.atleast_1d(np.asarray(fanout, np.int64)), seed, layer, dst_local, ex_ptr,
                                     ex_keys, edge_end, _TASKS_PER_THREAD * threads)


@contextmanager
def _on_threads(count: int) -> Iterator[None]:
    """Run this thread's numba parallel loops on `count` threads meanwhile (numba's setting
    is per calling thread): 1 runs them in place, with no thread woken or joined."""
    previous = nb.get_num_threads()
    nb.set_num_threads(max(1, count))
    try:
        yield
    finally:
        nb.set_num_threads(previous)
