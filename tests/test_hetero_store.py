"""A heterogeneous store as written: its schema, CSC and edge types against the source's
relations (NumPy), features of the featured types only, and the flattened baseline."""
from __future__ import annotations

import numpy as np
import pytest

from gnnssd.datasets.flatten import FlattenedSource
from gnnssd.storage_format import Store, write_store
from tests.hetero_graph import ToyHeteroSource


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    source = ToyHeteroSource()
    return source, Store.open(write_store(tmp_path_factory.mktemp("hetero") / "store", source), verify=True)


def test_csc_and_edge_types_hold_each_relations_edges_once(toy):
    source, store = toy
    indptr, indices, etypes = (np.asarray(a) for a in (store.indptr, store.indices, store.etypes))
    dst = np.repeat(np.arange(store.num_nodes), np.diff(indptr))
    for r in range(len(store.schema.relations)):
        src_r, dst_r = source.edges[r]
        expected = np.unique(np.stack([dst_r, src_r], 1), axis=0)  # (dst, src) sorted: CSC order
        mine = etypes == r
        np.testing.assert_array_equal(np.stack([dst[mine], indices[mine]], 1), expected)
    for v in range(store.num_nodes):  # relation runs in order, sources sorted within each
        run = etypes[indptr[v]:indptr[v + 1]].astype(np.int64) * store.num_nodes + indices[indptr[v]:indptr[v + 1]]
        assert np.all(np.diff(run) > 0)


def test_features_hold_the_featured_types_only(toy):
    source, store = toy
    assert store.feature_rows == 300 and store.feature_bytes == 300 * 8 * 4
    np.testing.assert_array_equal(store.read_features(), source.features)
    assert store.manifest["features"]["rows"] == 300
    assert "node types   paper 300, author 200 (no features)" in store.summary()


def test_splits_are_target_type_ids(toy):
    source, store = toy
    np.testing.assert_array_equal(np.sort(store.train_idx), np.sort(source.splits["train"]))
    assert store.schema.target == "paper"


def test_flattened_store_is_the_union_of_relations_with_zero_rows(toy, tmp_path):
    source, _ = toy
    flat = Store.open(write_store(tmp_path / "flat", FlattenedSource(source)), verify=True)
    assert flat.schema.is_homogeneous and flat.etypes is None
    dst = np.repeat(np.arange(flat.num_nodes), np.diff(np.asarray(flat.indptr)))
    pairs = {(int(s), int(d)) for s, d in zip(flat.indices, dst)}
    expected = {(int(s), int(d)) for r in range(5) for s, d in zip(*source.edges[r])}
    assert pairs == expected
    features = flat.read_features()
    np.testing.assert_array_equal(features[:300], source.features)
    assert not features[300:].any()
