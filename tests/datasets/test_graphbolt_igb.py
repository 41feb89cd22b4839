"""DGL GraphBolt's OnDiskDataset and IGB's homogeneous layout, checked against DGL's own
reader of the same files and against the same arrays handed over as an ArraySource."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from gnnssd.cli.commands import main
from gnnssd.datasets import ArraySource, GraphBoltSource, IGBSource
from gnnssd.storage_format import DatasetError, Store, write_store

from tests.conftest import random_graph_arrays


def write_graphbolt(root, data, feat_format="numpy", feat_dtype=np.float32, seed_name="seeds"):
    """An OnDiskDataset as DGL documents it: metadata.yaml, (2, E) edges, sets with labels."""
    root.mkdir(parents=True)
    np.save(root / "edges.npy", np.stack(data["edges"]).astype(np.int64))
    features = data["features"].astype(feat_dtype)
    if feat_format == "torch":
        torch.save(torch.from_numpy(features), root / "feat.pt")
    else:
        np.save(root / "feat.npy", features)
    sets = {}
    for split, key in (("train", "train_set"), ("valid", "validation_set"), ("test", "test_set")):
        ids = np.asarray(data["splits"][split], dtype=np.int64)
        np.save(root / f"{split}-seeds.npy", ids)
        np.save(root / f"{split}-labels.npy", np.asarray(data["labels"])[ids])
        sets[key] = [{"data": [{"name": seed_name, "format": "numpy", "path": f"{split}-seeds.npy"},
                               {"name": "labels", "format": "numpy", "path": f"{split}-labels.npy"}]}]
    meta = {"dataset_name": "gb-test",
            "graph": {"nodes": [{"num": len(data["labels"])}],
                      "edges": [{"format": "numpy", "path": "edges.npy"}]},
            "feature_data": [{"domain": "node", "name": "feat", "format": feat_format,
                              "in_memory": False, "path": f"feat.{'pt' if feat_format == 'torch' else 'npy'}"}],
            "tasks": [{"name": "node_classification", "num_classes": 4, **sets}]}
    (root / "metadata.yaml").write_text(yaml.safe_dump(meta))
    return root


def _labelled_only_in_splits(data):
    in_split = np.zeros(len(data["labels"]), bool)
    for ids in data["splits"].values():
        in_split[ids] = True
    return np.where(in_split, data["labels"], -1)


def test_graphbolt_store_matches_dgl_ondisk_dataset(tmp_path):
    """Topology, features and sets equal what DGL's OnDiskDataset makes of the same files."""
    import dgl.graphbolt as gb

    data = random_graph_arrays()
    root = write_graphbolt(tmp_path / "gb", data)
    store = Store.open(write_store(tmp_path / "s", GraphBoltSource(root), memory_limit=1))
    dataset = gb.OnDiskDataset(str(root)).load()
    graph = dataset.graph
    # DGL keeps repeated edges and does not sort rows; the store de-duplicates and sorts.
    indptr, indices = graph.csc_indptr.numpy(), graph.indices.numpy()
    for v in range(store.num_nodes):
        np.testing.assert_array_equal(store.indices[store.indptr[v]:store.indptr[v + 1]],
                                      np.unique(indices[indptr[v]:indptr[v + 1]]))
    np.testing.assert_array_equal(store.features_memmap(),
                                  dataset.feature.read("node", None, "feat").numpy())
    seeds, labels = dataset.tasks[0].train_set._items
    np.testing.assert_array_equal(np.sort(store.split("train")), np.sort(seeds.numpy()))
    np.testing.assert_array_equal(store.labels[seeds.numpy()], labels.numpy())


