"""A typed store's features, labels and IDs by node type in the dataset's own IDs, checked
against the source's arrays (NumPy), range-checked per type; also under a degree order."""
from __future__ import annotations

import numpy as np
import pytest

from gnnssd.datasets import synthetic_source
from gnnssd.sampler import node_order
from gnnssd.storage_format import Store, write_store
from tests.hetero_graph import ToyHeteroSource


@pytest.fixture(scope="module", params=["original", "degree"])
def toy(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[ToyHeteroSource, Store]:
    source = ToyHeteroSource()
    path = write_store(tmp_path_factory.mktemp("typed") / "store", source, order=node_order(request.param))
    return source, Store.open(path)


def test_features_and_labels_by_type_equal_the_sources(toy) -> None:
    source, store = toy
    ids = np.array([0, 299, 17, 17, 150])
    np.testing.assert_array_equal(store.node_features(ids, "paper"), source.features[ids])
    np.testing.assert_array_equal(store.node_features(ids), source.features[ids])  # the target type
    np.testing.assert_array_equal(store.node_labels(ids, "paper"), source.labels[ids])
    authors = np.arange(200)
    np.testing.assert_array_equal(store.node_labels(authors, "author"), source.labels[300 + authors])


def test_store_ids_and_original_ids_are_inverse_per_type(toy) -> None:
    _, store = toy
    for name in store.schema.type_names:
        count = store.schema.node_types[store.schema.type_id(name)].count
        ids = np.arange(count)
        rows = store.store_ids(ids, name)
        first = store.schema.offsets[store.schema.type_id(name)]
        assert rows.min() == first and rows.max() == first + count - 1
        np.testing.assert_array_equal(store.original_ids(rows, name), ids)


def test_ids_outside_their_type_are_refused_naming_it(toy) -> None:
    _, store = toy
    with pytest.raises(ValueError, match=r"store rows of node type 'paper': 300 outside 0\.\.299"):
        store.original_ids([300], "paper")  # an author's row
    with pytest.raises(ValueError, match=r"store rows of node type 'author': 20 outside 300\.\.499"):
        store.original_ids([20], "author")
    with pytest.raises(ValueError, match=r"IDs of node type 'institution': 20 outside 0\.\.19"):
        store.node_labels([20], "institution")
    with pytest.raises(ValueError, match=r"IDs of node type 'paper': -1 outside 0\.\.299"):
        store.node_features([-1], "paper")
    with pytest.raises(ValueError, match=r"node type 'author' has no features"):
        store.node_features([0], "author")
    with pytest.raises(ValueError, match=r"node_type 'venue': expected one of \['paper', 'author', 'institution'\]"):
        store.node_labels([0], "venue")


def test_a_homogeneous_store_is_the_one_type_case_of_the_accessors(tmp_path) -> None:
    """Its one node type ("_N") is the default type and may be named: the same rows and
    labels as without a type, equal to the source's (a degree order mapped back); another
    type is refused naming the one there is."""
    source = synthetic_source("tiny")
    store = Store.open(write_store(tmp_path / "store", source, order=node_order("degree")))
    ids = np.array([0, store.num_nodes - 1, 5, 5])
    np.testing.assert_array_equal(store.node_features(ids, "_N"), np.concatenate(list(source.feature_chunks(0, store.num_nodes)))[ids])
    np.testing.assert_array_equal(store.node_features(ids, "_N"), store.node_features(ids))
    np.testing.assert_array_equal(store.node_labels(ids, "_N"), source.load_labels()[ids])
    np.testing.assert_array_equal(store.original_ids(store.store_ids(ids, "_N"), "_N"), ids)
    with pytest.raises(ValueError, match=r"node_type 'paper': expected one of \['_N'\]"):
        store.node_labels(ids, "paper")
