"""Link prediction on several ranks: each rank's edge batches are its shard of the one-process
epoch's (the same positives and negatives), `--nproc 2` trains on a link store with the ssd
budget split between the local ranks, and its MRR is one process's within seed noise."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from gnnssd.datasets import synthetic_source
from gnnssd.datasets.hetero_synthetic import HeteroSyntheticSource
from gnnssd.loading import EdgeLoader
from gnnssd.sampler import node_order
from gnnssd.sampler.seed_order import shard
from gnnssd.storage_format import Store, write_store
from gnnssd.training.checkpoint import load_checkpoint

from tests.training.test_hetero_link import SIGNAL

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def link_store(tmp_path_factory):
    """A graph whose edges mostly stay inside neighbourhoods of 16 nodes (so a GNN ranks
    held-out edges above chance), reordered on disk, 10% of its edges held out for
    validation and 10% for test."""
    source = synthetic_source(num_nodes=2000, feat_dim=16, num_classes=4, avg_degree=8, local_fraction=0.9,
                              local_size=16, train_fraction=0.3)
    out = tmp_path_factory.mktemp("link-ranks") / "store"
    write_store(out, source, order=node_order("degree"), edge_split=(0.8, 0.1, 0.1), split_seed=5,
                eval_negatives=50)
    return out


def _pairs(batch) -> tuple[np.ndarray, np.ndarray]:
    out = batch.output_nodes.numpy()
    return out[batch.pos.numpy()], out[batch.neg.numpy()]


@pytest.mark.parametrize("features, world", [("memory", 2), ("memory", 3), ("ssd", 2)])
def test_each_rank_takes_its_shard_of_the_one_process_batches(link_store, features, world):
    store = Store.open(link_store)
    train = np.asarray(store.link_edges("train"))
    options = dict(fanouts=[3, 3], batch_size=100, negatives=2, features=features, memory_budget="16MiB",
                   seed=2, device="cpu")
    with EdgeLoader(store, train, rank=0, world_size=1, **options) as one:
        one.set_epoch(3)
        whole = [_pairs(batch) for batch in one]
    for rank in range(world):
        with EdgeLoader(store, train, rank=rank, world_size=world, **options) as loader:
            loader.set_epoch(3)
            got = [_pairs(batch) for batch in loader]
        expected = [whole[k] for k in shard(np.arange(len(whole)), rank, world)]
        assert len(got) == len(loader) == len(expected) == -(-len(whole) // world)
        for (pos, neg), (pos_one, neg_one) in zip(got, expected):
            np.testing.assert_array_equal(pos, pos_one)
            np.testing.assert_array_equal(neg, neg_one)


def _train(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gnnssd", "train", "--config", str(config), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=600, env=dict(os.environ))


def _config(folder: Path, store: Path, batch_size: int) -> Path:
    folder.mkdir(parents=True)
    data = {"store": str(store), "run_dir": str(folder / "run"), "task": "link", "seed": 1,
            "features": "ssd", "model": {"name": "sage", "hidden": 32, "dropout": 0.0},
            "sampler": {"fanouts": [5, 5], "batch_size": batch_size},
            "train": {"epochs": 4, "lr": 0.01, "progress": False},
            "ssd": {"memory_budget": "32MiB"}, "link": {"negatives": 2, "eval_negatives": 50}}
    (folder / "config.yaml").write_text(yaml.safe_dump(data))
    return folder / "config.yaml"


def test_nproc_2_trains_a_link_predictor_as_one_process_does(link_store, tmp_path):
    """Two ranks of 256 edges a batch and one process of 512 (the same edges a step, the
    same steps) on the same store (split, fixed evaluation negatives): both finish, rank 0
    alone writes, and their test MRR agree within seed noise, above chance (1 positive
    among 51: MRR about 0.09; one process reaches about 0.24 here)."""
    runs = {}
    for name, batch_size, args in (("one", 512, ()), ("two", 256, ("--nproc", "2"))):
        done = _train(_config(tmp_path / name, link_store, batch_size), *args)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = [json.loads(line) for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in runs["two"]] == [1, 2, 3, 4]
    assert load_checkpoint(tmp_path / "two" / "run")["world_size"] == 2
    edges = len(Store.open(link_store).link_edges("train"))
    assert runs["one"][0]["batches"] == -(-edges // 512)
    assert runs["two"][0]["batches"] == -(-(-(-edges // 256)) // 2)
    one, two = runs["one"][-1]["test_mrr"], runs["two"][-1]["test_mrr"]
    assert one > 0.15 and two > 0.15
    assert abs(one - two) < 0.06, (one, two)


def test_nproc_2_trains_a_link_predictor_on_a_relation_of_a_typed_store_as_one_process_does(tmp_path):
    """R-GCN embeds every node type, the loss uses the relation's two ends: the other types'
    last-layer parameters get no gradient, which data-parallel training must allow. On a
    typed graph whose citations mostly stay within a class (SIGNAL), two ranks of 128
    `cites` edges a batch and one process of 256 reach the same test MRR within seed
    noise, above chance (1 positive among 31: about 0.13)."""
    store = write_store(tmp_path / "store", HeteroSyntheticSource(SIGNAL), edge_split=(0.8, 0.1, 0.1),
                        edge_split_relation="cites", split_seed=3, eval_negatives=30)
    mrr = {}
    for name, batch_size, args in (("one", 256, ()), ("two", 128, ("--nproc", "2"))):
        config = _config(tmp_path / name, store, batch_size)
        data = yaml.safe_load(config.read_text())
        data.update(model={"name": "rgcn", "hidden": 32, "layers": 2, "dropout": 0.0},
                    sampler={"fanouts": [{"cites": 5, "cited_by": 5, "written_by": 3, "writes": 3}, 5],
                             "batch_size": batch_size},
                    train={**data["train"], "epochs": 3}, link={"negatives": 2, "eval_negatives": 30})
        config.write_text(yaml.safe_dump(data))
        done = _train(config, *args)
        assert done.returncode == 0, done.stderr[-3000:]
        records = [json.loads(line) for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [r["epoch"] for r in records] == [1, 2, 3]
        mrr[name] = records[-1]["test_mrr"]
    print(f"typed link test MRR: one process {mrr['one']:.4f}, two ranks {mrr['two']:.4f}")
    assert min(mrr.values()) > 1.5 * float(np.mean(1 / np.arange(1, 32))), mrr
    assert abs(mrr["one"] - mrr["two"]) < 0.08, mrr