@pytest.mark.parametrize("feat_format", ["numpy", "torch"])
def test_graphbolt_equals_same_arrays(tmp_path, feat_format):
    data = random_graph_arrays()
    root = write_graphbolt(tmp_path / "gb", data, feat_format=feat_format, seed_name="seed_nodes")
    a = write_store(tmp_path / "a", GraphBoltSource(root))
    b = write_store(tmp_path / "b", ArraySource(**{**data, "labels": _labelled_only_in_splits(data)}))
    for name in ("indptr.npy", "indices.npy", "labels.npy", "train_idx.npy", "test_idx.npy", "features.bin"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_graphbolt_float16_kept_or_converted(tmp_path):
    data = random_graph_arrays()
    root = write_graphbolt(tmp_path / "gb", data, feat_dtype=np.float16)
    half = Store.open(write_store(tmp_path / "h", GraphBoltSource(root), dtype="float16"))
    full = Store.open(write_store(tmp_path / "f", GraphBoltSource(root)))
    assert half.features_memmap().dtype == np.float16 and full.features_memmap().dtype == np.float32
    np.testing.assert_array_equal(half.features_memmap(), data["features"].astype(np.float16))
    np.testing.assert_array_equal(full.features_memmap(),
                                  data["features"].astype(np.float16).astype(np.float32))


def test_graphbolt_errors_name_the_file_and_key(tmp_path):
    data = random_graph_arrays()
    root = write_graphbolt(tmp_path / "gb", data)
    meta = yaml.safe_load((root / "metadata.yaml").read_text())
    with pytest.raises(DatasetError, match="no node feature named 'emb'"):
        GraphBoltSource(root, feature="emb")
    np.save(root / "edges.npy", np.zeros((3, 5), np.int64))
    with pytest.raises(DatasetError, match=r"edges.npy: shape \(3, 5\), expected \(2, num_edges\)"):
        GraphBoltSource(root)
    meta["graph"]["nodes"].append({"type": "author", "num": 3})
    (root / "metadata.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(DatasetError, match="only homogeneous graphs"):
        GraphBoltSource(root)
    (root / "metadata.yaml").write_text(yaml.safe_dump({"graph_topology": {"path": "x"}}))
    with pytest.raises(DatasetError, match="GraphBolt's preprocessed output"):
        GraphBoltSource(root)


def write_igb(root, data, size="small", feat_dtype=np.float32):
    folder = root / size / "processed"
    (folder / "paper").mkdir(parents=True)
    (folder / "paper__cites__paper").mkdir(parents=True)
    np.save(folder / "paper" / "node_feat.npy", data["features"].astype(feat_dtype))
    np.save(folder / "paper" / "node_label_19.npy", np.asarray(data["labels"], dtype=np.float32))
    np.save(folder / "paper__cites__paper" / "edge_index.npy",
            np.stack(data["edges"], axis=1).astype(np.int64))
    return root


@pytest.mark.parametrize("feat_dtype", [np.float32, np.float16])
def test_igb_equals_same_arrays_with_igb_splits(tmp_path, feat_dtype):
    data = random_graph_arrays()
    root = write_igb(tmp_path / "igb", data, feat_dtype=feat_dtype)
    n = len(data["labels"])
    splits = {"train": np.arange(180), "valid": np.arange(180, 240), "test": np.arange(240, n)}
    dtype = np.dtype(feat_dtype).name
    main(["preprocess", "igb", "--root", str(root), "--size", "small", "--dtype", dtype,
          "--memory-limit", "1KiB", "--out", str(tmp_path / "a")])
    b = write_store(tmp_path / "b", ArraySource(**{**data, "splits": splits,
                                                   "features": data["features"].astype(feat_dtype)}),
                    dtype=dtype)
    for name in ("indptr.npy", "indices.npy", "labels.npy", "train_idx.npy", "valid_idx.npy",
                 "test_idx.npy", "features.bin"):
        assert (tmp_path / "a" / name).read_bytes() == (b / name).read_bytes(), name


def test_igb_errors_name_the_file(tmp_path):
    data = random_graph_arrays()
    root = write_igb(tmp_path / "igb", data)
    edge_file = root / "small" / "processed" / "paper__cites__paper" / "edge_index.npy"
    np.save(edge_file, np.zeros((5, 3), np.int64))
    with pytest.raises(DatasetError, match=r"edge_index.npy: shape \(5, 3\), expected \(num_edges, 2\)"):
        IGBSource(root)
    with pytest.raises(DatasetError, match=r"medium/processed/paper/node_feat.npy: missing input file"):
        IGBSource(root, size="medium")
    feat = root / "small" / "processed" / "paper" / "node_feat.npy"
    feat.write_bytes(b"\x00" * 100)
    with pytest.raises(DatasetError, match=r"node_feat.npy: 100 bytes without a .npy header"):
        IGBSource(root)
