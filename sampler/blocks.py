"""Message-flow graphs of one mini-batch as compact arrays, and their DGL form.

Sampling appends each hop's new source nodes after the nodes it already has, so every
block's destination and source nodes are prefixes of one `nodes` array (DGL's block
semantics: destination nodes first among the sources). One array per mini-batch is then
enough to describe all layers, to save a plan, and to gather the input features.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MFGs:
    """The blocks of one mini-batch, input layer first (the order of DGL's `blocks`)."""

    nodes: np.ndarray  # int64 node IDs; block i's sources are nodes[:num_src[i]]
    num_src: np.ndarray  # int64 (L,)
    num_dst: np.ndarray  # int64 (L,); block i's destinations are nodes[:num_dst[i]]
    edge_ptr: np.ndarray  # int64 (L+1,): block i's edges are edge_*[edge_ptr[i]:edge_ptr[i+1]]
    edge_src: np.ndarray  # int32 local source index
    edge_dst: np.ndarray  # int32 local destination index

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

    def edges(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Local (source, destination) indices of block i's edges."""
        a, b = self.edge_ptr[i], self.edge_ptr[i + 1]
        return self.edge_src[a:b], self.edge_dst[a:b]

    def equals(self, other: "MFGs") -> bool:
        return all(
            np.array_equal(getattr(self, f), getattr(other, f))
            for f in ("nodes", "num_src", "num_dst", "edge_ptr", "edge_src", "edge_dst")
        )


def to_dgl_blocks(mfgs: MFGs, device: str = "cpu") -> list:
    """DGLBlocks for `mfgs` (no re-sampling); srcdata/dstdata[dgl.NID] hold node IDs."""
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
