"""Fused CSC aggregation on the GPU (Triton): out[v, h] = sum_u w[uv, h] * x[u, h], or its mean.

x holds `heads` groups of features per row (one group when the weight is one scalar per
edge); the weight is one scalar per edge and head (attention weights, edge norms) or absent.
One program owns one destination row and a slice of its features, and walks that row's
in-edges in tiles: each tile loads the sources' IDs, their rows and the edges' weights, and
accumulates in float32. No edge-sized copy of x exists and no two programs write the same
row, so there are no atomics. The backward for x is the same kernel over the transposed
graph (each source row owns its out-edges, gnnssd.compiler.block.CSCBlock.transpose) with
the weights permuted to CSR order; the weights' gradient, <grad_out[v, h], x[u, h]> per edge
and head, is a second kernel of the same shape (a program per destination and head).
Index tensors may be int64 or int32 (Triton's CPU interpreter, which the tests use, cannot
cast between integer widths); `tl.expand_dims` rather than `[:, None]`, which that
interpreter mishandles.
"""
import os

import torch
import triton
import triton.language as tl

from gnnssd.compiler.block import CSCBlock

# Triton's CPU interpreter (how the tests run these kernels without a GPU) copies every
# tensor argument back after a launch, which autograd sees as an in-place write: it gets copies.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _tiles() -> list[triton.Config]:
    """In-edges per tile and warps per program, timed on a kernel's first launch for each
    feature width (sampled blocks have few in-edges per destination: small tiles may win);
    one choice under the interpreter."""
    if INTERPRETED:
        return [triton.Config({"BLOCK_E": 32}, num_warps=4)]
    return [triton.Config({"BLOCK_E": e}, num_warps=w) for e in (8, 16, 32) for w in (1, 2, 4)]


