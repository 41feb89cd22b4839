"""`task: node`: node classification on a store's labelled splits (cross-entropy on the
training nodes' labels; accuracy on valid/test; a class per node by `predict`)."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from gnnssd.core import Config, ConfigError
from gnnssd.loading import MiniBatch, NodeLoader, check_nodes
from gnnssd.storage_format import Store

from . import distributed
from .trainer import TaskTrainer


class NodeTrainer(TaskTrainer):
    """Trains a node classifier: the model maps `(blocks, x)` to a score per class."""

    SELECTION = "acc"
    SELECTION_NAME = "accuracy"
    ENCODER_PREFIX = ""
    CLASSIFIES = True

    def _check_store(self) -> None:
        if self.store.num_classes < 2:
            raise ConfigError(f"store {self.config.store}: {self.store.num_classes} classes; need >= 2")
        if len(self.store.train_idx) == 0:
            raise ConfigError(f"store {self.config.store}: the train split is empty; nothing to train on")

    def _split_size(self, split: str) -> int:
        return len(self.store.split(split))

    @classmethod
    def output_dim(cls, config: Config, store: Store) -> int:
        """A score per class."""
        return store.num_classes

    def _make_loader(self) -> NodeLoader:
        """The training nodes' loader over the source (a rank loads its shard of the seeds);
        evaluation takes loaders of other seeds over the same source (`with_seeds`)."""
        cfg = self.config
        return NodeLoader(self.source, self.store.train_idx, fanouts=cfg.sampler.fanouts,
                          batch_size=cfg.sampler.batch_size, shuffle=True, seed=cfg.seed,
                          rank=self.ranks.rank, world_size=self.ranks.world_size,
                          seed_order=cfg.sampler.seed_order, seed_window=cfg.sampler.seed_window,
                          reuse_epochs=cfg.sampler.reuse_epochs, first_epoch=1)

    def _batch_loss(self, batch: MiniBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Cross-entropy over the labelled output nodes (label -1 is left out); the counts
        stay tensors on the batch's device (the trainer sums them without a host sync)."""
        logits = self.train_model(batch.model_blocks, batch.x)
        y = batch.y
        loss = F.cross_entropy(logits, y, ignore_index=-1)
        return loss, batch.labelled.sum(), (logits.argmax(1) == y).sum()

    def _split_scores(self, split: str) -> dict[str, float]:
        return {"acc": self.evaluate(split)["accuracy"]}

    @torch.no_grad()
    def _scored_batches(self, nodes: np.ndarray) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per evaluation mini-batch of `nodes` (the evaluation fanouts), its logits, node
        IDs and labels on the CPU: callers fold them batch by batch, so no logits of every
        node are held (papers' test split: 222k x 172 floats, several copies)."""
        if not len(nodes):
            return
        fanouts, batch_size = self.config.sampler.evaluation(self.store.num_edges)
        self.model.eval()
        for batch in self.loader.with_seeds(nodes, fanouts=fanouts, batch_size=batch_size):
            scored = (self.model(batch.model_blocks, batch.x).cpu(), _target_ids(batch).cpu(),
                      batch.y.cpu())
            del batch  # not held while the next one is made: one x in memory
            yield scored

    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Accuracy and loss of the current model on 'train', 'valid' or 'test' (each rank
        scores its share of the nodes; the sums are added over the ranks)."""
        local = [0.0, 0.0, 0.0]  # correct, loss sum, nodes
        for logits, _, y in self._scored_batches(self.ranks.split(self.store.split(split))):
            local[0] += float((logits.argmax(1) == y).sum())
            local[1] += float(F.cross_entropy(logits, y, reduction="sum"))
            local[2] += float(len(y))
        self.progress.enter()
        correct, loss_sum, count = distributed.sum_over_ranks(local, self.ranks)
        if count == 0:
            return {"accuracy": float("nan"), "loss": float("nan"), "nodes": 0}
        return {"accuracy": correct / count, "loss": loss_sum / count, "nodes": int(count)}

    def predict(self, nodes: np.ndarray | None = None) -> np.ndarray:
        """Predicted class of each of `nodes` (the dataset's IDs; all nodes by default: the
        result is then indexed by node ID)."""
        count = self.store.schema.node_types[self.store.schema.type_id(self.store.schema.target)].count
        nodes = np.arange(count) if nodes is None else check_nodes(nodes, count, "nodes")
        ids, classes = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        for logits, batch_ids, _ in self._scored_batches(self.ranks.split(nodes)):
            ids.append(batch_ids.numpy())
            classes.append(logits.argmax(1).numpy())
        order, classes = distributed.gather_arrays((np.concatenate(ids), np.concatenate(classes)), self.ranks)
        by_node = np.empty(count, dtype=np.int64)
        by_node[order] = classes
        return by_node[nodes]


def _target_ids(batch: MiniBatch) -> torch.Tensor:
    """The output node IDs of a mini-batch (of the one type of its seeds in the typed form)."""
    if batch.typed:
        return next(ids for ids in batch.output_nodes.values() if len(ids))
    return batch.output_nodes
