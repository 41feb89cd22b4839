"""Dataset readers against the files' documented contents, and the synthetic generator."""
from __future__ import annotations

import gzip
import pickle
import warnings

import numpy as np
import pytest

from gnnssd.datasets import ArraySource, HeterophilousSource, OGBSource, PlanetoidSource, synthetic_source
from gnnssd.datasets.synthetic import FEATURE_BLOCK
from gnnssd.sampler import node_order
from gnnssd.storage_format import Store, write_store

from tests.conftest import random_graph_arrays, shared_dataset


@pytest.mark.parametrize("name, nodes, undirected_edges, dim, classes, splits", [
    ("cora", 2708, 5278, 1433, 7, (140, 500, 1000)),
    ("citeseer", 3327, 4552, 3703, 6, (120, 500, 1000)),
])
def test_planetoid_matches_published_counts(tmp_path, planetoid_root, name, nodes,
                                            undirected_edges, dim, classes, splits):
    store = Store.open(write_store(tmp_path / name, PlanetoidSource(planetoid_root, name)))
    assert (store.num_nodes, store.feat_dim, store.num_classes) == (nodes, dim, classes)
    self_loops = sum(int((store.indices[store.indptr[v]:store.indptr[v + 1]] == v).sum())
                     for v in range(nodes))
    # Published counts leave out self-loops (CiteSeer has 124 in its adjacency lists).
    assert (store.num_edges - self_loops) // 2 == undirected_edges
    assert tuple(len(store.split(s)) for s in ("train", "valid", "test")) == splits


