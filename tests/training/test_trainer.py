"""In-memory training: accuracy, determinism, checkpoints and resume, original-ID predictions."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnssd.core.config import ConfigError, config_from_dict
from gnnssd.datasets import PlanetoidSource, synthetic_source
from gnnssd.sampler import node_order
from gnnssd.storage_format import write_store
from gnnssd.training.tasks import Trainer


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("tiny") / "store", synthetic_source("tiny"), order=node_order("degree"))


def _config(store, run_dir, **sections):
    data = {"store": str(store), "run_dir": str(run_dir), "seed": 7,
            "model": {"name": "sage", "hidden": 32, "layers": 2},
            "sampler": {"fanouts": [5, 5], "batch_size": 256},
            "train": {"epochs": 3, "lr": 0.01, "progress": False}}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return config_from_dict(data)


def _params(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
def test_each_model_learns(tiny_store, tmp_path, model):
    trainer = Trainer(_config(tiny_store, tmp_path / "run", model={"name": model},
                              train={"epochs": 4}))
    history = trainer.fit()
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert trainer.evaluate("test")["accuracy"] > 0.4  # 8 classes: chance is 0.125


def test_cora_graphsage_accuracy(planetoid_root, tmp_path):
    store = write_store(tmp_path / "cora", PlanetoidSource(planetoid_root, "cora"))
    trainer = Trainer(_config(store, tmp_path / "run", seed=0,
                              model={"hidden": 64}, sampler={"fanouts": [10, 10], "batch_size": 140},
                              train={"epochs": 40, "weight_decay": 5e-4}))
    trainer.fit()
    assert trainer.evaluate("test")["accuracy"] >= 0.75


def test_same_seed_same_run(tiny_store, tmp_path):
    a = Trainer(_config(tiny_store, tmp_path / "a", deterministic=True))
    b = Trainer(_config(tiny_store, tmp_path / "b", deterministic=True))
    ha, hb = a.fit(), b.fit()
    assert [r["train_loss"] for r in ha] == [r["train_loss"] for r in hb]
    for k, v in _params(a).items():
        torch.testing.assert_close(v, _params(b)[k], rtol=0, atol=0)


def test_resume_equals_uninterrupted_run(tiny_store, tmp_path):
    straight = Trainer(_config(tiny_store, tmp_path / "straight", deterministic=True,
                               train={"epochs": 4}))
    straight.fit()
    first = Trainer(_config(tiny_store, tmp_path / "split", deterministic=True, train={"epochs": 2}))
    first.fit()
    resumed = Trainer(_config(tiny_store, tmp_path / "split", deterministic=True,
                              train={"epochs": 4}))
    resumed.fit(resume=True)
    for k, v in _params(straight).items():
        torch.testing.assert_close(v, _params(resumed)[k], rtol=0, atol=0)
    epochs = [r["epoch"] for r in resumed.metrics.read()]
    assert epochs == [1, 2, 3, 4]


def test_existing_checkpoint_needs_resume(tiny_store, tmp_path):
    Trainer(_config(tiny_store, tmp_path / "run", train={"epochs": 1})).fit()
    with pytest.raises(RuntimeError, match="holds a checkpoint of epoch 1; pass --resume"):
        Trainer(_config(tiny_store, tmp_path / "run", train={"epochs": 2})).fit()


def test_resume_with_other_model_is_refused(tiny_store, tmp_path):
    Trainer(_config(tiny_store, tmp_path / "run", train={"epochs": 1})).fit()
    other = Trainer(_config(tiny_store, tmp_path / "run", model={"hidden": 16}, train={"epochs": 2}))
    with pytest.raises(ConfigError, match="model: the checkpoint .* was trained with"):
        other.fit(resume=True)


def test_predictions_are_in_original_ids(tiny_store, tmp_path):
    """Scored against the generator's labels (original IDs), predictions match evaluate()."""
    trainer = Trainer(_config(tiny_store, tmp_path / "run"))
    trainer.fit()
    source = synthetic_source("tiny")
    test_original = source.load_splits()["test"]
    predicted = trainer.predict(test_original)
    accuracy = np.mean(predicted == source.load_labels()[test_original])
    assert accuracy == pytest.approx(trainer.evaluate("test")["accuracy"], abs=1e-6)
    everything = trainer.predict()
    np.testing.assert_array_equal(everything[test_original], predicted)


