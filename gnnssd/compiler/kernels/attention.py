"""Attention aggregation in one pass per destination (numba, CPU).

Forward, per destination v over its in-edges (u, v) and every head:
``s = leaky_relu(el[u] + er[v])``, ``a = softmax_u(s)``, ``out[v] = sum_u a * z[u]``.
Kept for backward are node-sized values only (the softmax's per-destination max and
sum, and the output); edge scores are recomputed from ``el``/``er``.

Backward uses ``d s = a * (<go[v], z[u]> - <go[v], out[v]>)``: a pass over
destinations (CSC) yields ``d er`` and, in edge-sized scratch that lives only during
backward, each edge's weight and score gradient; a pass over sources (CSR) then
yields ``d z`` and ``d el``. Each pass writes disjoint rows: parallel, no atomics.
Edges are the outer loop and heads the inner one, so a row of ``z`` is read once
per edge, contiguously.
"""
from __future__ import annotations

import dgl
import numba
import numpy as np
import torch

_JIT = dict(parallel=True, cache=True, fastmath=True)


@numba.njit(**_JIT)
def _forward(indptr, indices, el, er, z, slope, out, smax, ssum):
    heads, feats = z.shape[1], z.shape[2]
    for v in numba.prange(indptr.shape[0] - 1):
        for k in range(indptr[v], indptr[v + 1]):
            for h in range(heads):
                s = el[indices[k], h] + er[v, h]
                s = s if s > 0 else s * slope
                if s > smax[v, h]:
                    smax[v, h] = s
        for k in range(indptr[v], indptr[v + 1]):
            u = indices[k]
            for h in range(heads):
                s = el[u, h] + er[v, h]
                w = np.exp((s if s > 0 else s * slope) - smax[v, h])
                ssum[v, h] += w
                for f in range(feats):
                    out[v, h, f] += w * z[u, h, f]
        for h in range(heads):
            if ssum[v, h] > 0:
                inv = 1 / ssum[v, h]
                for f in range(feats):
                    out[v, h, f] *= inv


@numba.njit(**_JIT)
def _backward_dst(indptr, indices, eids, el, er, z, go, out, smax, ssum, slope,
                  ger, weight, dscore):
    heads, feats = z.shape[1], z.shape[2]
    for v in numba.prange(indptr.shape[0] - 1):
        c = np.zeros(heads, dtype=z.dtype)  # <go[v], out[v]> per head
        for h in range(heads):
            for f in range(feats):
                c[h] += go[v, h, f] * out[v, h, f]
        for k in range(indptr[v], indptr[v + 1]):
            u, e = indices[k], eids[k]
            for h in range(heads):
                s = el[u, h] + er[v, h]
                a = np.exp((s if s > 0 else s * slope) - smax[v, h]) / ssum[v, h]
                dot = z.dtype.type(0)
                for f in range(feats):
                    dot += go[v, h, f] * z[u, h, f]
                d = a * (dot - c[h])
                d = d if s > 0 else d * slope
                ger[v, h] += d
                weight[e, h], dscore[e, h] = a, d


@numba.njit(**_JIT)
def _backward_src(indptr, indices, eids, go, weight, dscore, gel, gz):
    heads, feats = gz.shape[1], gz.shape[2]
    for u in numba.prange(indptr.shape[0] - 1):
        for k in range(indptr[u], indptr[u + 1]):
            v, e = indices[k], eids[k]
            for h in range(heads):
                gel[u, h] += dscore[e, h]
                a = weight[e, h]
                for f in range(feats):
                    gz[u, h, f] += a * go[v, h, f]


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
        _forward(indptr, indices, el.detach().numpy(), er.detach().numpy(),
                 z.detach().numpy(), slope_t, out.numpy(), smax.numpy(), ssum.numpy())
        ctx.g, ctx.slope = g, slope_t
        ctx.save_for_backward(el, er, z, out, smax, ssum)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        el, er, z, out, smax, ssum = ctx.saved_tensors
        go = grad_out.contiguous().numpy()
        gel, ger, gz = torch.zeros_like(el), torch.zeros_like(er), torch.zeros_like(z)
        num_edges = ctx.g.num_edges()
        weight, dscore = z.new_empty((num_edges, z.shape[1])), z.new_empty((num_edges, z.shape[1]))
        _backward_dst(*_adjacency(ctx.g, "csc"), el.detach().numpy(), er.detach().numpy(),
                      z.detach().numpy(), go, out.numpy(), smax.numpy(), ssum.numpy(),
                      ctx.slope, ger.numpy(), weight.numpy(), dscore.numpy())
        _backward_src(*_adjacency(ctx.g, "csr"), go, weight.numpy(), dscore.numpy(),
                      gel.numpy(), gz.numpy())
        return None, gel, ger, gz, None


def attention_aggregate(g: dgl.DGLGraph, el: torch.Tensor, er: torch.Tensor,
                        z: torch.Tensor, slope: float) -> torch.Tensor:
    """Fused GAT aggregation; ``el``/``er`` are (nodes, heads), ``z`` (nodes, heads, feats)."""
    return AttentionAggregate.apply(g, el, er, z, float(slope))
