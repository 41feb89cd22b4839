"""Neighbour sampling on a CSC held as torch tensors, on whatever device holds them.

`features: device` keeps the whole graph on the loader's device (a GPU, where DGL's PyPI
build cannot sample), so the blocks are drawn there with plain torch ops, vectorised over
all candidate edges of a layer (no loop per node), and come out as the compiler's
`CSCBlock`s. The same code runs on CPU tensors, which is how it is tested.

Its randomness is the numba sampler's (gnnssd.sampler.sampling): counter-based streams per
(seed, mini-batch, layer, node) from the same splitmix64 hash, written here in int64 torch
ops, so a draw depends on nothing but those four numbers. LABOR draws each source's
variate r_u exactly as the numba sampler does, so its blocks are the numba sampler's,
edge for edge; uniform sampling without replacement keeps, per destination, the
min(fanout, degree) in-edges with the smallest random keys (a uniform sample; the numba
sampler draws the same distribution with Floyd's algorithm, not the same edges). Sources
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
        """One layer: the in-edges kept for every node of `dst`, as a block, and the nodes
        of the next layer (dst, then the new sources)."""
        device, n = dst.device, dst.numel()
        start = self.indptr[dst]
        degree = self.indptr[dst + 1] - start
        cand_ptr = torch.zeros(n + 1, dtype=torch.int64, device=device)
        torch.cumsum(degree, 0, out=cand_ptr[1:])
        total = int(cand_ptr[-1])
        owner = torch.repeat_interleave(torch.arange(n, device=device), degree, output_size=total)
        position = torch.arange(total, device=device) - cand_ptr[owner]
        edge_ids = start[owner] + position
        sources = self.indices[edge_ids].to(torch.int64)
        keep = self._kept(dst, degree, owner, position, sources, fanout, seed, batch_id, layer)
        kept_ptr = torch.zeros(total + 1, dtype=torch.int64, device=device)
        torch.cumsum(keep, 0, out=kept_ptr[1:])
        local, nodes = _relabel(dst, sources[keep])
        block = CSCBlock(kept_ptr[cand_ptr], local, nodes.numel(), n, edge_ids[keep])
        return block, nodes

    def _kept(self, dst: torch.Tensor, degree: torch.Tensor, owner: torch.Tensor, position: torch.Tensor,
              sources: torch.Tensor, fanout: int, seed: int, batch_id: int, layer: int) -> torch.Tensor:
        """Which candidate edges (grouped by destination, CSC order within each) are sampled."""
        if fanout < 0:
            return torch.ones_like(owner, dtype=torch.bool)
        if self.method == "labor":  # kept iff r_u <= fanout / degree (1: all when degree <= fanout)
            threshold = torch.where(degree > fanout, fanout / degree.clamp(min=1).to(torch.float64), 1.0)
            return labor_variates(seed, batch_id, layer, sources) <= threshold[owner]
        keep = degree[owner] <= fanout  # all in-edges of nodes with at most `fanout`
        heavy = torch.nonzero(~keep).squeeze(1)
        if heavy.numel():  # the others: the `fanout` smallest random keys among each node's in-edges
            who = owner[heavy]
            keys = _mix(streams(seed, batch_id, layer, dst)[who] + position[heavy] * _signed(_GOLDEN))
            order = torch.argsort((who << 32) | _shr(keys, 32))
            heavy_degree = torch.where(degree > fanout, degree, 0)
            first = torch.cumsum(heavy_degree, 0) - heavy_degree  # where each node's run starts in `order`
            rank = torch.arange(heavy.numel(), device=dst.device) - first[who[order]]
            keep[heavy[order[rank < fanout]]] = True
        return keep


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
