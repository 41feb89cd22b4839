"""Neighbour sampling on a CSC held as torch tensors, on whatever device holds them.

`features: device` keeps the whole graph on the loader's device (a GPU, where DGL's PyPI
build cannot sample), so the blocks are drawn there with plain torch ops, vectorised over
all candidate edges of a layer (no loop per node), and come out as the compiler's
`CSCBlock`s. The same code runs on CPU tensors, which is how it is tested.

Its randomness is the numba sampler's (gnnssd.sampler.sampling): counter-based streams per
(seed, mini-batch, layer, node) from the same splitmix64 hash, written here in int64 torch
ops, so a draw depends on nothing but those four numbers. LABOR draws each source's
variate r_u, and uniform sampling without replacement runs Floyd's algorithm as the numba
sampler does (one step for all nodes at a time), so their blocks are the numba sampler's,
edge for edge; above a fanout of 32, where the numba sampler turns to reservoir sampling,
a node keeps the `fanout` in-edges of smallest random keys (the same distribution, not
the same edges). Uniform sampling touches only the sampled edges, LABOR every in-edge of
a layer's nodes (as the numba sampler does). Sources
are numbered as the numba sampler numbers them: a block's destinations first, then new
sources in order of first appearance, edges in CSC order, so with fanout -1 the blocks are
identical to its blocks.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from gnnssd.compiler import CSCBlock

_MASK64 = (1 << 64) - 1
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_GOLDEN = 0x9E3779B97F4A7C15
_FLOYD_MAX = 32  # the numba sampler's switch from Floyd's algorithm to reservoir sampling
#: What the numba sampler's `method`s mean here too.
TENSOR_METHODS = ("uniform", "labor")


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 torch holds it."""
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


def _mix_int(x: int) -> int:
    """splitmix64's finaliser on a Python int (the numba sampler's _mix)."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return x ^ (x >> 31)


def _shr(t: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (t >> bits) & ((1 << (64 - bits)) - 1)


def _mix(t: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (multiplication wraps as uint64's does)."""
    t = (t ^ _shr(t, 30)) * _signed(_M1)
    t = (t ^ _shr(t, 27)) * _signed(_M2)
    return t ^ _shr(t, 31)


def streams(seed: int, batch: int, layer: int, nodes: torch.Tensor) -> torch.Tensor:
    """The numba sampler's _stream(seed, batch, layer, node) of every node, as int64 bit patterns."""
    h = _mix_int(_mix_int(_mix_int((seed & _MASK64) + _GOLDEN) ^ (batch & _MASK64)) ^ (layer & _MASK64))
    return _mix(nodes ^ _signed(h))


def labor_variates(seed: int, batch: int, layer: int, nodes: torch.Tensor) -> torch.Tensor:
    """LABOR's r_u of every node, uniform in [0, 1) (float64): the numba sampler's _uniform01."""
    return _shr(streams(seed, batch, layer, nodes), 11).to(torch.float64) * (1.0 / 9007199254740992.0)


