"""Message-passing primitives of the MP-DFG and their lowering to ``dgl.ops``.

Every primitive takes the graph (a DGL graph or block) as its first argument, so a
captured program stays an ordinary torch.fx program that runs at every stage of
compilation; this is what lets each pass be checked numerically on its own.
``mailbox`` is the one exception: it only marks DGL's degree-bucketed layout during
capture and must be rewritten away before the program runs.

On a CSCBlock (gnnssd.compiler.block) every primitive runs as torch ops and Triton kernels
(gnnssd.compiler.kernels.csc) instead: the lowering that needs no DGL, on any device.
"""
from __future__ import annotations

from enum import Enum

import dgl
import torch

from gnnssd.compiler.block import CSCBlock
from gnnssd.compiler.kernels import csc


class Movement(str, Enum):
    """How an op moves data between the graph's spaces."""

    INPUT = "input"  # reads graph data or structure
    GATHER = "gather"  # node -> edge
    REDUCE = "reduce"  # edge -> destination node
    NORMALISE = "normalise"  # per-destination normalisation of edge values
    SPMM = "g-spmm"  # fused gather + op + reduce
    SDDMM = "g-sddmm"  # fused gather + gather + op
    FUSED = "fused-kernel"
    LAYOUT = "mailbox"  # capture-only marker of DGL's mailbox layout
    DENSE = "dense"  # row-wise or parameter-only computation


def read_data(g: dgl.DGLGraph, kind: str, key: str) -> torch.Tensor:
    """Feature stored on the graph before the layer ran (``kind``: src, dst or edge)."""
    if isinstance(g, CSCBlock):
        return {"src": g.srcdata, "dst": g.dstdata, "edge": g.edata}[kind][key]
    return {"src": g.srcdata, "dst": g.dstdata, "edge": g.edata}[kind][key]


def num_dst_nodes(g: dgl.DGLGraph) -> int:
    return g.num_dst_nodes()


def in_degrees(g: dgl.DGLGraph) -> torch.Tensor:
    return g.in_degrees()


def out_degrees(g: dgl.DGLGraph) -> torch.Tensor:
    return g.out_degrees()


def gather_src(g: dgl.DGLGraph, x: torch.Tensor) -> torch.Tensor:
    """Each edge's copy of its source node's row."""
    if isinstance(g, CSCBlock):
        return csc.gather_src(g, x)
    return dgl.ops.copy_u(g, x)


def gather_dst(g: dgl.DGLGraph, x: torch.Tensor) -> torch.Tensor:
    """Each edge's copy of its destination node's row."""
    if isinstance(g, CSCBlock):
        return csc.gather_dst(g, x)
    return dgl.ops.copy_v(g, x)


def mailbox(g: dgl.DGLGraph, e: torch.Tensor) -> torch.Tensor:
    """Marker for ``nodes.mailbox[...]``; the mailbox passes remove it."""
    raise RuntimeError("mailbox values must be rewritten to edge values before running")


def segment_reduce(g: dgl.DGLGraph, e: torch.Tensor, reduce: str) -> torch.Tensor:
    """Reduce edge rows onto their destinations (zero for zero in-degree)."""
    if isinstance(g, CSCBlock):
        return csc.segment_reduce(g, e, reduce)
    return gspmm(g, "copy_rhs", reduce, None, e)


def edge_softmax(g: dgl.DGLGraph, e: torch.Tensor) -> torch.Tensor:
    """Softmax of edge rows over each destination's in-edges."""
    if isinstance(g, CSCBlock):
        return csc.edge_softmax(g, e)
    return dgl.ops.edge_softmax(g, e)


def gspmm(g: dgl.DGLGraph, op: str, reduce: str, x: torch.Tensor | None,
          e: torch.Tensor | None) -> torch.Tensor:
    """``reduce_{edges (u,v)} x[u] op e`` per destination v, without edge-sized copies of x.

    Like ``update_all``, destinations without in-edges get zero, also for max/min
    (where the kernel leaves +-inf).
    """
    if isinstance(g, CSCBlock):
        return csc.gspmm(g, op, reduce, x, e)
    out = dgl.ops.gspmm(g, op, reduce, x, e)
    return out.masked_fill(torch.isinf(out), 0) if reduce in ("max", "min") else out


def gsddmm(g: dgl.DGLGraph, op: str, x: torch.Tensor, y: torch.Tensor,
           lhs_target: str, rhs_target: str) -> torch.Tensor:
    """``x[lhs] op y[rhs]`` per edge, without materialising the two gathers."""
    if isinstance(g, CSCBlock):
        return csc.gsddmm(g, op, x, y, lhs_target, rhs_target)
    return dgl.ops.gsddmm(g, op, x, y, lhs_target, rhs_target)


def fused_attention(g: dgl.DGLGraph, el: torch.Tensor, er: torch.Tensor, z: torch.Tensor,
                    slope: float) -> torch.Tensor:
    """``sum_u softmax_u(leaky_relu(el[u] + er[v])) * z[u]`` per destination v.

    One pass per destination with the numba kernel for float32/float64 on CPU; on a
    CSCBlock through its torch lowering; elsewhere the same maths through ``dgl.ops``.
    """
    from gnnssd.compiler.kernels.attention import attention_aggregate

    heads = z.shape[1] if z.dim() == 3 else 1
    el2, er2 = el.reshape(el.shape[0], heads), er.reshape(er.shape[0], heads)
    z3 = z.reshape(z.shape[0], heads, -1)
    if isinstance(g, CSCBlock):
        out = csc.attention(g, el2, er2, z3, slope)
    elif z.device.type == "cpu" and z.dtype in (torch.float32, torch.float64):
        out = attention_aggregate(g, el2, er2, z3, slope)
    else:
        s = torch.nn.functional.leaky_relu(dgl.ops.u_add_v(g, el2, er2), slope)
        out = dgl.ops.u_mul_e_sum(g, z3, dgl.ops.edge_softmax(g, s).unsqueeze(-1))
    return out.reshape((out.shape[0],) + z.shape[1:])


MOVEMENT: dict = {
    read_data: Movement.INPUT,
    num_dst_nodes: Movement.INPUT,
    in_degrees: Movement.INPUT,
    out_degrees: Movement.INPUT,
    gather_src: Movement.GATHER,
    gather_dst: Movement.GATHER,
    mailbox: Movement.LAYOUT,
    segment_reduce: Movement.REDUCE,
    edge_softmax: Movement.NORMALISE,
    gspmm: Movement.SPMM,
    gsddmm: Movement.SDDMM,
    fused_attention: Movement.FUSED,
}
GATHERS = (gather_src, gather_dst)
