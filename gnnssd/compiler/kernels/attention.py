"""Attention aggregation in one pass per destination (numba, CPU).

Forward, per destination v over its in-edges (u, v) and every head:
``s = leaky_relu(el[u] + er[v])``, ``a = softmax_u(s)``, ``out[v] = sum_u a * z[u]``.
Nothing edge-sized is ever allocated: backward keeps the softmax's per-destination max
and sum and the output, and recomputes edge scores and weights from ``el``/``er``.

Backward uses ``d s = a * (<go[v], z[u]> - c[v])`` with ``c[v] = <go[v], out[v]>``:
a pass over destinations (CSC) yields ``c`` and ``d er``; a pass over sources (CSR)
yields ``d z`` and ``d el``, recomputing each edge's weight and dot product. Each pass
writes disjoint rows, so both run in parallel without atomics.
"""
from __future__ import annotations

import types

import dgl
import numba
import numpy as np
import torch

# Below this many edges a parallel launch costs more than it saves.
PARALLEL_MIN_EDGES = 20_000


def _jit(fn):
    """Serial and parallel compilations of one kernel.

    The parallel one is compiled from a renamed copy: numba's on-disk cache is keyed by
    the function's name, not by its compile flags.
    """
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_parallel")
    twin.__qualname__ = fn.__qualname__ + "_parallel"
    return (numba.njit(cache=True, fastmath=True)(fn),
            numba.njit(cache=True, fastmath=True, parallel=True)(twin))


@numba.njit(inline="always")
def _leaky(s, slope):
    return s if s > 0 else s * slope


@numba.njit(inline="always")
def _weight(el, er, u, v, h, slope, smax, ssum):
    """Edge (u, v)'s score before the leaky ReLU and its attention weight, recomputed from
    the forward pass's per-destination max and sum."""
    s = el[u, h] + er[v, h]
    return s, np.exp(_leaky(s, slope) - smax[v, h]) / ssum[v, h]


@numba.njit(inline="always")
def _score_grad(el, er, z, go, c, u, v, h, slope, smax, ssum):
    """Edge (u, v)'s attention weight a and the gradient of its score before the leaky
    ReLU: a * (<go[v], z[u]> - c[v]), times the ReLU's slope where it is negative."""
    s, a = _weight(el, er, u, v, h, slope, smax, ssum)
    dot = z.dtype.type(0)
    for f in range(z.shape[2]):
        dot += go[v, h, f] * z[u, h, f]
    d = a * (dot - c[v, h])
    return a, d if s > 0 else d * slope


def _forward(indptr, indices, el, er, z, slope, out, smax, ssum):
    heads, feats = z.shape[1], z.shape[2]
    for v in numba.prange(indptr.shape[0] - 1):
        for k in range(indptr[v], indptr[v + 1]):
            for h in range(heads):
                s = _leaky(el[indices[k], h] + er[v, h], slope)
                if s > smax[v, h]:
                    smax[v, h] = s
        for k in range(indptr[v], indptr[v + 1]):
            u = indices[k]
            for h in range(heads):
                w = np.exp(_leaky(el[u, h] + er[v, h], slope) - smax[v, h])
                ssum[v, h] += w
                for f in range(feats):
                    out[v, h, f] += w * z[u, h, f]
        for h in range(heads):
            if ssum[v, h] > 0:
                inv = ssum.dtype.type(1) / ssum[v, h]
                for f in range(feats):
                    out[v, h, f] *= inv


def _backward_dst(indptr, indices, el, er, z, go, out, smax, ssum, slope, c, ger):
    heads, feats = z.shape[1], z.shape[2]
    for v in numba.prange(indptr.shape[0] - 1):
        for h in range(heads):  # c[v, h] = <go[v], out[v]>
            for f in range(feats):
                c[v, h] += go[v, h, f] * out[v, h, f]
        for k in range(indptr[v], indptr[v + 1]):
            u = indices[k]
            for h in range(heads):
                ger[v, h] += _score_grad(el, er, z, go, c, u, v, h, slope, smax, ssum)[1]


def _backward_src(indptr, indices, el, er, z, go, smax, ssum, slope, c, gel, gz):
    heads, feats = z.shape[1], z.shape[2]
    for u in numba.prange(indptr.shape[0] - 1):
        for k in range(indptr[u], indptr[u + 1]):
            v = indices[k]
            for h in range(heads):
                a, d = _score_grad(el, er, z, go, c, u, v, h, slope, smax, ssum)
                for f in range(feats):
                    gz[u, h, f] += a * go[v, h, f]
                gel[u, h] += d


_FORWARD, _BACKWARD_DST, _BACKWARD_SRC = _jit(_forward), _jit(_backward_dst), _jit(_backward_src)


def _adjacency(g: dgl.DGLGraph, fmt: str) -> tuple[np.ndarray, ...]:
    return tuple(t.numpy() for t in g.adj_tensors(fmt))


class AttentionAggregate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, el, er, z, slope):
        el, er, z = el.contiguous(), er.contiguous(), z.contiguous()
        indptr, indices, _ = _adjacency(g, "csc")
        n_dst, heads = indptr.shape[0] - 1, z.shape[1]
        out = z.new_zeros((n_dst,) + tuple(z.shape[1:]))
        smax = z.new_full((n_dst, heads), -float("inf"))
        ssum = z.new_zeros((n_dst, heads))
        slope_t = np.array(slope, dtype=z.detach().numpy().dtype)[()]
        _FORWARD[g.num_edges() >= PARALLEL_MIN_EDGES](
            indptr, indices, el.detach().numpy(), er.detach().numpy(), z.detach().numpy(),
            slope_t, out.numpy(), smax.numpy(), ssum.numpy())
        ctx.g, ctx.slope = g, slope_t
        ctx.save_for_backward(el, er, z, out, smax, ssum)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        el, er, z, out, smax, ssum = ctx.saved_tensors
        gel, ger, gz = torch.zeros_like(el), torch.zeros_like(er), torch.zeros_like(z)
        c = torch.zeros_like(ger)
        parallel = ctx.g.num_edges() >= PARALLEL_MIN_EDGES
        el, er, z = el.detach().numpy(), er.detach().numpy(), z.detach().numpy()
        go, stats = grad_out.contiguous().numpy(), (smax.numpy(), ssum.numpy(), ctx.slope)
        indptr, indices, _ = _adjacency(ctx.g, "csc")
        _BACKWARD_DST[parallel](indptr, indices, el, er, z, go, out.numpy(), *stats,
                                c.numpy(), ger.numpy())
        indptr, indices, _ = _adjacency(ctx.g, "csr")
        _BACKWARD_SRC[parallel](indptr, indices, el, er, z, go, *stats, c.numpy(),
                                gel.numpy(), gz.numpy())
        return None, gel, ger, gz, None


def attention_aggregate(g: dgl.DGLGraph, el: torch.Tensor, er: torch.Tensor,
                        z: torch.Tensor, slope: float) -> torch.Tensor:
    """Fused GAT aggregation; ``el``/``er`` are (nodes, heads), ``z`` (nodes, heads, feats)."""
    return AttentionAggregate.apply(g, el, er, z, float(slope))