class TensorSampler:
    """Blocks of one mini-batch at a time over a CSC (`indptr` int64, `indices` int32 or
    int64, both on one device): `fanouts[i]` is block i's fanout (input layer first, -1:
    every in-neighbour), `method` uniform or labor (see the module docstring)."""

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, fanouts: Sequence[int], method: str = "uniform"):
        if method not in TENSOR_METHODS:
            raise ValueError(f"method: {method!r}; expected one of {TENSOR_METHODS}")
        if indptr.dtype != torch.int64 or indptr.dim() != 1 or indices.dim() != 1:
            raise ValueError(f"a CSC of 1-D tensors with int64 indptr; got indptr {indptr.dtype} "
                             f"{tuple(indptr.shape)}, indices {tuple(indices.shape)}")
        self.fanouts = [int(f) for f in fanouts]
        if not self.fanouts or min(self.fanouts) < -1:
            raise ValueError(f"fanouts {self.fanouts}: expected -1 (all neighbours) or a count >= 0 per layer")
        self.indptr, self.indices, self.method = indptr, indices, method

    def sample(self, seeds: torch.Tensor, seed: int, batch_id: int = 0) -> tuple[torch.Tensor, list[CSCBlock]]:
        """(every node of the mini-batch, its blocks input layer first) for the unique
        `seeds` (int64 on the CSC's device): block i's sources are nodes[:num_src], its
        destinations nodes[:num_dst]; each block's edge_ids are the CSC positions of its edges."""
        seed = int(seed) & 0x7FFFFFFFFFFFFFFF  # as the numba sampler masks it
        nodes = seeds.to(torch.int64)
        blocks = []
        for layer in reversed(range(len(self.fanouts))):
            block, nodes = self._hop(nodes, self.fanouts[layer], seed, batch_id, layer)
            blocks.append(block)
        blocks.reverse()
        return nodes, blocks

    def _hop(self, dst: torch.Tensor, fanout: int, seed: int, batch_id: int,
             layer: int) -> tuple[CSCBlock, torch.Tensor]:
        """One layer: the in-edges sampled for every node of `dst`, as a block, and the
        nodes of the next layer (dst, then the new sources)."""
        start = self.indptr[dst]
        degree = self.indptr[dst + 1] - start
        if self.method == "labor" and fanout >= 0:
            owner, position = self._labor(dst, start, degree, fanout, seed, batch_id, layer)
        else:
            owner, position = self._uniform(dst, degree, fanout, seed, batch_id, layer)
        edge_ids = start[owner] + position
        local, nodes = _relabel(dst, self.indices[edge_ids].to(torch.int64))
        indptr = torch.zeros(dst.numel() + 1, dtype=torch.int64, device=dst.device)
        torch.cumsum(torch.bincount(owner, minlength=dst.numel()), 0, out=indptr[1:])
        return CSCBlock(indptr, local, nodes.numel(), dst.numel(), edge_ids), nodes

    def _uniform(self, dst: torch.Tensor, degree: torch.Tensor, fanout: int, seed: int, batch_id: int,
                 layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(destination index, position among its in-edges) of each sampled edge, grouped by
        destination: every in-edge of a node with at most `fanout` (in CSC order), else
        `fanout` distinct ones (_draw_positions)."""
        count = degree if fanout < 0 else degree.clamp(max=fanout)
        owner, position = _runs(count)
        heavy = torch.nonzero(degree > count).squeeze(1) if fanout >= 0 else owner[:0]
        if heavy.numel():
            drawn = _draw_positions(streams(seed, batch_id, layer, dst[heavy]), degree[heavy], fanout)
            first = torch.cumsum(count, 0) - count  # where each node's run starts
            position[(first[heavy].unsqueeze(1) + torch.arange(fanout, device=dst.device)).reshape(-1)] = \
                drawn.reshape(-1)
        return owner, position

    def _labor(self, dst: torch.Tensor, start: torch.Tensor, degree: torch.Tensor, fanout: int, seed: int,
               batch_id: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(destination index, position) of the in-edges u -> v with r_u <= fanout / degree(v)
        (all of them when degree <= fanout), in CSC order."""
        owner, position = _runs(degree)
        sources = self.indices[start[owner] + position].to(torch.int64)
        threshold = torch.where(degree > fanout, fanout / degree.clamp(min=1).to(torch.float64), 1.0)
        keep = labor_variates(seed, batch_id, layer, sources) <= threshold[owner]
        return owner[keep], position[keep]


def _runs(count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(i repeated count[i] times, 0..count[i]-1 for each i): one entry per edge of a layer."""
    total = int(count.sum())
    owner = torch.repeat_interleave(torch.arange(count.numel(), device=count.device), count, output_size=total)
    first = torch.cumsum(count, 0) - count
    return owner, torch.arange(total, device=count.device) - first[owner]


def _below(state: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """Draw j of each stream, uniform in [0, j] (the numba sampler's _below(state, j, j + 1))."""
    r = _mix(state + j * _signed(_GOLDEN))
    return _shr(_shr(r, 32) * (j + 1), 32)


def _draw_positions(state: torch.Tensor, degree: torch.Tensor, k: int) -> torch.Tensor:
    """k distinct positions in [0, degree) per node (rows; degree > k), drawn from its stream:
    Floyd's algorithm as the numba sampler runs it (the same positions in the same order)
    up to _FLOYD_MAX, one step for all nodes at a time; above it the k smallest of a random
    key per position (a uniform sample too, not the numba sampler's reservoir draws)."""
    if k <= _FLOYD_MAX:
        out = torch.empty(degree.numel(), k, dtype=torch.int64, device=degree.device)
        for q in range(k):
            j = degree - k + q
            t = _below(state, j)
            taken = (out[:, :q] == t.unsqueeze(1)).any(1)
            out[:, q] = torch.where(taken, j, t)
        return out
    owner, position = _runs(degree)
    keys = _shr(_mix(state[owner] + position * _signed(_GOLDEN)), 32)
    order = torch.argsort((owner << 32) | keys)  # by node, then key
    first = torch.cumsum(degree, 0) - degree
    rank = torch.arange(owner.numel(), device=degree.device) - first[owner[order]]
    return position[order[rank < k]].view(-1, k)


def _relabel(dst: torch.Tensor, sources: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(each source's block-local ID, the next layer's nodes): `dst` keep IDs 0..n-1, new
    sources follow in order of first appearance (the numba sampler's _relabel order)."""
    both = torch.cat([dst, sources])
    unique, inverse = torch.unique(both, return_inverse=True)
    first = torch.full((unique.numel(),), both.numel(), dtype=torch.int64, device=dst.device)
    first.scatter_reduce_(0, inverse, torch.arange(both.numel(), device=dst.device), "amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=dst.device)
    return rank[inverse[dst.numel():]], unique[order]
