"""A sampled block as plain CSC tensors: what compiled layers run on where DGL cannot.

DGL's wheels on the package index are CPU-only, so a DGL block cannot live on a GPU. A
`CSCBlock` holds what message passing needs (the destination pointers, each in-edge's
source, the node counts, the edge IDs for users) as torch tensors on any device; the
compiler's primitives (gnnssd.compiler.ops) dispatch on it to torch ops and Triton kernels
(gnnssd.compiler.kernels.csc). Destination node i is source node i, as in a DGL block,
except in one relation of a `TypedCSCBlock` (a typed block's per-relation CSC slices), whose
sources and destinations may be of different node types.
"""
from __future__ import annotations

from collections.abc import Callable
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
    `dst_in_src`: destination i is source i (a block); False for one relation of a typed
    block, whose two ends are node types of their own (layers then take a (src, dst) pair).
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    num_src: int
    num_dst: int
    edge_ids: torch.Tensor | None = None
    dst_in_src: bool = True
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
        if self.dst_in_src and self.num_dst > self.num_src:
            raise ValueError(f"CSCBlock: {self.num_dst} destinations but {self.num_src} sources "
                             "(a block's destinations are its first sources)")

    def __getattr__(self, name: str) -> None:
        """What a dgl.nn layer given a CSC block asks for (graph.local_scope, ...): refused
        saying why and naming the layers that run on CSC blocks."""
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"'CSCBlock' has no attribute {name!r}: a CSC block is not a DGL graph, and dgl.nn "
                             "layers take DGL graphs only. On CSC blocks (features: device, or a GPU with PyPI's "
                             "CPU-only DGL) use gnnssd's compiled layers: gnnssd.compile of a DGL-style "
                             "message/reduce layer (gnnssd.compiler's SAGEConvUDF, GraphConvUDF, GATConvUDF), "
                             "or the built-in models with model.compile: true")

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

    def map(self, move: Callable[[torch.Tensor], torch.Tensor]) -> CSCBlock:
        """The same block with `move` applied to each of its tensors (frames and derived
        indices are not carried): a copy to a device, to pinned memory."""
        edge_ids = None if self.edge_ids is None else move(self.edge_ids)
        return CSCBlock(move(self.indptr), move(self.indices), self.num_src, self.num_dst, edge_ids, self.dst_in_src)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> CSCBlock:
        """This block's tensors on `device`."""
        return self.map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> CSCBlock:
        """The block in page-locked host memory, so that a copy to the GPU can run asynchronously."""
        return self.map(torch.Tensor.pin_memory)

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


Relation = tuple[str, str, str]


@dataclass(eq=False)
class TypedCSCBlock:
    """A heterogeneous block (one layer of a typed mini-batch) as one CSCBlock per relation:
    what compiled relational layers (gnnssd.compiler.hetero) run on where DGL cannot.

    `relations` maps each canonical relation (source type, name, destination type) to its
    CSC slice, whose sources are the source type's source nodes and destinations the
    destination type's destination nodes, each in the block's per-type order (as DGL's
    `block[relation]`); `num_src`/`num_dst` count each type's sources and destinations;
    `src_ids` are each type's source node IDs (a DGL block's dgl.NID), which an embedding
    of a featureless type looks up. Indexing by relation and the node-count methods read as
    a DGL heterogeneous block's do.
    """

    relations: dict[Relation, CSCBlock]
    num_src: dict[str, int]
    num_dst: dict[str, int]
    src_ids: dict[str, torch.Tensor] = field(default_factory=dict)

    is_block = True

    @classmethod
    def from_dgl(cls, block: dgl.DGLGraph) -> TypedCSCBlock:
        """The per-relation CSC of a DGL heterogeneous block (edge and node IDs kept where DGL has them)."""
        relations = {}
        for relation in block.canonical_etypes:
            indptr, indices, eids = block.adj_tensors("csc", etype=relation)
            data = block.edges[relation].data
            edge_ids = data[dgl.EID][eids] if dgl.EID in data else None
            relations[relation] = CSCBlock(indptr.long(), indices.long(), block.num_src_nodes(relation[0]),
                                           block.num_dst_nodes(relation[2]), edge_ids, dst_in_src=False)
        src_ids = {t: block.srcnodes[t].data[dgl.NID] for t in block.srctypes if dgl.NID in block.srcnodes[t].data}
        return cls(relations, {t: block.num_src_nodes(t) for t in block.srctypes},
                   {t: block.num_dst_nodes(t) for t in block.dsttypes}, src_ids)

    def map(self, move: Callable[[torch.Tensor], torch.Tensor]) -> TypedCSCBlock:
        """The same block with `move` applied to each of its tensors (see CSCBlock.map)."""
        return TypedCSCBlock({r: g.map(move) for r, g in self.relations.items()}, self.num_src, self.num_dst,
                             {t: move(ids) for t, ids in self.src_ids.items()})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TypedCSCBlock:
        return self.map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> TypedCSCBlock:
        return self.map(torch.Tensor.pin_memory)

    def __getitem__(self, relation: Relation) -> CSCBlock:
        return self.relations[relation]

    @property
    def canonical_etypes(self) -> list[Relation]:
        return list(self.relations)

    @property
    def srctypes(self) -> list[str]:
        return list(self.num_src)

    @property
    def dsttypes(self) -> list[str]:
        return list(self.num_dst)

    @property
    def device(self) -> torch.device:
        return next(iter(self.relations.values())).device

    def num_src_nodes(self, ntype: str) -> int:
        return self.num_src[ntype]

    def num_dst_nodes(self, ntype: str) -> int:
        return self.num_dst[ntype]

    def num_edges(self, relation: Relation) -> int:
        return self.relations[relation].num_edges


#: In-edges of the graph a compiled program's shapes are recorded on (api.CompiledLayer).
SHAPE_SAMPLE_EDGES = 64


def few_edges(graph: dgl.DGLGraph | CSCBlock, edges: int = SHAPE_SAMPLE_EDGES) -> dgl.DGLGraph | CSCBlock:
    """`graph` with only its first `edges` edges (same node counts, node frames and the
    kept edges' edge frames): what the compiler runs a program on to record its shapes.
    Its node tensors have their real shapes; an edge tensor has `edges` rows, not one a
    real edge (the unfused capture, run on a mini-batch, gathers a row per edge: hundreds
    of MiB on the first mini-batch of a large graph)."""
    if isinstance(graph, CSCBlock):
        k = min(edges, graph.num_edges)
        return CSCBlock(graph.indptr.clamp(max=k), graph.indices[:k], graph.num_src, graph.num_dst,
                        None if graph.edge_ids is None else graph.edge_ids[:k], graph.dst_in_src,
                        dict(graph.srcdata), dict(graph.dstdata), {n: v[:k] for n, v in graph.edata.items()})
    k = min(edges, graph.num_edges())
    src, dst = graph.find_edges(torch.arange(k, device=graph.device))
    if graph.is_block:
        small = dgl.create_block((src, dst), num_src_nodes=graph.num_src_nodes(),
                                 num_dst_nodes=graph.num_dst_nodes(), device=graph.device)
        small.srcdata.update(dict(graph.srcdata))
        small.dstdata.update(dict(graph.dstdata))
    else:
        small = dgl.graph((src, dst), num_nodes=graph.num_nodes(), device=graph.device)
        small.ndata.update(dict(graph.ndata))
    small.edata.update({n: v[:k] for n, v in graph.edata.items()})
    return small