@triton.autotune(configs=_tiles(), key=["num_feats", "heads"])
@triton.jit
def _aggregate_rows(ptr, idx, coef, src, out, num_feats, head_dim, heads, stride_src, stride_out,
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
        mask = tl.expand_dims(edge_mask, 1) & tl.expand_dims(feat_mask, 0)
        cols = tl.load(idx + edges, mask=edge_mask, other=0)
        rows = tl.load(src + tl.expand_dims(cols, 1) * stride_src + tl.expand_dims(feats, 0), mask=mask, other=0.0)
        rows = rows.to(tl.float32)
        if HAS_COEF:  # the weight of each (edge, head of the feature)
            at = tl.expand_dims(edges, 1) * heads + tl.expand_dims(feats // head_dim, 0)
            rows = rows * tl.load(coef + at, mask=mask, other=0.0).to(tl.float32)
        acc += tl.sum(rows, axis=0)
    tl.store(out + row * stride_out + feats, acc.to(out.dtype.element_ty), mask=feat_mask)


@triton.autotune(configs=_tiles(), key=["head_dim", "heads"])
@triton.jit
def _edge_head_dots(ptr, idx, rows_of_dst, src, out, head_dim, heads, stride_dst, stride_src,
                    BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[e * heads + h] = <rows_of_dst[v, h], src[idx[e], h]> for the in-edges e of v."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < head_dim
    feats = head * head_dim + dims
    mine = tl.load(rows_of_dst + row * stride_dst + feats, mask=dim_mask, other=0.0).to(tl.float32)
    start = tl.load(ptr + row)
    end = tl.load(ptr + row + 1)
    for first in range(start, end, BLOCK_E):
        edges = first + tl.arange(0, BLOCK_E)
        edge_mask = edges < end
        cols = tl.load(idx + edges, mask=edge_mask, other=0)
        rows = tl.load(src + tl.expand_dims(cols, 1) * stride_src + tl.expand_dims(feats, 0),
                       mask=tl.expand_dims(edge_mask, 1) & tl.expand_dims(dim_mask, 0), other=0.0)
        dots = tl.sum(rows.to(tl.float32) * tl.expand_dims(mine, 0), axis=1)
        tl.store(out + edges * heads + head, dots.to(out.dtype.element_ty), mask=edge_mask)


def _interpreter_copies(*tensors: torch.Tensor | None) -> tuple:
    if not INTERPRETED:
        return tensors
    return tuple(None if t is None else t.detach().clone() for t in tensors)


def aggregate_rows(ptr: torch.Tensor, idx: torch.Tensor, coef: torch.Tensor | None, src: torch.Tensor,
                   num_rows: int, heads: int = 1) -> torch.Tensor:
    """out[r] = sum_{j in ptr[r]:ptr[r+1]} coef[j, head] * src[idx[j]] for 2-D `src` (rows,
    heads * head_dim), coef (edges, heads) flattened, or None."""
    src = src.contiguous()
    out = src.new_empty((num_rows, src.shape[1]))
    if num_rows == 0 or src.shape[1] == 0:
        return out.zero_()
    block_f = min(triton.next_power_of_2(src.shape[1]), 128)
    grid = (num_rows, triton.cdiv(src.shape[1], block_f))
    ptr, idx, coef, src = _interpreter_copies(ptr, idx, coef, src)
    _aggregate_rows[grid](ptr, idx, coef if coef is not None else src, src, out, src.shape[1],
                          src.shape[1] // heads, heads, src.stride(0), out.stride(0), HAS_COEF=coef is not None,
                          BLOCK_F=block_f)
    return out


def edge_head_dots(g: CSCBlock, rows_of_dst: torch.Tensor, src: torch.Tensor, heads: int) -> torch.Tensor:
    """(edges, heads): <rows_of_dst[v, h], src[u, h]> per in-edge (u, v), CSC order; both 2-D
    (rows, heads * head_dim)."""
    rows_of_dst, src = rows_of_dst.contiguous(), src.contiguous()
    out = src.new_empty((g.num_edges, heads))
    if g.num_edges == 0:
        return out
    head_dim = src.shape[1] // heads
    ptr, idx, rows_of_dst, src = _interpreter_copies(g.indptr, g.indices, rows_of_dst, src)
    _edge_head_dots[(g.num_dst, heads)](ptr, idx, rows_of_dst, src, out, head_dim, heads, rows_of_dst.stride(0),
                                        src.stride(0), BLOCK_D=triton.next_power_of_2(head_dim))
    return out


class _FusedAggregate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g: CSCBlock, x: torch.Tensor, weight: torch.Tensor | None, heads: int,
                mean: bool) -> torch.Tensor:
        flat = x.reshape(x.shape[0], -1)
        scale = 1.0 / g.in_degrees().clamp(min=1).to(torch.float32) if mean else None
        out = aggregate_rows(g.indptr, g.indices, weight, flat, g.num_dst, heads)
        if scale is not None:
            out = (out * scale.unsqueeze(1)).to(x.dtype)
        ctx.g, ctx.heads, ctx.x_shape = g, heads, x.shape
        ctx.save_for_backward(flat, weight, scale)
        return out.reshape((g.num_dst, *x.shape[1:]))

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        flat, weight, scale = ctx.saved_tensors
        g, heads = ctx.g, ctx.heads
        go = grad_out.reshape(g.num_dst, -1)
        if scale is not None:
            go = (go * scale.unsqueeze(1)).to(go.dtype)
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            csr_ptr, csr_dst, csr_edge = g.transpose()
            coef = None if weight is None else weight.view(g.num_edges, heads)[csr_edge].reshape(-1)
            grad_x = aggregate_rows(csr_ptr, csr_dst, coef, go, g.num_src, heads).reshape(ctx.x_shape)
        if weight is not None and ctx.needs_input_grad[2]:
            grad_w = edge_head_dots(g, go, flat, heads).reshape(weight.shape).to(weight.dtype)
        return None, grad_x, grad_w, None, None


def fused_aggregate(g: CSCBlock, x: torch.Tensor, weight: torch.Tensor | None, reduce: str) -> torch.Tensor:
    """sum (or mean) over each destination's in-edges of weight * x[source].

    `weight`: None, one scalar per edge (shape (E,) or (E, 1)), or one per edge and head
    ((E, H) or (E, H, 1) with x of shape (N, H, D)), in CSC edge order."""
    if reduce not in ("sum", "mean"):
        raise ValueError(f"fused_aggregate: reduce {reduce!r}, expected sum or mean")
    heads = 1 if weight is None else weight.numel() // g.num_edges
    if weight is not None and (weight.numel() != heads * g.num_edges or x[0].numel() % heads):
        raise ValueError(f"fused_aggregate: weight of shape {tuple(weight.shape)} for {g.num_edges} edges "
                         f"and rows of shape {tuple(x.shape[1:])}")
    w = None if weight is None else weight.reshape(-1).contiguous()
    out = _FusedAggregate.apply(g, x, w, heads, reduce == "mean")
    if weight is not None and weight.dim() > x.dim():  # DGL's broadcast of a trailing 1
        out = out.reshape((g.num_dst, *torch.broadcast_shapes(x.shape[1:], weight.shape[1:])))
    return out
