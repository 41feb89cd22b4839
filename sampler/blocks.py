"""Message-flow graphs of one mini-batch as compact arrays, and their DGL form.

Sampling appends each hop's new source nodes after the nodes it already has, so every
block's destination and source nodes are prefixes of one `nodes` array (DGL's block
semantics: destination nodes first among the sources). One array per mini-batch is then
enough to describe all layers, to save a plan, and to gather the input features.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gnnssd.storage_format import ONE_RELATION, GraphSchema


@dataclass(frozen=True)
class MFGs:
    """The blocks of one mini-batch, input layer first (the order of DGL's `blocks`)."""

    nodes: np.ndarray  # int64 node IDs; block i's sources are nodes[:num_src[i]]
    num_src: np.ndarray  # int64 (L,)
    num_dst: np.ndarray  # int64 (L,); block i's destinations are nodes[:num_dst[i]]
    edge_ptr: np.ndarray  # int64 (L+1,): block i's edges are edge_*[edge_ptr[i]:edge_ptr[i+1]]
    edge_src: np.ndarray  # int32 local source index
    edge_dst: np.ndarray  # int32 local destination index
    #: The relation of every edge (int8/int16), see storage_format.schema; empty
    #: (ONE_RELATION) on a graph of one relation, whose edges are all relation 0.
    edge_type: np.ndarray = field(default_factory=lambda: ONE_RELATION)
    #: Nodes 0..feature_rows-1 have feature rows (-1: all nodes do).
    feature_rows: int = -1

    @property
    def num_layers(self) -> int:
        return len(self.num_src)

    @property
    def seeds(self) -> np.ndarray:
        """Output nodes of the last block."""
        return self.nodes[: self.num_dst[-1]]

    @property
    def input_nodes(self) -> np.ndarray:
        """Source nodes of the first block: the feature rows this mini-batch reads."""
        return self.nodes[: self.num_src[0]]

    @property
    def input_rows(self) -> np.ndarray:
        """The input nodes that have feature rows, in input order: the rows this
        mini-batch reads (all input nodes unless some node types have no features)."""
        nodes = self.input_nodes
        return nodes if self.feature_rows < 0 else nodes[nodes < self.feature_rows]

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays."""
        arrays = (self.nodes, self.num_src, self.num_dst, self.edge_ptr, self.edge_src, self.edge_dst, self.edge_type)
        return sum(a.nbytes for a in arrays)

    def edges(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Local (source, destination) indices of block i's edges."""
        a, b = self.edge_ptr[i], self.edge_ptr[i + 1]
        return self.edge_src[a:b], self.edge_dst[a:b]

    def equals(self, other: "MFGs") -> bool:
        return self.feature_rows == other.feature_rows and all(
            np.array_equal(getattr(self, f), getattr(other, f))
            for f in ("nodes", "num_src", "num_dst", "edge_ptr", "edge_src", "edge_dst", "edge_type")
        )


def to_dgl_blocks(mfgs: MFGs, device: str = "cpu") -> list:
    """Plain DGLBlocks for `mfgs` (no re-sampling; one node type, one relation);
    srcdata/dstdata[dgl.NID] hold node IDs. Which form a model gets (these, or
    typed_dgl_blocks) is gnnssd.loading's choice (its form.py), not the sampler's."""
    import dgl
    import torch

    nodes = torch.from_numpy(mfgs.nodes)
    blocks = []
    for i in range(mfgs.num_layers):
        src, dst = mfgs.edges(i)
        ns, nd = int(mfgs.num_src[i]), int(mfgs.num_dst[i])
        block = dgl.create_block(
            (torch.from_numpy(src.astype(np.int64)), torch.from_numpy(dst.astype(np.int64))),
            num_src_nodes=ns,
            num_dst_nodes=nd,
            device=device,
        )
        block.srcdata[dgl.NID] = nodes[:ns].to(device)
        block.dstdata[dgl.NID] = nodes[:nd].to(device)
        blocks.append(block)
    return blocks


def typed_local_ids(nodes: np.ndarray, schema: GraphSchema) -> tuple[np.ndarray, np.ndarray]:
    """(type ID, index among the nodes of its type in `nodes`) of every node: the node's
    position in its type's srcdata, since every prefix of `nodes` keeps each type in order."""
    types = schema.type_of(nodes)
    local = np.empty(len(nodes), np.int64)
    for t in range(len(schema.node_types)):
        at = np.flatnonzero(types == t)
        local[at] = np.arange(len(at))
    return types, local


def typed_dgl_blocks(mfgs: MFGs, schema: GraphSchema, device: str = "cpu") -> list:
    """Heterogeneous DGLBlocks: every node type and relation of the schema in every block
    (empty ones included, as DGL's own sampler gives them); srcnodes[type].data[dgl.NID]
    holds the dataset's IDs within that type (node ID - the type's offset)."""
    import dgl
    import torch

    types, local = typed_local_ids(mfgs.nodes, schema)
    names = schema.type_names
    # each type's IDs in node order, once: a block's sources of a type are a prefix of them
    ids = [torch.from_numpy(mfgs.nodes[types == t] - schema.offsets[t]).to(device) for t in range(len(names))]
    blocks = []
    for i in range(mfgs.num_layers):
        src, dst = mfgs.edges(i)
        rel = mfgs.edge_type[mfgs.edge_ptr[i]:mfgs.edge_ptr[i + 1]]
        ns, nd = int(mfgs.num_src[i]), int(mfgs.num_dst[i])
        data = {}
        for r, relation in enumerate(schema.relations):
            mine = rel == r
            data[relation] = (torch.from_numpy(local[src[mine]]), torch.from_numpy(local[dst[mine]]))
        src_counts = np.bincount(types[:ns], minlength=len(names))
        dst_counts = np.bincount(types[:nd], minlength=len(names))
        block = dgl.create_block(data, num_src_nodes=dict(zip(names, src_counts.tolist())),
                                 num_dst_nodes=dict(zip(names, dst_counts.tolist())), device=device)
        for t, name in enumerate(names):
            block.srcnodes[name].data[dgl.NID] = ids[t][: src_counts[t]]
            block.dstnodes[name].data[dgl.NID] = ids[t][: dst_counts[t]]
        blocks.append(block)
    return blocks
