"""Link prediction: edge splits in the store, OGB link layouts, reverse-edge exclusion,
EdgeLoader, ranking metrics and `task: link` training."""
from __future__ import annotations

import gzip
import json
import shutil

import dgl
import numpy as np
import pytest
import torch
import yaml
from dgl.nn import SAGEConv

import gnnssd
from gnnssd.cli.commands import main
from gnnssd.core.config import config_from_dict
from gnnssd.datasets import ArraySource, OGBLinkSource
from gnnssd.loading.edge_loader import EdgeLoader
from gnnssd.loading.types import store_graph
from gnnssd.sampler import NeighborSampler, node_order
from gnnssd.storage_format import DatasetError, Store, StoreError, write_store
from gnnssd.storage_format.link_split import pair_keys
from gnnssd.storage_format.manifest import manifest_checksum
from gnnssd.training.link import LinkTrainer, ranking_metrics
from gnnssd.training.rundir import RunDirBusy, RunLock

from tests.conftest import random_graph_arrays


def _graph_pairs(store: Store) -> set[tuple[int, int]]:
    """Every edge of the stored graph as an (src, dst) pair of store IDs."""
    indptr, indices = np.asarray(store.indptr), np.asarray(store.indices)
    dst = np.repeat(np.arange(store.num_nodes), np.diff(indptr))
    return set(zip(indices.tolist(), dst.tolist()))


@pytest.fixture(scope="module")
def link_store(tmp_path_factory):
    """A random undirected graph, reordered on disk (store IDs differ from original IDs)."""
    arrays = random_graph_arrays(num_nodes=400, num_edges=3000, dim=16)
    source = ArraySource(**arrays, symmetric=True)
    out = tmp_path_factory.mktemp("link") / "store"
    write_store(out, source, order=node_order("degree"), edge_split=(0.8, 0.1, 0.1), split_seed=5,
                eval_negatives=50)
    return out, arrays


def test_edge_split_holds_out_valid_and_test_edges_in_both_directions(link_store):
    path, arrays = link_store
    store = Store.open(path)
    graph = _graph_pairs(store)
    src, dst = arrays["edges"]
    distinct = np.unique(pair_keys(src, dst, 400)[src != dst])
    seen = []
    inv = np.asarray(store.inv)  # the graph's pairs are store rows; link_edges the dataset's IDs
    for split in ("train", "valid", "test"):
        edges = inv[np.asarray(store.link_edges(split))]
        in_graph = [(u, v) in graph and (v, u) in graph for u, v in edges.tolist()]
        if split == "train":
            assert all(in_graph)
        else:
            assert not any((u, v) in graph or (v, u) in graph for u, v in edges.tolist())
        perm = np.asarray(store.perm)  # back to original IDs: the input's own pairs
        seen.append(pair_keys(perm[edges[:, 0]], perm[edges[:, 1]], 400))
    seen = np.concatenate(seen)
    np.testing.assert_array_equal(np.sort(seen), distinct)  # a partition of the input's pairs
    assert store.manifest["link"]["edges"]["valid"] == round(0.1 * len(distinct))
    for split in ("valid", "test"):
        neg, edges = np.asarray(store.link_negatives(split)), np.asarray(store.link_edges(split))  # both original
        assert neg.shape == (len(edges), 50)
        assert not (neg == edges[:, 1:]).any()
    checked = store.verify()  # the link files are checksummed entries of the manifest
    assert {f"link_{name}.npy" for name in ("train", "valid", "test", "valid_neg", "test_neg")} <= set(checked)


def test_edge_split_is_seeded_and_validated(tmp_path):
    arrays = random_graph_arrays(num_nodes=100, num_edges=500)
    a = write_store(tmp_path / "a", ArraySource(**arrays), edge_split=(0.8, 0.1, 0.1), split_seed=1)
    b = write_store(tmp_path / "b", ArraySource(**arrays), edge_split=(0.8, 0.1, 0.1), split_seed=1)
    np.testing.assert_array_equal(Store.open(a).link_negatives("test"), Store.open(b).link_negatives("test"))
    plain = Store.open(write_store(tmp_path / "plain", ArraySource(**arrays)))
    with pytest.raises(StoreError, match="no link split"):
        plain.link_edges("train")


