"""MAG240M's layout, written here at a tiny size as OGB-LSC ships it (NumPy arrays in .pt
files included): read through preprocess into a store that holds its graph; a .pt file that
would run code is refused unrun."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnssd.datasets.mag240m import MAG240MSource
from gnnssd.storage_format import DatasetError, Store, write_store


def _write_layout(root: Path, papers=50, authors=40, institutions=5, dim=16, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    processed = root / "processed"
    edges = {"paper___cites___paper": np.stack([rng.integers(0, papers, 200), rng.integers(0, papers, 200)]),
             "author___writes___paper": np.stack([rng.integers(0, authors, 120), rng.integers(0, papers, 120)]),
             "author___affiliated_with___institution": np.stack([np.arange(authors),
                                                                 rng.integers(0, institutions, authors)])}
    for name, index in edges.items():
        (processed / name).mkdir(parents=True)
        np.save(processed / name / "edge_index.npy", index.astype(np.int64))
    (processed / "paper").mkdir()
    features = rng.standard_normal((papers, dim)).astype(np.float16)
    np.save(processed / "paper" / "node_feat.npy", features)
    labels = rng.integers(0, 6, papers).astype(np.float32)
    labels[40:] = np.nan  # the hidden test labels
    np.save(processed / "paper" / "node_label.npy", labels)
    torch.save({"paper": papers, "author": authors, "institution": institutions}, root / "meta.pt")
    torch.save({"train": np.arange(0, 30), "valid": np.arange(30, 40), "test-dev": np.arange(40, 45),
                "test-challenge": np.arange(45, 50)}, root / "split_dict.pt")
    return {"edges": edges, "features": features, "labels": labels}


def test_the_store_holds_mag240ms_graph_features_and_splits(tmp_path):
    data = _write_layout(tmp_path / "mag240m")
    source = MAG240MSource(tmp_path / "mag240m")
    store = Store.open(write_store(tmp_path / "store", source, dtype=source.default_dtype), verify=True)
    assert store.feat_dtype == np.float16 and store.feature_rows == 50
    np.testing.assert_array_equal(store.read_features(), data["features"])
    graph = store.graph()
    for name, index in data["edges"].items():
        s, r, d = name.split("___")
        expected = set(zip(index[0].tolist(), index[1].tolist()))
        assert set(zip(*(t.tolist() for t in graph.edges(etype=(s, r, d))))) == expected
        assert set(zip(*(t.tolist() for t in graph.edges(etype=(d, f"rev_{r}", s))))) == {(v, u) for u, v in expected}
    np.testing.assert_array_equal(np.sort(store.train_idx), np.arange(30))
    assert len(store.test_idx) == 0  # test-dev labels are hidden
    labels = np.asarray(store.labels)
    np.testing.assert_array_equal(labels[:40], data["labels"][:40].astype(np.int64))
    assert (labels[40:] == -1).all()


def test_a_split_file_that_would_run_code_is_refused_unrun(tmp_path):
    _write_layout(tmp_path / "mag240m")
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    torch.save({"train": Payload(), "valid": np.arange(3)}, tmp_path / "mag240m" / "split_dict.pt")
    with pytest.raises(DatasetError, match=r"split_dict\.pt: holds more than tensors and arrays"):
        MAG240MSource(tmp_path / "mag240m").load_splits()
    assert not marker.exists()


def test_features_of_the_wrong_shape_are_refused(tmp_path):
    _write_layout(tmp_path / "mag240m")
    np.save(tmp_path / "mag240m" / "processed" / "paper" / "node_feat.npy", np.zeros((49, 16), np.float16))
    with pytest.raises(DatasetError, match=r"node_feat\.npy: shape \(49, 16\), expected \(50, dim\)"):
        MAG240MSource(tmp_path / "mag240m")