@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
def test_compiled_models_equal_dgl_nn_models(tiny_store, model):
    """`model.compile: true` (UDF layers through the MP-DFG compiler) computes what the
    dgl.nn layers compute, with the same parameters, on sampled blocks."""
    import dgl

    from gnnssd.core.config import ModelConfig
    from gnnssd.loading.types import load_features, store_graph
    from gnnssd.models.builtin import build_model
    from gnnssd.storage_format import Store

    store = Store.open(tiny_store)
    cfg = ModelConfig(name=model, hidden=32, layers=2, dropout=0.0, heads=2)
    reference = build_model(ModelConfig(**{**cfg.__dict__, "compile": False}), store.feat_dim, store.num_classes)
    compiled = build_model(cfg, store.feat_dim, store.num_classes)
    compiled.load_state_dict(reference.state_dict())
    graph = store_graph(store)
    dgl.seed(0)
    inputs, _, blocks = dgl.dataloading.NeighborSampler([5, 5]).sample(graph, torch.arange(300))
    x = load_features(store)[inputs]
    torch.testing.assert_close(compiled(blocks, x), reference(blocks, x), rtol=1e-4, atol=1e-5)


def test_trainer_builds_the_tasks_trainer_and_a_task_trainer_subclass_runs(tiny_store, tmp_path):
    """Trainer(config) picks the task's trainer (every task trainer is a Trainer); a user
    changes a task by subclassing its trainer, not the picker, which refuses subclasses."""
    from gnnssd.training.node_task import NodeTrainer
    from gnnssd.training.trainer import TaskTrainer

    trainer = Trainer(_config(tiny_store, tmp_path / "run", train={"epochs": 1}))
    try:
        assert type(trainer) is NodeTrainer and isinstance(trainer, (Trainer, TaskTrainer))
    finally:
        trainer.close()

    class Smoothed(NodeTrainer):  # a user's loss: label smoothing, through the step hook
        def _batch_loss(self, batch):
            logits = self.train_model(batch.blocks, batch.x)
            loss = torch.nn.functional.cross_entropy(logits, batch.y, ignore_index=-1, label_smoothing=0.1)
            self.steps = getattr(self, "steps", 0) + 1
            return loss, int(batch.labelled.sum()), int((logits.argmax(1) == batch.y).sum())

    mine = Smoothed(_config(tiny_store, tmp_path / "mine", train={"epochs": 1}))
    try:
        history = mine.fit()
    finally:
        mine.close()
    assert mine.steps == history[0]["batches"] > 0 and isinstance(mine, Trainer)
    with pytest.raises(TypeError, match="subclass one of .*NodeTrainer"):
        class Picker(Trainer):  # noqa: F841 - defining it is the error
            pass
    with pytest.raises(ConfigError, match="task: 'graph'"):
        Trainer(_config(tiny_store, tmp_path / "x", task="graph"))


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_max_batches_trains_the_first_part_of_each_epoch(tiny_store, tmp_path, features):
    """train.max_batches: each epoch takes that many steps (a whole epoch takes more),
    then evaluates, in memory and out of core."""
    from gnnssd.training.node_task import NodeTrainer

    class Counting(NodeTrainer):
        def _batch_loss(self, batch):
            self.steps = getattr(self, "steps", 0) + 1
            return super()._batch_loss(batch)

    whole = Counting(_config(tiny_store, tmp_path / "whole", features=features, train={"epochs": 1}))
    part = Counting(_config(tiny_store, tmp_path / "part", features=features,
                            train={"epochs": 2, "max_batches": 2}))
    try:
        full = whole.fit()[0]["batches"]
        history = part.fit()
    finally:
        whole.close()
        part.close()
    assert full > 2
    assert [r["batches"] for r in history] == [2, 2] and part.steps == 4
    assert all("valid_acc" in r for r in history)