def _drop_file(manifest, name):
    del manifest["files"][name]


def _bump(section, key):
    section[key] += 1


@pytest.mark.parametrize("edit, message", [
    (lambda m: _drop_file(m, "link_test_neg.npy"), r"'files' lacks \['link_test_neg.npy'\]"),
    (lambda m: _bump(m["link"]["edges"], "test"), r"link_test.npy has shape \(\d+, 2\), but the link section"),
    (lambda m: _bump(m["link"], "eval_negatives"), r"link_valid_neg.npy has shape \(\d+, 50\)"),
])
def test_link_store_manifest_is_checked_like_the_rest(link_store, tmp_path, edit, message):
    """An edited link section is refused, naming the file, also when the manifest's own
    checksum was recomputed to match."""
    copy = tmp_path / "store"
    shutil.copytree(link_store[0], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=f"checksum|{message}"):
        Store.open(copy)
    manifest["checksum"] = manifest_checksum(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=message):
        Store.open(copy)


def test_edge_split_argument_errors_name_the_value(tmp_path, capsys):
    assert main(["preprocess", "synthetic", "--preset", "tiny", "--out", str(tmp_path / "s"),
                 "--edge-split", "0.9,0.2,0.1"]) == 2
    assert "--edge-split '0.9,0.2,0.1': expected three fractions" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def _write_ogb_link(root, layout: str, num_nodes: int = 60, dim: int = 4, seed: int = 0) -> dict:
    """A small dataset in OGB's link layout (ogbl-collab or ogbl-citation2)."""
    rng = np.random.default_rng(seed)
    raw, split = root / "raw", root / "split" / "time"
    raw.mkdir(parents=True)
    split.mkdir(parents=True)
    pairs = np.unique(np.sort(rng.integers(num_nodes, size=(400, 2)), axis=1), axis=0)
    pairs = rng.permutation(pairs[pairs[:, 0] != pairs[:, 1]])
    parts = {"valid": pairs[:20], "test": pairs[20:40], "train": pairs[40:]}
    with gzip.open(raw / "edge.csv.gz", "wt") as f:
        f.writelines(f"{u},{v}\n" for u, v in parts["train"])
    with gzip.open(raw / "node-feat.csv.gz", "wt") as f:
        f.writelines(",".join(f"{x:.3f}" for x in row) + "\n" for row in rng.random((num_nodes, dim)))
    with gzip.open(raw / "num-node-list.csv.gz", "wt") as f:
        f.write(f"{num_nodes}\n")
    negatives = {}
    for name, edges in parts.items():
        t = torch.from_numpy(edges)
        if layout == "collab":
            part = {"edge": t, "weight": torch.ones(len(t)), "year": torch.full((len(t),), 2019)}
            if name != "train":
                part["edge_neg"] = torch.randint(num_nodes, (len(t), 2))
        else:
            part = {"source_node": t[:, 0].clone(), "target_node": t[:, 1].clone()}
            if name != "train":
                negatives[name] = rng.integers(num_nodes, size=(len(t), 30))
                part["target_node_neg"] = torch.from_numpy(negatives[name])
        torch.save(part, split / f"{name}.pt")
    return {"parts": parts, "negatives": negatives}