def test_planetoid_test_rows_follow_test_index(tmp_path, planetoid_root):
    """Row test.index[k] of the assembled matrix is row k of tx (independent re-read)."""
    src = PlanetoidSource(planetoid_root, "cora", normalize=False)
    store = Store.open(write_store(tmp_path / "cora", src))
    with open(planetoid_root / "ind.cora.tx", "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tx = pickle.load(f, encoding="latin1").toarray()
    test_index = np.loadtxt(planetoid_root / "ind.cora.test.index", dtype=np.int64)
    np.testing.assert_array_equal(store.features_memmap()[store.inv[test_index]], tx)


def test_heterophilous_symmetric_and_split():
    path = shared_dataset("heterophilous", "minesweeper.npz")
    src = HeterophilousSource(path, split=3)
    with np.load(path) as raw:
        np.testing.assert_array_equal(src.load_splits()["valid"], np.flatnonzero(raw["val_masks"][3]))
        assert src.num_nodes == raw["node_features"].shape[0] == 10_000


def test_tolokers_store(tmp_path):
    store = Store.open(write_store(tmp_path / "t", HeterophilousSource(shared_dataset("heterophilous", "tolokers.npz"))))
    assert (store.num_nodes, store.num_edges, store.feat_dim) == (11_758, 2 * 519_000, 10)


def _write_ogb_layout(root, data, split_name="random"):
    (root / "raw").mkdir(parents=True)
    (root / "split" / split_name).mkdir(parents=True)

    def write(path, lines):
        with gzip.open(path, "wt") as f:
            f.writelines(line + "\n" for line in lines)

    src, dst = data["edges"]
    write(root / "raw" / "edge.csv.gz", [f"{a},{b}" for a, b in zip(src, dst)])
    write(root / "raw" / "node-feat.csv.gz", [",".join(repr(float(v)) for v in row) for row in data["features"]])
    write(root / "raw" / "node-label.csv.gz", [str(v) for v in data["labels"]])
    write(root / "raw" / "num-node-list.csv.gz", [str(len(data["labels"]))])
    for name, ids in data["splits"].items():
        write(root / "split" / split_name / f"{name}.csv.gz", [str(v) for v in ids])


def test_ogb_layout_equals_same_arrays(tmp_path):
    """The OGB CSV reader yields the very store the same arrays give through the API."""
    data = random_graph_arrays()
    _write_ogb_layout(tmp_path / "ogbn-test", data)
    via_ogb = Store.open(write_store(tmp_path / "a", OGBSource(tmp_path / "ogbn-test"), order=node_order("degree")))
    via_api = Store.open(write_store(tmp_path / "b", ArraySource(**data), order=node_order("degree")))
    for name in ("indptr", "indices", "labels", "perm", "train_idx", "valid_idx", "test_idx"):
        np.testing.assert_array_equal(getattr(via_ogb, name), getattr(via_api, name))
    np.testing.assert_array_equal(via_ogb.features_memmap(), via_api.features_memmap())


def test_ogb_streams_features_in_chunks(tmp_path):
    data = random_graph_arrays()
    _write_ogb_layout(tmp_path / "o", data)
    chunks = list(OGBSource(tmp_path / "o").feature_chunks(10, 64))
    assert [len(c) for c in chunks] == [64, 64, 64, 64, 34]
    np.testing.assert_array_equal(np.vstack(chunks), data["features"][10:])


def test_synthetic_is_deterministic_and_chunk_independent():
    a, b = synthetic_source(num_nodes=150_000, feat_dim=4), synthetic_source(num_nodes=150_000, feat_dim=4)
    np.testing.assert_array_equal(a.load_edges()[0], b.load_edges()[0])
    whole = np.vstack(list(a.feature_chunks(0, 1000)))
    start = FEATURE_BLOCK + 123
    np.testing.assert_array_equal(np.vstack(list(b.feature_chunks(start, 1000))), whole[start:])


def test_synthetic_degrees_are_heavy_tailed_and_homophilous():
    src = synthetic_source(num_nodes=200_000, feat_dim=4, avg_degree=10, num_classes=8)
    s, d = src.load_edges()
    degree = np.bincount(np.concatenate([s, d]), minlength=200_000)
    assert degree.mean() == pytest.approx(10, rel=0.05)
    assert degree.max() > 20 * degree.mean()  # a power law has hubs; Erdos-Renyi would not
    labels = src.load_labels()
    same = np.mean(labels[s] == labels[d])
    assert same == pytest.approx(0.8 + 0.2 / 8, abs=0.02)


def test_synthetic_neighbourhoods_hold_the_local_fraction_of_edges():
    src = synthetic_source(num_nodes=200_000, feat_dim=4, avg_degree=10, num_classes=8,
                           local_fraction=0.6, local_size=256)
    s, d = src.load_edges()
    labels = src.load_labels()
    # neighbourhood = run of local_size nodes of one class, in ID order within the class
    rank = np.empty(len(labels), np.int64)
    by_class = np.argsort(labels, kind="stable")
    start = np.searchsorted(labels[by_class], labels[by_class])
    rank[by_class] = np.arange(len(labels)) - start
    hood = labels.astype(np.int64) * len(labels) + rank // 256
    # 0.6 by construction, plus the few other edges that land in the same run by chance
    assert np.mean(hood[s] == hood[d]) == pytest.approx(0.6, abs=0.02)
    assert np.mean(labels[s] == labels[d]) == pytest.approx(0.6 + 0.4 * (0.8 + 0.2 / 8), abs=0.02)
    degree = np.bincount(np.concatenate([s, d]), minlength=200_000)
    assert degree.mean() == pytest.approx(10, rel=0.05)


def test_synthetic_rewards_message_passing():
    """Averaging neighbours' features beats features alone by a wide margin (least squares)."""
    src = synthetic_source("tiny")
    x = np.vstack(list(src.feature_chunks(0, 10_000))).astype(np.float64)
    y = src.load_labels()
    s, d = src.load_edges()
    s, d = np.concatenate([s, d]), np.concatenate([d, s])
    agg = np.zeros_like(x)
    np.add.at(agg, d, x[s])
    agg /= np.maximum(np.bincount(d, minlength=len(x)), 1)[:, None]
    train, test = src.load_splits()["train"], src.load_splits()["test"]

    def accuracy(features):
        onehot = np.eye(y.max() + 1)[y[train]]
        w, *_ = np.linalg.lstsq(np.c_[features[train], np.ones(len(train))], onehot, rcond=None)
        return np.mean((np.c_[features[test], np.ones(len(test))] @ w).argmax(1) == y[test])

    alone, with_neighbours = accuracy(x), accuracy(np.c_[x, agg])
    assert with_neighbours > alone + 0.2, (alone, with_neighbours)
