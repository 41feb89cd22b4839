"""`gnnssd export graphbolt`: the store as DGL GraphBolt's OnDiskDataset, opened by
dgl.graphbolt itself: features, labels, splits and edges equal to the store's in the
dataset's own IDs, also for a store in degree order and for a typed store."""
from __future__ import annotations

import numpy as np
import pytest

from gnnssd.cli.commands import main
from gnnssd.datasets import synthetic_source
from gnnssd.sampler import node_order
from gnnssd.storage_format import Store, write_store
from tests.hetero_graph import ToyHeteroSource

gb = pytest.importorskip("dgl.graphbolt")


def _exported(store_path, out):
    assert main(["export", "graphbolt", str(store_path), str(out)]) == 0
    return gb.OnDiskDataset(str(out)).load()


def _csc_pairs(indptr, indices) -> set[tuple[int, int]]:
    indptr, indices = np.asarray(indptr), np.asarray(indices)
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    return set(zip(indices.tolist(), dst.tolist()))


def _items(item_set) -> tuple[np.ndarray, np.ndarray]:
    """(seed nodes, labels) of a set, by iterating it (a typed set yields {type: item})."""
    items = [next(iter(i.values())) if isinstance(i, dict) else i for i in item_set]
    return np.array([int(s) for s, _ in items]), np.array([int(y) for _, y in items])


@pytest.mark.parametrize("order", ["original", "degree"])
def test_a_homogeneous_store_round_trips_through_graphbolt(tmp_path, order) -> None:
    source = synthetic_source("tiny")
    path = write_store(tmp_path / "store", source, order=node_order(order))
    store = Store.open(path)
    dataset = _exported(path, tmp_path / "gb")
    ids = np.arange(store.num_nodes)
    feat = dataset.feature.read("node", None, "feat").numpy()
    np.testing.assert_array_equal(feat, store.node_features(ids))
    labels = dataset.feature.read("node", None, "label").numpy().reshape(-1)  # GraphBolt reads (N, 1)
    np.testing.assert_array_equal(labels, store.node_labels(ids))
    graph = dataset.graph
    perm = np.asarray(store.perm)
    stored = {(int(perm[u]), int(perm[v])) for u, v in _csc_pairs(store.indptr, store.indices)}
    assert _csc_pairs(graph.csc_indptr.numpy(), graph.indices.numpy()) == stored
    task = dataset.tasks[0]
    assert task.metadata["num_classes"] == store.num_classes
    for split, item_set in (("train", task.train_set), ("valid", task.validation_set), ("test", task.test_set)):
        seeds, labels = _items(item_set)
        np.testing.assert_array_equal(seeds, store.split(split))
        np.testing.assert_array_equal(labels, store.node_labels(seeds))
    if order == "degree":
        assert not np.array_equal(perm, ids)  # the IDs really were mapped back


def test_a_typed_store_round_trips_through_graphbolt(tmp_path) -> None:
    source = ToyHeteroSource()
    path = write_store(tmp_path / "store", source, order=node_order("degree"))
    dataset = _exported(path, tmp_path / "gb")
    papers = np.arange(300)
    np.testing.assert_array_equal(dataset.feature.read("node", "paper", "feat").numpy(), source.features)
    np.testing.assert_array_equal(dataset.feature.read("node", "paper", "label").numpy().reshape(-1),
                                  source.labels[papers])
    expected = source.dgl_graph()
    graph = dataset.graph
    indptr, indices, etype_of = graph.csc_indptr.numpy(), graph.indices.numpy(), graph.type_per_edge.numpy()
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    for relation in expected.canonical_etypes:  # GraphBolt numbers nodes globally, types in its own order
        s_off, d_off = (graph.node_type_offset[graph.node_type_to_id[t]].item() for t in (relation[0], relation[2]))
        mine = etype_of == graph.edge_type_to_id[":".join(relation)]
        got = set(zip((indices[mine] - s_off).tolist(), (dst[mine] - d_off).tolist()))
        src, dst_r = expected.edges(etype=relation)
        assert got == set(zip(src.tolist(), dst_r.tolist())), relation
    seeds, labels = _items(dataset.tasks[0].train_set)
    np.testing.assert_array_equal(np.sort(seeds), np.sort(source.splits["train"]))
    np.testing.assert_array_equal(labels, source.labels[seeds])


def test_export_refuses_an_existing_dataset(tmp_path, capsys) -> None:
    path = write_store(tmp_path / "store", synthetic_source("tiny"))
    assert main(["export", "graphbolt", str(path), str(tmp_path / "gb")]) == 0
    assert main(["export", "graphbolt", str(path), str(tmp_path / "gb")]) == 2
    assert "metadata.yaml: already there" in capsys.readouterr().err


def test_a_graphbolt_folder_opened_as_a_store_names_the_command_that_converts_it(tmp_path, capsys) -> None:
    """Not "not a complete store": the folder is named as GraphBolt's, and the command it
    gives (STORE filled in) converts it into a store holding the same graph."""
    path = write_store(tmp_path / "store", synthetic_source("tiny"))
    assert main(["export", "graphbolt", str(path), str(tmp_path / "gb")]) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "gb")]) == 2
    err = capsys.readouterr().err
    assert "a DGL GraphBolt dataset (metadata.yaml), not a gnnssd store" in err
    command = err.split("`")[1]
    assert command == f"gnnssd preprocess graphbolt --root {tmp_path / 'gb'} --out STORE"
    assert main([*command.replace("STORE", str(tmp_path / "converted")).split()[1:]]) == 0
    original, converted = Store.open(path), Store.open(tmp_path / "converted")
    assert (converted.num_nodes, converted.num_edges) == (original.num_nodes, original.num_edges)