@pytest.mark.parametrize("layout", ["collab", "citation2"])
def test_ogb_link_layouts(tmp_path, layout):
    written = _write_ogb_link(tmp_path / f"ogbl_{layout}", layout)
    source = OGBLinkSource(tmp_path / f"ogbl_{layout}", symmetric=True, eval_negatives=25)
    store = Store.open(write_store(tmp_path / "store", source, order=node_order("degree")))
    for name, edges in written["parts"].items():
        np.testing.assert_array_equal(np.asarray(store.link_edges(name)), edges)  # the dataset's own IDs
    graph = _graph_pairs(store)
    inv = np.asarray(store.inv)
    for u, v in inv[written["parts"]["test"]].tolist():
        assert (u, v) not in graph and (v, u) not in graph
    negatives = np.asarray(store.link_negatives("valid"))
    if layout == "citation2":  # the layout's own per-edge negatives
        np.testing.assert_array_equal(negatives, written["negatives"]["valid"])
    else:  # collab has shared negative pairs only: seeded per-edge ones instead
        assert negatives.shape == (20, 25)
        assert not (negatives == written["parts"]["valid"][:, 1:]).any()
    with pytest.raises(DatasetError, match="own link split"):
        write_store(tmp_path / "other", source, edge_split=(0.8, 0.1, 0.1))


def test_ogb_link_layout_refuses_non_tensor_pickles(tmp_path):
    _write_ogb_link(tmp_path / "ogbl_x", "citation2")
    torch.save({"source_node": object()}, tmp_path / "ogbl_x" / "split" / "time" / "valid.pt")
    with pytest.raises(DatasetError, match="valid.pt: holds more than tensors and arrays"):
        OGBLinkSource(tmp_path / "ogbl_x").load_link_split()


def _block_pairs(blocks) -> list[set[tuple[int, int]]]:
    """Each block's edges as global (src, dst) pairs."""
    out = []
    for block in blocks:
        s, d = block.edges()
        src_ids, dst_ids = block.srcdata[dgl.NID], block.dstdata[dgl.NID]
        out.append(set(zip(src_ids[s].tolist(), dst_ids[d].tolist())))
    return out


def _mfgs_pairs(mfgs) -> list[set[tuple[int, int]]]:
    pairs = []
    for i in range(mfgs.num_layers):
        s, d = mfgs.edges(i)
        pairs.append(set(zip(mfgs.nodes[s].tolist(), mfgs.nodes[d].tolist())))
    return pairs


def test_numba_exclusion_matches_dgl_reverse_id(link_store):
    """With all neighbours sampled, gnnssd's sampler excluding a batch's edges gives the
    blocks of DGL's edge-prediction sampler with exclude="reverse_id"."""
    store = Store.open(link_store[0])
    graph = store_graph(store)
    src, dst = graph.edges(order="eid")
    eid_of = {(u, v): e for e, (u, v) in enumerate(zip(src.tolist(), dst.tolist()))}
    reverse = torch.tensor([eid_of[(v, u)] for u, v in zip(src.tolist(), dst.tolist())])
    dgl_sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler([-1, -1]), exclude="reverse_id", reverse_eids=reverse)
    ours = NeighborSampler(store.indptr, store.indices, [-1, -1])
    train = np.asarray(store.inv)[np.asarray(store.link_edges("train"))]  # store rows, as the graph
    rng = np.random.default_rng(0)
    for _ in range(3):
        batch = train[rng.choice(len(train), 40, replace=False)]
        eids = torch.tensor([eid_of[(u, v)] for u, v in batch.tolist()])
        _, _, blocks = dgl_sampler.sample(graph, eids)
        seeds = np.unique(batch.ravel())
        mfgs = ours.sample(seeds, seed=1, exclude=batch)
        assert _mfgs_pairs(mfgs) == _block_pairs(blocks)
        excluded = {(u, v) for u, v in batch.tolist()} | {(v, u) for u, v in batch.tolist()}
        assert not any(layer & excluded for layer in _mfgs_pairs(mfgs))
        assert any(layer & excluded for layer in _mfgs_pairs(ours.sample(seeds, seed=1)))


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_edge_loader_batches(link_store, features):
    """Own edges never sampled, negatives never the positive, x = the stored rows, every
    positive once an epoch, pos/neg index the output nodes."""
    store = Store.open(link_store[0])
    train = np.asarray(store.link_edges("train"))
    rows = store.features_memmap()
    with EdgeLoader(store, (train[:, 0], train[:, 1]), fanouts=[4, 4], batch_size=64, negatives=3,
                    features=features, memory_budget="16MiB", hot_fraction=0.0, seed=2, device="cpu") as loader:
        setup = loader.io_stats()  # memory mode loads the features; ssd mode has no hot cache
        assert setup["bytes_read"] == (store.num_nodes * store.row_bytes if features == "memory" else 0)
        loader.set_epoch(1)
        seen = []
        for batch in loader:
            out = batch.output_nodes.numpy()
            pos, neg = out[batch.pos.numpy()], out[batch.neg.numpy()]
            excluded = {(u, v) for u, v in pos.tolist()} | {(v, u) for u, v in pos.tolist()}
            assert not any(layer & excluded for layer in _block_pairs(batch.blocks))
            assert len(neg) == 3 * len(pos)
            np.testing.assert_array_equal(neg[:, 0], np.repeat(pos[:, 0], 3))
            assert not (neg[:, 1] == np.repeat(pos[:, 1], 3)).any()
            np.testing.assert_array_equal(batch.x.numpy(), rows[np.asarray(store.inv)[batch.input_nodes.numpy()]])
            np.testing.assert_array_equal(batch.blocks[-1].dstdata[dgl.NID].numpy(), out)
            seen.append(pos)
        assert len(seen) == len(loader)
        np.testing.assert_array_equal(np.unique(np.concatenate(seen), axis=0), np.unique(train, axis=0))
        stats = loader.io_stats()
        assert (stats["bytes_read"] > 0) == (features == "ssd")


