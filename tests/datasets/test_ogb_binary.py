"""OGB's binary node-property layout (raw/data.npz), streamed, and its bad-input errors."""
from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import pytest

from gnnssd.cli.commands import main
from gnnssd.datasets import OGBBinarySource, OGBSource, ogb_source
from gnnssd.sampler import node_order
from gnnssd.storage_format import DatasetError, Store, write_store

from tests.conftest import random_graph_arrays
from tests.datasets.test_datasets import _write_ogb_layout

STORE_FILES = ("indptr.npy", "indices.npy", "labels.npy", "perm.npy", "inv.npy", "train_idx.npy",
               "valid_idx.npy", "test_idx.npy", "features.bin")


def write_ogb_binary(root, data, compressed=True, split_name="time", **overrides):
    """The layout as OGB's papers100M release has it: np.savez(_compressed) members with
    OGB's key names and dtypes, labels float with NaN, splits as gzipped CSV (pandas)."""
    (root / "raw").mkdir(parents=True)
    (root / "split" / split_name).mkdir(parents=True)
    save = np.savez_compressed if compressed else np.savez
    labels = np.asarray(data["labels"], dtype=np.float64)
    members = {"edge_index": np.stack(data["edges"]).astype(np.int64),
               "node_feat": data["features"],
               "num_nodes_list": np.array([len(labels)], dtype=np.int64),
               "num_edges_list": np.array([len(data["edges"][0])], dtype=np.int64),
               "node_year": np.zeros((len(labels), 1), dtype=np.int64)}
    members.update(overrides)
    save(root / "raw" / "data.npz", **{k: v for k, v in members.items() if v is not None})
    np.savez_compressed(root / "raw" / "node-label.npz",
                        node_label=np.where(labels < 0, np.nan, labels).reshape(-1, 1))
    for name, ids in data["splits"].items():
        pd.DataFrame(np.asarray(ids)).to_csv(root / "split" / split_name / f"{name}.csv.gz",
                                             index=False, header=False, compression="gzip")
    return root


def _store_bytes(store_dir):
    return {name: (store_dir / name).read_bytes() for name in STORE_FILES}


@pytest.mark.parametrize("compressed", [True, False], ids=["deflated", "stored"])
def test_binary_layout_gives_the_csv_layouts_store(tmp_path, compressed):
    data = random_graph_arrays()
    data["labels"][:40] = -1  # unlabelled nodes outside the splits, as in papers100M
    data["splits"] = {k: v[data["labels"][v] >= 0] for k, v in data["splits"].items()}
    write_ogb_binary(tmp_path / "bin", data, compressed=compressed)
    _write_ogb_layout(tmp_path / "csv", data)
    binary = ogb_source(tmp_path / "bin")
    assert isinstance(binary, OGBBinarySource) and isinstance(ogb_source(tmp_path / "csv"), OGBSource)
    a = write_store(tmp_path / "a", binary, order=node_order("degree"))
    b = write_store(tmp_path / "b", ogb_source(tmp_path / "csv"), order=node_order("degree"))
    assert _store_bytes(a) == _store_bytes(b)
    assert Store.open(a).num_classes == 4


def test_binary_layout_streams_edges_and_features_in_blocks(tmp_path):
    data = random_graph_arrays()
    source = OGBBinarySource(write_ogb_binary(tmp_path / "o", data))
    chunks = list(source.feature_chunks(10, 64))
    assert [len(c) for c in chunks] == [64, 64, 64, 64, 34]
    np.testing.assert_array_equal(np.vstack(chunks), data["features"][10:])
    edges = list(source.edge_chunks(300))
    assert [len(s) for s, _ in edges] == [300] * 6 + [200]
    np.testing.assert_array_equal(np.concatenate([s for s, _ in edges]), data["edges"][0])
    np.testing.assert_array_equal(np.concatenate([d for _, d in edges]), data["edges"][1])


def test_fortran_order_edge_index_is_read_as_pairs(tmp_path):
    data = random_graph_arrays()
    edge_index = np.asfortranarray(np.stack(data["edges"]).astype(np.int64))
    source = OGBBinarySource(write_ogb_binary(tmp_path / "o", data, edge_index=edge_index))
    src, dst = source.load_edges()
    np.testing.assert_array_equal(src, data["edges"][0])
    np.testing.assert_array_equal(dst, data["edges"][1])


