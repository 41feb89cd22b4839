"""A heterogeneous store as written, in the source's node order and renumbered (degree): its
schema, CSC and edge types against the source's relations (NumPy), features of the featured
types only, the order kept within each type, and the flattened baseline."""
from __future__ import annotations

import numpy as np
import pytest

from gnnssd.datasets.flatten import FlattenedSource
from gnnssd.sampler import ORDERS, node_order
from gnnssd.storage_format import Store, write_store
from tests.hetero_graph import ToyHeteroSource


@pytest.fixture(scope="module", params=["original", "degree"])
def toy(tmp_path_factory, request):
    source = ToyHeteroSource()
    path = write_store(tmp_path_factory.mktemp("hetero") / "store", source, order=node_order(request.param))
    return source, Store.open(path, verify=True)


def test_csc_and_edge_types_hold_each_relations_edges_once(toy):
    source, store = toy
    indptr, indices, etypes = (np.asarray(a) for a in (store.indptr, store.indices, store.etypes))
    inv = np.asarray(store.inv)  # the source's IDs -> the store's
    dst = np.repeat(np.arange(store.num_nodes), np.diff(indptr))
    for r in range(len(store.schema.relations)):
        src_r, dst_r = source.edges[r]
        expected = np.unique(np.stack([inv[dst_r], inv[src_r]], 1), axis=0)  # (dst, src) sorted: CSC order
        mine = etypes == r
        np.testing.assert_array_equal(np.stack([dst[mine], indices[mine]], 1), expected)
    for v in range(store.num_nodes):  # relation runs in order, sources sorted within each
        run = etypes[indptr[v]:indptr[v + 1]].astype(np.int64) * store.num_nodes + indices[indptr[v]:indptr[v + 1]]
        assert np.all(np.diff(run) > 0)


def test_features_hold_the_featured_types_only(toy):
    source, store = toy
    assert store.feature_rows == 300 and store.feature_bytes == 300 * 8 * 4
    np.testing.assert_array_equal(store.read_features(), source.features[np.asarray(store.perm)[:300]])
    assert store.manifest["features"]["rows"] == 300
    assert "node types   paper 300, author 200 (no features)" in store.summary()


def test_splits_are_target_type_ids(toy):
    source, store = toy
    for name in ("train", "valid", "test"):
        np.testing.assert_array_equal(np.sort(store.split(name)), np.sort(source.splits[name]))
    assert store.schema.target == "paper"
    np.testing.assert_array_equal(np.asarray(store.labels), source.labels[np.asarray(store.perm)])


def test_node_order_is_recorded_and_kept_within_each_type(toy):
    source, store = toy
    name = store.manifest["preprocess"]["order"]
    assert store.manifest["order"] == name and f"node order   {name}" in store.summary()
    perm, offsets = np.asarray(store.perm), store.schema.offsets
    refs = np.zeros(store.num_nodes, np.int64)  # in-neighbour lists naming each node (NumPy)
    for src, dst in source.edges:
        np.add.at(refs, np.unique(np.stack([src, dst], 1), axis=0)[:, 0], 1)
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        assert np.array_equal(np.sort(perm[lo:hi]), np.arange(lo, hi))
        if name == "degree":  # most-referenced first, ties in the source's order
            assert np.all(np.diff(refs[perm[lo:hi]]) <= 0)
            tie = np.diff(refs[perm[lo:hi]]) == 0
            assert np.all(np.diff(perm[lo:hi])[tie] > 0)
    assert name == "original" or not np.array_equal(perm, np.arange(store.num_nodes))


@pytest.mark.parametrize("order", [o for o in ORDERS if o not in ("original", "degree")])
def test_every_named_order_keeps_each_type_a_range(order, tmp_path):
    source = ToyHeteroSource(papers=120, authors=80, institutions=6)
    store = Store.open(write_store(tmp_path / "store", source, order=node_order(order)), verify=True)
    perm, offsets = np.asarray(store.perm), store.schema.offsets
    assert store.manifest["order"] == order
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        assert np.array_equal(np.sort(perm[lo:hi]), np.arange(lo, hi))
    np.testing.assert_array_equal(store.read_features(), source.features[perm[:120]])


def test_flattened_store_is_the_union_of_relations_with_zero_rows(toy, tmp_path):
    source, _ = toy
    flat = Store.open(write_store(tmp_path / "flat", FlattenedSource(source)), verify=True)
    assert flat.schema.is_homogeneous and len(flat.etypes) == 0
    dst = np.repeat(np.arange(flat.num_nodes), np.diff(np.asarray(flat.indptr)))
    pairs = {(int(s), int(d)) for s, d in zip(flat.indices, dst)}
    expected = {(int(s), int(d)) for r in range(5) for s, d in zip(*source.edges[r])}
    assert pairs == expected
    features = flat.read_features()
    np.testing.assert_array_equal(features[:300], source.features)
    assert not features[300:].any()
