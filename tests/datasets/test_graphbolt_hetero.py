"""DGL GraphBolt's heterogeneous OnDiskDataset layout, written here from a known graph (numpy
and CSV edges) and read back through preprocess: the store holds its graph and features."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from gnnssd.datasets.graphbolt_hetero import GraphBoltHeteroSource
from gnnssd.storage_format import DatasetError, Store, write_store
from tests.hetero_graph import RELATIONS, ToyHeteroSource

FORWARD = {"cites": 0, "writes": 1, "affiliated_with": 3}  # the toy's relation index of each


def _write_layout(root, toy: ToyHeteroSource) -> dict:
    root.mkdir(parents=True)
    off = toy.schema.offsets
    local = {"paper": 0, "author": off[1], "institution": off[2]}
    edges = []
    for name, r in FORWARD.items():
        s, _, d = RELATIONS[r]
        src, dst = toy.edges[r]
        pairs = np.stack([src - local[s], dst - local[d]])
        if name == "affiliated_with":  # one relation as "src,dst" lines
            np.savetxt(root / f"{name}.csv", pairs.T, fmt="%d", delimiter=",")
            edges.append({"type": f"{s}:{name}:{d}", "format": "csv", "path": f"{name}.csv"})
        else:
            np.save(root / f"{name}.npy", pairs)
            edges.append({"type": f"{s}:{name}:{d}", "format": "numpy", "path": f"{name}.npy"})
    np.save(root / "paper-feat.npy", toy.features)
    sets = {}
    for split, key in (("train", "train_set"), ("valid", "validation_set"), ("test", "test_set")):
        ids = toy.splits[split]
        np.save(root / f"{split}-seeds.npy", ids)
        np.save(root / f"{split}-labels.npy", toy.labels[ids])
        sets[key] = [{"type": "paper", "data": [
            {"name": "seeds", "format": "numpy", "path": f"{split}-seeds.npy"},
            {"name": "labels", "format": "numpy", "path": f"{split}-labels.npy"}]}]
    meta = {"dataset_name": "toy-gb",
            "graph": {"nodes": [{"type": "author", "num": 200}, {"type": "institution", "num": 20},
                                {"type": "paper", "num": 300}], "edges": edges},
            "feature_data": [{"domain": "node", "type": "paper", "name": "feat", "format": "numpy",
                              "path": "paper-feat.npy"}],
            "tasks": [{"name": "node_classification", "num_classes": 4, **sets}]}
    (root / "metadata.yaml").write_text(yaml.safe_dump(meta))
    return meta


def test_the_store_holds_the_datasets_graph_features_labels_and_splits(tmp_path):
    toy = ToyHeteroSource()
    _write_layout(tmp_path / "gb", toy)
    source = GraphBoltHeteroSource(tmp_path / "gb", add_reverse=True)
    assert source.schema.type_names == ["paper", "author", "institution"]
    store = Store.open(write_store(tmp_path / "store", source), verify=True)
    graph, expected = store.graph(), toy.dgl_graph()
    for name, r in FORWARD.items():
        s, _, d = RELATIONS[r]
        theirs = set(zip(*(t.tolist() for t in expected.edges(etype=(s, name, d)))))
        assert set(zip(*(t.tolist() for t in graph.edges(etype=(s, name, d))))) == theirs
        assert set(zip(*(t.tolist() for t in graph.edges(etype=(d, f"rev_{name}", s))))) == \
            {(v, u) for u, v in theirs}
    np.testing.assert_array_equal(store.read_features(), toy.features)
    np.testing.assert_array_equal(np.asarray(store.labels)[:300][toy.splits["train"]],
                                  toy.labels[toy.splits["train"]])
    np.testing.assert_array_equal(np.sort(store.test_idx), np.sort(toy.splits["test"]))


def test_untyped_or_badly_typed_metadata_is_refused_naming_the_key(tmp_path):
    meta = _write_layout(tmp_path / "gb", ToyHeteroSource())
    meta["graph"]["edges"][0]["type"] = "paper:cites"
    (tmp_path / "gb" / "metadata.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(DatasetError, match=r"graph\.edges\[0\]\.type 'paper:cites', expected 'source:relation:destination'"):
        GraphBoltHeteroSource(tmp_path / "gb")
    del meta["graph"]["nodes"][0]["type"]
    (tmp_path / "gb" / "metadata.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(DatasetError, match="need a 'type' each for a heterogeneous graph"):
        GraphBoltHeteroSource(tmp_path / "gb")
