"""Fused CSC aggregation on the GPU (Triton): out[v] = sum_u w_uv * x[u], or its mean.

One program owns one destination row and a slice of its features, and walks that row's
in-edges in tiles: each tile loads the sources' IDs, their rows and the edge weights, and
accumulates in float32. No edge-sized message tensor exists, and no two programs write the
same row, so there are no atomics. The backward for x is the same kernel over the transposed
graph (each source row owns its out-edges, gnnssd.compiler.block.CSCBlock.transpose), with
the weights permuted to CSR order; the weights' gradient is the per-edge dot product
<grad_out[v], x[u]>. Every kernel reads int64 indices and x of any float dtype.
"""

import os

import torch
import triton
import triton.language as tl

from gnnssd.compiler.block import CSCBlock

BLOCK_E = 32  # in-edges per tile
# Triton's CPU interpreter (how the tests run these kernels without a GPU) copies every
# tensor argument back after a launch, which autograd sees as an in-place write: it gets copies.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _aggregate_rows(ptr, idx, coef, src, out, num_feats, stride_src, stride_out,
                    HAS_COEF: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    row = tl.program_id(0)
    feats = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feats < num_feats
    start = tl.load(ptr + row)
    end = tl.load(ptr + row + 1)
    acc = tl.zeros([BLOCK_F], dtype=tl.float32)
    for first in range(start, end, BLOCK_E):
        edges = first + tl.arange(0, BLOCK_E)
        edge_mask = edges < end
        cols = tl.load(idx + edges, mask=edge_mask, other=0)
        rows = tl.load(src + tl.expand_dims(cols, 1) * stride_src + tl.expand_dims(feats, 0),
                       mask=tl.expand_dims(edge_mask, 1) & tl.expand_dims(feat_mask, 0), other=0.0)
        rows = rows.to(tl.float32)
        if HAS_COEF:
            weights = tl.load(coef + edges, mask=edge_mask, other=0.0).to(tl.float32)
            rows = rows * tl.expand_dims(weights, 1)
        acc += tl.sum(rows, axis=0)
    tl.store(out + row * stride_out + feats, acc.to(out.dtype.element_ty), mask=feat_mask)


def aggregate_rows(ptr: torch.Tensor, idx: torch.Tensor, coef: torch.Tensor | None, src: torch.Tensor,
                   num_rows: int) -> torch.Tensor:
    """out[r] = sum_{j in ptr[r]:ptr[r+1]} coef[j] * src[idx[j]] for 2-D `src` (rows, feats)."""
    src = src.contiguous()
    out = src.new_empty((num_rows, src.shape[1]))
    if num_rows == 0 or src.shape[1] == 0:
        return out.zero_()
    block_f = min(triton.next_power_of_2(src.shape[1]), 128)
    grid = (num_rows, triton.cdiv(src.shape[1], block_f))
    if INTERPRETED:
        ptr, idx, src = ptr.clone(), idx.clone(), src.detach().clone()
        coef = None if coef is None else coef.detach().clone()
    _aggregate_rows[grid](ptr, idx, coef if coef is not None else src, src, out, src.shape[1],
                          src.stride(0), out.stride(0), HAS_COEF=coef is not None,
                          BLOCK_E=BLOCK_E, BLOCK_F=block_f)
    return out


class _FusedAggregate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g: CSCBlock, x: torch.Tensor, weight: torch.Tensor | None, mean: bool) -> torch.Tensor:
        flat = x.reshape(x.shape[0], -1)
        scale = 1.0 / g.in_degrees().clamp(min=1).to(torch.float32) if mean else None
        out = aggregate_rows(g.indptr, g.indices, weight, flat, g.num_dst)
        if scale is not None:
            out = (out * scale.unsqueeze(1)).to(x.dtype)
        ctx.g, ctx.mean, ctx.x_shape = g, mean, x.shape
        ctx.save_for_backward(flat, weight, scale)
        return out.reshape((g.num_dst, *x.shape[1:]))

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        flat, weight, scale = ctx.saved_tensors
        g = ctx.g
        go = grad_out.reshape(g.num_dst, -1)
        if scale is not None:
            go = (go * scale.unsqueeze(1)).to(go.dtype)
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            csr_ptr, csr_dst, csr_edge = g.transpose()
            coef = None if weight is None else weight.reshape(-1)[csr_edge].contiguous()
            grad_x = aggregate_rows(csr_ptr, csr_dst, coef, go, g.num_src).reshape(ctx.x_shape)
        if weight is not None and ctx.needs_input_grad[2]:
            per_edge = (go.index_select(0, g.dst_index()) * flat.index_select(0, g.indices)).sum(1)
            grad_w = per_edge.reshape(weight.shape).to(weight.dtype)
        return None, grad_x, grad_w, None


def fused_aggregate(g: CSCBlock, x: torch.Tensor, weight: torch.Tensor | None, reduce: str) -> torch.Tensor:
    """sum (or mean) over each destination's in-edges of weight * x[source]; `weight` one
    scalar per edge in CSC order (any shape with num_edges elements) or None."""
    if reduce not in ("sum", "mean"):
        raise ValueError(f"fused_aggregate: reduce {reduce!r}, expected sum or mean")
    w = None if weight is None else weight.reshape(-1).contiguous()
    out = _FusedAggregate.apply(g, x, w, reduce == "mean")
    if weight is not None and weight.dim() > 1:  # DGL broadcasts (E, 1) weights: same result shape
        out = out.reshape((g.num_dst, *torch.broadcast_shapes(x.shape[1:], weight.shape[1:])))
    return out
