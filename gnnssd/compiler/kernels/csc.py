"""The MP-DFG primitives over a CSCBlock, in torch ops and (on CUDA) Triton kernels.

This is the compiler's lowering where DGL cannot run (a GPU with DGL's CPU-only wheel): the
same signatures and results as the ``dgl.ops`` calls in gnnssd.compiler.ops, on any device
torch supports, differentiable through torch's autograd. Gathers are ``index_select``,
reductions ``index_add`` / ``scatter_reduce`` onto destinations (zero where a destination
has no in-edge, as DGL's ``update_all``), edge softmax subtracts each destination's maximum.
The aggregations that dominate a GNN's time (sum or mean of source rows, optionally times an
edge weight) go through the fused CSC kernels of gnnssd.compiler.kernels.triton_spmm on CUDA,
which never materialise the edge-sized messages.
"""
from __future__ import annotations

import torch

from gnnssd.compiler.block import CSCBlock

REDUCE_OPS = {"max": "amax", "min": "amin"}
#: Aggregate through the fused Triton kernel on CUDA (scripts/bench_gpu.py turns it off to
#: time the same layer as plain torch ops).
FUSED_ON_CUDA = True


def _rows_like(g: CSCBlock, e: torch.Tensor) -> torch.Tensor:
    """A zero tensor with one row per destination, e's feature shape."""
    return e.new_zeros((g.num_dst, *e.shape[1:]))


def _aligned(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad the feature dims of the operand with fewer (after dim 0) so torch broadcasts
    them as DGL does: feature shapes aligned at their last dim, edges at dim 0."""
    while a.dim() < b.dim():
        a = a.unsqueeze(1)
    while b.dim() < a.dim():
        b = b.unsqueeze(1)
    return a, b


def _binary(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if op == "copy_lhs":
        return a
    if op == "copy_rhs":
        return b
    a, b = _aligned(a, b)
    if op == "dot":
        return (a * b).sum(-1, keepdim=True)
    return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[op](a, b)


def gather_src(g: CSCBlock, x: torch.Tensor) -> torch.Tensor:
    return x.index_select(0, g.indices)


def gather_dst(g: CSCBlock, x: torch.Tensor) -> torch.Tensor:
    return x.index_select(0, g.dst_index())


def segment_reduce(g: CSCBlock, e: torch.Tensor, reduce: str) -> torch.Tensor:
    """Edge rows reduced onto their destinations; zero where a destination has no in-edge."""
    dst = g.dst_index()
    if reduce in ("sum", "mean"):
        out = _rows_like(g, e).index_add(0, dst, e)
        if reduce == "mean":
            out = out / g.in_degrees().clamp(min=1).to(e.dtype).view(-1, *[1] * (e.dim() - 1))
        return out
    if reduce in REDUCE_OPS:
        index = dst.view(-1, *[1] * (e.dim() - 1)).expand_as(e)
        return _rows_like(g, e).scatter_reduce(0, index, e, REDUCE_OPS[reduce], include_self=False)
    raise ValueError(f"reduce {reduce!r}: expected sum, mean, max or min")


def edge_softmax(g: CSCBlock, e: torch.Tensor) -> torch.Tensor:
    """Softmax of edge rows over each destination's in-edges (shifted by their maximum)."""
    dst = g.dst_index()
    shift = segment_reduce(g, e.detach(), "max").index_select(0, dst)
    weights = torch.exp(e - shift)
    return weights / segment_reduce(g, weights, "sum").index_select(0, dst)


def _fusable(x: torch.Tensor | None, e: torch.Tensor | None, g: CSCBlock) -> bool:
    """Whether the fused kernel computes this aggregation: x on CUDA, and no weight, one
    per edge, or one per edge and head ((E, H, 1) against x of (N, H, D))."""
    if not (FUSED_ON_CUDA and x is not None and x.is_cuda):
        return False
    return (e is None or e.numel() == g.num_edges
            or e.dim() == x.dim() and e.shape[1:-1] == x.shape[1:-1] and e.shape[-1] == 1)


def gspmm(g: CSCBlock, op: str, reduce: str, x: torch.Tensor | None, e: torch.Tensor | None) -> torch.Tensor:
    """``reduce_{(u, v)} x[u] op e`` per destination v."""
    if reduce in ("sum", "mean") and op in ("copy_lhs", "mul") and _fusable(x, None if op == "copy_lhs" else e, g):
        from gnnssd.compiler.kernels.triton_spmm import fused_aggregate

        return fused_aggregate(g, x, e if op == "mul" else None, reduce)
    source = None if x is None else gather_src(g, x)
    return segment_reduce(g, _binary(op, source, e), reduce)


def gsddmm(g: CSCBlock, op: str, x: torch.Tensor, y: torch.Tensor, lhs_target: str, rhs_target: str) -> torch.Tensor:
    """``x[lhs] op y[rhs]`` per edge; targets 'u' (source), 'v' (destination), 'e' (edge)."""
    def side(t: torch.Tensor, target: str) -> torch.Tensor:
        return {"u": gather_src, "v": gather_dst}[target](g, t) if target in ("u", "v") else t

    return _binary(op, side(x, lhs_target), side(y, rhs_target))


def attention(g: CSCBlock, el: torch.Tensor, er: torch.Tensor, z: torch.Tensor, slope: float) -> torch.Tensor:
    """``sum_u softmax_u(leaky_relu(el[u] + er[v])) * z[u]`` per destination v
    (el, er: (nodes, heads); z: (nodes, heads, dim)), as torch ops: measured on an H200
    (docs/BENCHMARKS.md, issue 31) they beat the fused per-head aggregation here (11.2 vs
    12.3 ms for a GAT layer's forward and backward), at the cost of an (edges, heads, dim) tensor."""
    scores = torch.nn.functional.leaky_relu(gather_src(g, el) + gather_dst(g, er), slope)
    weights = edge_softmax(g, scores).unsqueeze(-1)  # (edges, heads, 1)
    return segment_reduce(g, gather_src(g, z) * weights, "sum")
