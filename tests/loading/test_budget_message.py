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


def test_the_loader_says_whether_its_read_planner_knows_the_drive(tmp_path, caplog) -> None:
    """An uncalibrated store's planner prices writes like reads (CostModel.default); the
    loader's log says so and names the command that measures the drive."""
    from gnnssd import NodeLoader
    from gnnssd.sampler.readplan import CostModel
    from gnnssd.storage_format import Store

    store = Store.open(write_store(tmp_path / "store", synthetic_source("tiny")))

    def features_line() -> str:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="gnnssd.ssd"):
            NodeLoader(store, store.original_ids(store.train_store_ids[:64]), fanouts=[2, 2], batch_size=32,
                       features="ssd", memory_budget="16MiB").close()
        return next(r.getMessage() for r in caplog.records if r.getMessage().startswith("features from"))

    line = features_line()
    assert line.endswith(f"reads planned with a default model of the drive (reads 1.10 GB/s, writes 1.00 GB/s): "
                         f"`gnnssd calibrate {store.path}` measures this one"), line
    CostModel(request_s=1e-5, read_bw=2.9e9, write_bw=4.1e8).save(store.path / "calibration.json")
    line = features_line()
    assert line.endswith("reads planned with the drive's calibration (reads 2.90 GB/s, writes 0.41 GB/s)"), line
