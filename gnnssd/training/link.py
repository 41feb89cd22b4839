"""`task: link`: link prediction on a store's edge split.

The encoder is any node model (built-in or the user's) producing one embedding per node
from blocks and features; a decoder scores a pair of embeddings (dot product, or an MLP on
their element-wise product). Training draws `link.negatives` corrupted destinations per
positive edge (EdgeLoader); evaluation ranks every valid/test edge against its
`link.eval_negatives` fixed negatives (ogbl-citation2's protocol): MRR and Hits@K.

On a heterogeneous store the split is of one relation (`store.link_relation`): the
encoder (rgcn, rgat, or the user's) returns a dict of embeddings by node type and the
decoder scores the relation's source-type embedding against its destination-type one.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gnnssd.core import Config, ConfigError
from gnnssd.loading import EdgeBatch, EdgeLoader
from gnnssd.models import store_model
from gnnssd.storage_format import Store

from .trainer import TaskTrainer

HITS_AT = (1, 3, 10, 50, 100)
SCORE_CHUNK = 4096  # evaluation edges scored at once


class EdgeDecoder(nn.Module):
    """Score of the pair (u, v) from their embeddings: `dot` or `mlp` (hidden-wide)."""

    def __init__(self, kind: str, dim: int):
        super().__init__()
        self.kind = kind
        self.mlp = (nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 1))
                    if kind == "mlp" else None)

    def forward(self, h_src: torch.Tensor, h_dst: torch.Tensor) -> torch.Tensor:
        if self.mlp is None:
            return (h_src * h_dst).sum(-1)
        return self.mlp(h_src * h_dst).squeeze(-1)


class LinkModel(nn.ModuleDict):
    """The encoder and the edge decoder ("encoder", "decoder") as one module whose forward
    is the training loss, so that data-parallel training (DDP) averages the gradients of both."""

    def __init__(self, encoder: nn.Module, decoder: EdgeDecoder):
        super().__init__({"encoder": encoder, "decoder": decoder})

    def forward(self, batch: EdgeBatch) -> torch.Tensor:
        return link_loss(self.decoder, self.encoder(batch.model_blocks, batch.x), batch)


def link_loss(decoder: EdgeDecoder, h: torch.Tensor | dict[str, torch.Tensor], batch: EdgeBatch) -> torch.Tensor:
    """Binary cross-entropy of the positives (label 1) and negatives (label 0); `h` by
    node type on a heterogeneous store (the relation's ends)."""
    h_src, h_dst = (h, h) if batch.relation is None else (h[batch.relation[0]], h[batch.relation[2]])
    pos = decoder(h_src[batch.pos[:, 0]], h_dst[batch.pos[:, 1]])
    neg = decoder(h_src[batch.neg[:, 0]], h_dst[batch.neg[:, 1]])
    scores = torch.cat([pos, neg])
    labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
    return F.binary_cross_entropy_with_logits(scores, labels)


def ranking_metrics(pos: np.ndarray, neg: np.ndarray) -> dict[str, float]:
    """MRR and Hits@K of each positive score pos[i] among its negatives neg[i, :].

    Ties count half (OGB's evaluator: the mean of the optimistic and pessimistic rank)."""
    pos = np.asarray(pos, np.float64)[:, None]
    neg = np.asarray(neg, np.float64)
    rank = 1 + 0.5 * ((neg > pos).sum(1) + (neg >= pos).sum(1))
    out = {"mrr": float(np.mean(1.0 / rank))}
    out.update({f"hits@{k}": float(np.mean(rank <= k)) for k in HITS_AT})
    return out


class LinkTrainer(TaskTrainer):
    """Trains an encoder and an edge decoder on a store's link split, as the config says.

    The run machinery (fit with checkpoints and resume, load_best) is TaskTrainer's; the
    epochs and the evaluation are link prediction's. `self.model` holds the encoder
    (any module taking (blocks, x) to embeddings of width `model.hidden`, e.g. the one
    passed as `model`) and the decoder.
    """

    SELECTION = "mrr"
    SELECTION_NAME = "MRR"
    ENCODER_PREFIX = "encoder."
    CLASSIFIES = False

    def _check_store(self) -> None:
        cfg = self.config
        if not self.store.has_link_split:
            raise ConfigError(f"task: link needs a store with a link split; {cfg.store} has none "
                              "(preprocess with --edge-split, or from an OGB link layout)")
        stored = self.store.manifest["link"]["eval_negatives"]
        if cfg.link.eval_negatives > stored:
            raise ConfigError(f"link.eval_negatives: {cfg.link.eval_negatives}, but the store holds "
                              f"{stored} negatives per evaluation edge")

    def _split_size(self, split: str) -> int:
        return len(self.store.link_edges(split))

    @classmethod
    def output_dim(cls, config: Config, store: Store) -> int:
        """The encoder's embedding width."""
        return config.model.hidden

    def _seeds_per_batch(self) -> int:
        """A batch's endpoints and negative destinations."""
        cfg = self.config
        return min(self.store.num_nodes, cfg.sampler.batch_size * (2 + cfg.link.negatives))

    def _make_loader(self) -> EdgeLoader:  # type: ignore[override]
        """The training edges' loader (a rank loads its shard of the batches); evaluation
        embeds nodes through the same source."""
        cfg = self.config
        edges = np.asarray(self.store.link_edges("train"))
        relation = self.store.link_relation
        return EdgeLoader(self.source, edges if relation is None else {relation[1]: edges},
                          fanouts=cfg.sampler.fanouts, batch_size=cfg.sampler.batch_size,
                          negatives=cfg.link.negatives, rank=self.ranks.rank, world_size=self.ranks.world_size)

    def _build_model(self, model: nn.Module | None) -> nn.Module:
        """The encoder (the user's `model` or the configured one, to `model.hidden`-wide
        embeddings; on a heterogeneous store a dict of them by node type) and the edge decoder."""
        cfg = self.config
        encoder = model if model is not None else store_model(cfg.model, self.store, cfg.model.hidden, every_type=True)
        return LinkModel(encoder, EdgeDecoder(cfg.link.decoder, cfg.model.hidden))

    @property
    def encoder(self) -> nn.Module:
        return self.model.encoder

    # --- training ------------------------------------------------------------------------

    def _batch_loss(self, batch: EdgeBatch) -> tuple[torch.Tensor, int, None]:  # type: ignore[override]
        """Binary cross-entropy of the batch's positive and negative edges."""
        return self.train_model(batch), len(batch.pos), None

    def _split_scores(self, split: str) -> dict[str, float]:
        return {k: v for k, v in self.evaluate(split).items() if k != "edges"}

    # --- evaluation ------------------------------------------------------------------------

    @torch.no_grad()
    def embeddings(self, nodes: np.ndarray, node_type: str | None = None) -> torch.Tensor:
        """Embeddings of the sorted unique dataset IDs `nodes` (on a heterogeneous store of
        `node_type`), in that order, computed through the loader's features (evaluation
        fanouts, out of core in ssd mode)."""
        cfg = self.config
        fanouts, batch_size = cfg.sampler.evaluation(self.store.num_edges)
        self.model.eval()
        out = torch.empty(len(nodes), cfg.model.hidden)
        seeds = nodes if node_type is None else {node_type: nodes}
        for batch in self.loader.node_batches(seeds, fanouts, batch_size):
            h, ids = self.encoder(batch.model_blocks, batch.x), batch.output_nodes
            if node_type is not None:
                h, ids = h[node_type], ids[node_type]
            out[np.searchsorted(nodes, ids.numpy())] = h.cpu()
        return out

    @torch.no_grad()
    def scores(self, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The split's edges (E, 2), their scores (E,) and their fixed negatives' scores
        (E, K) (K = link.eval_negatives), the input of a ranking evaluator such as OGB's
        (`y_pred_pos`, `y_pred_neg`); node IDs are the dataset's."""
        if split not in ("valid", "test"):
            raise ValueError(f"link evaluation is on 'valid' or 'test', not {split!r} (the train edges "
                             "have no fixed negatives)")
        edges = np.asarray(self.store.link_edges(split))
        negatives = np.asarray(self.store.link_negatives(split))[:, :self.config.link.eval_negatives]
        if len(edges) == 0:
            return edges, np.empty(0, np.float32), np.empty(negatives.shape, np.float32)
        src_type, _, dst_type = self.store.link_relation or (None, None, None)  # types of a typed store's ends
        ends: dict[str | None, list[np.ndarray]] = {}
        for node_type, ids in ((src_type, edges[:, 0]), (dst_type, edges[:, 1]), (dst_type, negatives.ravel())):
            ends.setdefault(node_type, []).append(ids)
        nodes = {node_type: np.unique(np.concatenate(ids)) for node_type, ids in ends.items()}
        h = {node_type: self.embeddings(ids, node_type) for node_type, ids in nodes.items()}
        decoder = self.model.decoder.cpu()
        pos_scores, neg_scores = [], []
        for lo in range(0, len(edges), SCORE_CHUNK):
            h_src = h[src_type][np.searchsorted(nodes[src_type], edges[lo:lo + SCORE_CHUNK, 0])]
            h_dst = h[dst_type][np.searchsorted(nodes[dst_type], edges[lo:lo + SCORE_CHUNK, 1])]
            n = np.searchsorted(nodes[dst_type], negatives[lo:lo + SCORE_CHUNK])
            pos_scores.append(decoder(h_src, h_dst).numpy())
            neg_scores.append(decoder(h_src[:, None, :].expand(-1, n.shape[1], -1), h[dst_type][n]).numpy())
        self.model.decoder.to(self.device)
        return edges, np.concatenate(pos_scores), np.concatenate(neg_scores)

    def evaluate(self, split: str = "test") -> dict[str, float]:
        """MRR and Hits@1/3/10/50/100 of the split's edges against their fixed negatives."""
        edges, pos, neg = self.scores(split)
        if len(edges) == 0:
            return {"mrr": float("nan"), **{f"hits@{k}": float("nan") for k in HITS_AT}, "edges": 0}
        return {**ranking_metrics(pos, neg), "edges": len(edges)}