def test_cli_preprocess_ogb_binary_under_a_memory_limit(tmp_path, capsys):
    """`preprocess ogb --memory-limit` takes the out-of-core build: same store files."""
    data = random_graph_arrays(num_edges=5000)
    root = write_ogb_binary(tmp_path / "ogbn-x", data)
    main(["preprocess", "ogb", "--root", str(root), "--out", str(tmp_path / "small"),
          "--memory-limit", "1KiB"])
    main(["preprocess", "ogb", "--root", str(root), "--out", str(tmp_path / "big")])
    assert _store_bytes(tmp_path / "small") == _store_bytes(tmp_path / "big")
    assert "300" in capsys.readouterr().out


def test_cli_refuses_a_bad_memory_limit(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["preprocess", "ogb", "--root", str(tmp_path), "--out", str(tmp_path / "s"),
              "--memory-limit", "lots"])
    assert "size 'lots'" in capsys.readouterr().err


# --- bad input: each error names the file and the member ------------------------------

def test_missing_member(tmp_path):
    write_ogb_binary(tmp_path / "o", random_graph_arrays(), node_feat=None)
    with pytest.raises(DatasetError, match=r"data.npz: missing member 'node_feat.npy'"):
        OGBBinarySource(tmp_path / "o")


def test_missing_label_file(tmp_path):
    write_ogb_binary(tmp_path / "o", random_graph_arrays())
    (tmp_path / "o" / "raw" / "node-label.npz").unlink()
    with pytest.raises(DatasetError, match=r"node-label.npz: missing input file"):
        OGBBinarySource(tmp_path / "o")


@pytest.mark.parametrize("member, value, message", [
    ("edge_index", np.zeros((3, 10), np.int64), r"member 'edge_index.npy': shape \(3, 10\)"),
    ("node_feat", np.zeros(300, np.float32), r"member 'node_feat.npy': shape \(300,\)"),
    ("num_nodes_list", np.array([299]), r"member 'num_nodes_list.npy': 299, but there are 300"),
    ("num_edges_list", np.array([5, 6]), r"member 'num_edges_list.npy': shape \(2,\)"),
])
def test_wrong_shape(tmp_path, member, value, message):
    write_ogb_binary(tmp_path / "o", random_graph_arrays(), **{member: value})
    with pytest.raises(DatasetError, match=message):
        OGBBinarySource(tmp_path / "o")


def test_wrong_label_count(tmp_path):
    root = write_ogb_binary(tmp_path / "o", random_graph_arrays())
    np.savez_compressed(root / "raw" / "node-label.npz", node_label=np.zeros((299, 1)))
    with pytest.raises(DatasetError, match=r"node-label.npz: member 'node_label.npy': shape \(299, 1\)"):
        OGBBinarySource(root)


def test_truncated_zip(tmp_path):
    root = write_ogb_binary(tmp_path / "o", random_graph_arrays())
    path = root / "raw" / "data.npz"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DatasetError, match=r"data.npz: not a readable .npz \(zip\) file"):
        OGBBinarySource(root)


def test_damaged_member_data_is_caught_while_streaming(tmp_path):
    """A flipped byte inside the deflated features: the zip opens, the stream fails."""
    data = random_graph_arrays(dim=64)
    root = write_ogb_binary(tmp_path / "o", data, compressed=True)
    path = root / "raw" / "data.npz"
    raw = bytearray(path.read_bytes())
    start = raw.find(b"node_feat.npy") + 2000  # inside the member's compressed data
    raw[start:start + 64] = bytes(64)
    path.write_bytes(bytes(raw))
    source = OGBBinarySource(root)
    with pytest.raises(DatasetError, match=r"data.npz: member 'node_feat.npy': cannot be read"):
        list(source.feature_chunks(0, 1000))


def test_unlabelled_only_split(tmp_path):
    data = random_graph_arrays()
    data["labels"][data["splits"]["valid"]] = -1
    source = OGBBinarySource(write_ogb_binary(tmp_path / "o", data))
    with pytest.raises(DatasetError, match=r"split/time/valid.csv.gz: all 50 nodes of split 'valid' "
                                           r"are unlabelled \(NaN\) in .*node-label.npz: member"):
        source.load_splits()
    with pytest.raises(DatasetError, match="valid.csv.gz"):
        write_store(tmp_path / "s", source)
    assert not (tmp_path / "s").exists()


def test_split_file_not_gzip(tmp_path):
    root = write_ogb_binary(tmp_path / "o", random_graph_arrays())
    with gzip.open(root / "split" / "time" / "test.csv.gz", "wt") as f:
        f.write("1,2\n3,4\n")
    with pytest.raises(DatasetError, match=r"test.csv.gz: 2 columns, expected 1"):
        OGBBinarySource(root).load_splits()
