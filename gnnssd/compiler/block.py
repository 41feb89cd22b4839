"""A sampled block as plain CSC tensors: what compiled layers run on where DGL cannot.

DGL's wheels on the package index are CPU-only, so a DGL block cannot live on a GPU. A
`CSCBlock` holds what message passing needs (the destination pointers, each in-edge's
source, the node counts, the edge IDs for users) as torch tensors on any device; the
compiler's primitives (gnnssd.compiler.ops) dispatch on it to torch ops and Triton kernels
(gnnssd.compiler.kernels.csc). Destination node i is source node i, as in a DGL block.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import dgl
import torch


@dataclass(eq=False)
class CSCBlock:
    """One bipartite message-passing graph (a block / MFG) in CSC form.

    `indptr` (int64, num_dst + 1) and `indices` (int64, one source per edge, grouped by
    destination): edge k runs from `indices[k]` to the destination whose range holds k.
    `edge_ids` are the edges' IDs in the graph they were sampled from (None if unknown).
    `srcdata`/`dstdata`/`edata` mirror a DGL block's frames (edata in CSC edge order).
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    num_src: int
    num_dst: int
    edge_ids: torch.Tensor | None = None
    srcdata: dict[str, torch.Tensor] = field(default_factory=dict)
    dstdata: dict[str, torch.Tensor] = field(default_factory=dict)
    edata: dict[str, torch.Tensor] = field(default_factory=dict)
    _cache: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    # What CompiledLayer asks of a graph: a block with one edge type.
    is_block = True
    ntypes = ("_N",)
    canonical_etypes = (("_N", "_E", "_N"),)

    def __post_init__(self) -> None:
        if self.indptr.dim() != 1 or self.indptr.numel() != self.num_dst + 1:
            raise ValueError(f"CSCBlock: indptr has {self.indptr.numel()} entries for {self.num_dst} "
                             "destinations (expected num_dst + 1)")
        if self.num_dst > self.num_src:
            raise ValueError(f"CSCBlock: {self.num_dst} destinations but {self.num_src} sources "
                             "(a block's destinations are its first sources)")

    @classmethod
    def from_dgl(cls, block: dgl.DGLGraph) -> CSCBlock:
        """The CSC of a DGL block (its edge IDs kept when DGL recorded them)."""
        indptr, indices, eids = block.adj_tensors("csc")
        edge_ids = block.edata[dgl.EID][eids] if dgl.EID in block.edata else None
        return cls(indptr.long(), indices.long(), block.num_src_nodes(), block.num_dst_nodes(), edge_ids)

    def to_dgl(self) -> dgl.DGLGraph:
        """The same block as a DGL block (on the CPU), for dgl.nn layers and DGL's ops."""
        block = dgl.create_block(("csc", (self.indptr.cpu(), self.indices.cpu(), torch.arange(self.num_edges))),
                                 num_src_nodes=self.num_src, num_dst_nodes=self.num_dst)
        if self.edge_ids is not None:
            block.edata[dgl.EID] = self.edge_ids.cpu()
        return block

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    @property
    def num_edges(self) -> int:
        return self.indices.numel()

    def num_src_nodes(self) -> int:
        return self.num_src

    def num_dst_nodes(self) -> int:
        return self.num_dst

    number_of_dst_nodes = num_dst_nodes

    def to(self, device: torch.device | str, non_blocking: bool = False) -> CSCBlock:
        """This block's tensors on `device` (frames and derived indices are not carried)."""
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return CSCBlock(move(self.indptr), move(self.indices), self.num_src, self.num_dst, move(self.edge_ids))

    def pin_memory(self) -> CSCBlock:
        """The block in page-locked host memory, so that a copy to the GPU can run asynchronously."""
        edge_ids = None if self.edge_ids is None else self.edge_ids.pin_memory()
        return CSCBlock(self.indptr.pin_memory(), self.indices.pin_memory(), self.num_src, self.num_dst, edge_ids)

    def _cached(self, key: str, make) -> torch.Tensor:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def in_degrees(self) -> torch.Tensor:
        return self._cached("in_degrees", lambda: self.indptr[1:] - self.indptr[:-1])

    def out_degrees(self) -> torch.Tensor:
        return self._cached("out_degrees", lambda: torch.bincount(self.indices, minlength=self.num_src))

    def dst_index(self) -> torch.Tensor:
        """Each edge's destination (the CSC's row pointer expanded), computed once."""
        return self._cached("dst_index", lambda: torch.repeat_interleave(
            torch.arange(self.num_dst, device=self.device, dtype=self.indices.dtype), self.in_degrees(),
            output_size=self.num_edges))

    def transpose(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The CSR of the same edges: (row pointers over sources, each out-edge's
        destination, each out-edge's position in CSC order), for kernels that own a source
        row (the backward of an aggregation), computed once; indices of the CSC's dtype."""
        if "csr_indptr" not in self._cache:
            order = torch.argsort(self.indices, stable=True)
            counts = self.out_degrees()
            indptr = torch.zeros(self.num_src + 1, dtype=self.indptr.dtype, device=self.device)
            indptr[1:] = torch.cumsum(counts, 0)
            self._cache.update(csr_indptr=indptr, csr_dst=self.dst_index()[order], csr_edge=order)
        return self._cache["csr_indptr"], self._cache["csr_dst"], self._cache["csr_edge"]