def test_ranking_metrics_match_a_direct_count():
    rng = np.random.default_rng(3)
    pos = rng.standard_normal(200)
    neg = rng.standard_normal((200, 120))
    neg[0, :5] = pos[0]  # ties count half
    ranks = np.array([1 + (n > p).sum() + 0.5 * (n == p).sum() for p, n in zip(pos, neg)])
    got = ranking_metrics(pos, neg)
    assert got["mrr"] == pytest.approx(np.mean(1 / ranks))
    for k in (10, 50, 100):
        assert got[f"hits@{k}"] == pytest.approx(np.mean(ranks <= k))


def _link_config(store, run_dir, **overrides):
    data = {"store": str(store), "run_dir": str(run_dir), "task": "link", "seed": 1,
            "model": {"name": "sage", "hidden": 32, "dropout": 0.0},
            "sampler": {"fanouts": [5, 5], "batch_size": 128},
            "train": {"epochs": 3, "lr": 0.01, "progress": False},
            "ssd": {"memory_budget": "16MiB"},
            "link": {"negatives": 2, "eval_negatives": 50}}
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    return config_from_dict(data)


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_link_training_learns_and_logs_ranking_metrics(link_store, tmp_path, features):
    trainer = LinkTrainer(_link_config(link_store[0], tmp_path / "run", features=features))
    history = trainer.fit()
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("valid_mrr", "test_mrr", "test_hits@10", "test_hits@50", "test_hits@100", "best_test_mrr"):
        assert 0 <= record[key] <= 1
    assert trainer.evaluate("test")["edges"] == len(Store.open(link_store[0]).link_edges("test"))
    trainer.close()


def test_link_training_on_a_store_without_validation_edges_keeps_the_latest_model(tmp_path):
    """An edge split with no valid edges trained to a KeyError; now the test split is scored,
    the latest epoch is the best one and the empty split is reported as skipped."""
    arrays = random_graph_arrays(num_nodes=200, num_edges=1200, dim=8)
    store = write_store(tmp_path / "store", ArraySource(**arrays, symmetric=True), edge_split=(0.9, 0.0, 0.1),
                        eval_negatives=20)
    trainer = LinkTrainer(_link_config(store, tmp_path / "run", train={"epochs": 2},
                                       link={"negatives": 1, "eval_negatives": 20}))
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    assert [r["best_epoch"] for r in history] == [1, 2]
    assert history[-1]["skipped_splits"] == ["valid"] and "valid_mrr" not in history[-1]
    assert history[-1]["best_test_mrr"] == history[-1]["test_mrr"] and 0 < history[-1]["test_mrr"] <= 1


