"""The ssd loader's budget line names what its x arrays are sized for and the keys that size
them: a budget exceeded by evaluation's all-neighbour mini-batches says so, and which keys
shrink them, instead of only "raise memory_budget"."""
from __future__ import annotations

import logging

from gnnssd.core.config import config_from_dict
from gnnssd.datasets import synthetic_source
from gnnssd.storage_format import write_store
from gnnssd.training.tasks import Trainer


def test_x_arrays_over_the_budget_from_evaluation_name_its_keys(tmp_path, caplog) -> None:
    store = write_store(tmp_path / "store", synthetic_source(num_nodes=10_000, feat_dim=128, num_classes=4,
                                                             avg_degree=10, train_fraction=0.3))
    config = config_from_dict({
        "store": str(store), "run_dir": str(tmp_path / "run"), "features": "ssd", "seed": 3,
        "model": {"name": "sage", "hidden": 16}, "sampler": {"fanouts": [2, 2], "batch_size": 50},
        "train": {"epochs": 1, "progress": False}, "ssd": {"memory_budget": "16MiB", "mega_batch": 4}})
    with caplog.at_level(logging.INFO, logger="gnnssd.ssd"):
        Trainer(config).close()
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("memory_budget"))
    assert "over by" in line
    assert ("the x arrays are sized for the largest sampled mini-batch, evaluation's (sampler.eval_fanouts "
            "[-1, -1] (unset: all neighbours), sampler.eval_batch_size 4096)") in line
    assert "training's (sampler.fanouts [2, 2], sampler.batch_size 50)" in line
    assert line.endswith("smaller eval_fanouts or eval_batch_size shrink them")


def test_x_arrays_sized_for_training_name_the_training_keys(tmp_path, caplog) -> None:
    store = write_store(tmp_path / "store", synthetic_source("tiny"))
    config = config_from_dict({
        "store": str(store), "run_dir": str(tmp_path / "run"), "features": "ssd", "seed": 3,
        "model": {"name": "sage", "hidden": 16},
        "sampler": {"fanouts": [5, 5], "batch_size": 200, "eval_fanouts": [2, 2], "eval_batch_size": 20},
        "train": {"epochs": 1, "progress": False}, "ssd": {"memory_budget": "64MiB", "mega_batch": 4}})
    with caplog.at_level(logging.INFO, logger="gnnssd.ssd"):
        Trainer(config).close()
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("memory_budget"))
    assert "the x arrays are sized for the largest sampled mini-batch, training's (sampler.fanouts [5, 5], " \
           "sampler.batch_size 200)" in line