def test_link_config_errors_name_the_problem(link_store, tmp_path):
    with pytest.raises(ValueError, match="link.decoder"):
        _link_config(link_store[0], tmp_path, link={"decoder": "bilinear"})
    with pytest.raises(ValueError, match="link.eval_negatives: 60, but the store holds 50"):
        LinkTrainer(_link_config(link_store[0], tmp_path, link={"eval_negatives": 60}))


class _UserEncoder(torch.nn.Module):
    """A user's own encoder: two DGL SAGE layers, not a gnnssd model."""

    def __init__(self, d_in: int, d: int):
        super().__init__()
        self.convs = torch.nn.ModuleList([SAGEConv(d_in, d, "mean"), SAGEConv(d, d, "mean")])

    def forward(self, blocks, x):
        return self.convs[1](blocks[1], torch.relu(self.convs[0](blocks[0], x)))


def test_link_trainer_runs_a_user_encoder_under_the_run_lock(link_store, tmp_path):
    """LinkTrainer is a Trainer: the user's `model=` is the encoder, training takes the run
    directory's exclusive lock, ssd scratch lives in the process's scratch directory."""
    store = Store.open(link_store[0])
    run = tmp_path / "run"
    encoder = _UserEncoder(store.feat_dim, 32)
    trainer = LinkTrainer(_link_config(link_store[0], run, features="ssd", train={"epochs": 1}), model=encoder)
    try:
        assert trainer.encoder is encoder
        run.mkdir()
        holder = RunLock(run, exclusive=True)
        with pytest.raises(RunDirBusy):
            trainer.fit()
        holder.release()
        history = trainer.fit()
        assert len(history) == 1 and 0 <= history[0]["valid_mrr"] <= 1
    finally:
        trainer.close()
    assert not (run / ".gnnssd-scratch").exists()
    assert (run / "checkpoint.pt").exists() and (run / "run_config.yaml").exists()


def test_trainer_of_a_link_config_trains_a_link_predictor(link_store, tmp_path):
    """gnnssd.Trainer(config) follows `task`: a link config built a node classifier before."""
    trainer = gnnssd.Trainer(_link_config(link_store[0], tmp_path / "run", train={"epochs": 2}))
    try:
        assert isinstance(trainer, LinkTrainer)
        assert set(trainer.model) == {"encoder", "decoder"}
        history = trainer.fit()
    finally:
        trainer.close()
    assert "train_acc" not in history[-1] and 0 < history[-1]["valid_mrr"] <= 1
    assert {"test_hits@1", "test_hits@3"} <= set(history[-1])


def test_eval_exports_link_scores_for_an_external_evaluator(link_store, tmp_path):
    """`gnnssd eval --scores` writes each split's edges and scores; ranking them again
    (as OGB's evaluator would) gives the MRR eval prints."""
    from gnnssd.cli.commands import main

    config = _link_config(link_store[0], tmp_path / "run", train={"epochs": 1})
    config_file = tmp_path / "link.yaml"
    config_file.write_text(yaml.safe_dump(config.to_dict()))
    assert main(["train", "--config", str(config_file)]) == 0
    out = tmp_path / "scores.npz"
    assert main(["eval", "--config", str(config_file), "--split", "test", "--scores", str(out)]) == 0
    with np.load(out) as scores:
        np.testing.assert_array_equal(scores["test_edges"], Store.open(link_store[0]).link_edges("test"))
        assert scores["test_neg"].shape == (len(scores["test_edges"]), 50)
        mrr = ranking_metrics(scores["test_pos"], scores["test_neg"])["mrr"]
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert mrr == pytest.approx(metrics["best_test_mrr"])
    assert main(["eval", "--config", str(config_file), "--scores", str(out)]) == 2  # never overwritten
    for layerwise in ([], ["--layerwise"]):  # a link task has no classes: refused, nothing written
        predictions = tmp_path / "predictions.npy"
        assert main(["predict", "--config", str(config_file), "--out", str(predictions), *layerwise]) == 2
        assert not predictions.exists()
