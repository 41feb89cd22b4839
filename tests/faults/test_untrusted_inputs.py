"""Fault cases of issue 33 on dataset inputs: a .pt file runs no code whatever it holds
(datasets.torch_file, never torch.load), and a name read from a dataset's own files cannot
pull in a file outside the dataset folder (storage_format.contained).

Each test is named after the fault it covers; the layouts are tiny and written here.
"""
from __future__ import annotations

import gzip
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnssd.storage_format import DatasetError
from tests.hetero_graph import ToyHeteroSource
from tests.datasets.test_mag240m import _write_layout
from tests.datasets.test_ogb_hetero import _write_mag_layout


class _Hostile:
    """Unpickling this calls os.system, which creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def _hostile_files(path: Path, marker: Path) -> dict[str, callable]:
    """Ways to write a .pt that would run code: a bare pickle (torch's legacy reader
    unpickles it unrestricted), torch's legacy format, and the zip format naming os.system."""
    return {
        "bare pickle": lambda: path.write_bytes(pickle.dumps({"paper": _Hostile(marker)})),
        "legacy torch": lambda: torch.save({"paper": _Hostile(marker)}, path,
                                           _use_new_zipfile_serialization=False),
        "zip torch": lambda: torch.save({"paper": _Hostile(marker)}, path),
    }


@pytest.mark.parametrize("name", ["meta.pt", "split_dict.pt"])
@pytest.mark.parametrize("kind", ["bare pickle", "legacy torch", "zip torch"])
def test_mag240m_pt_file_that_would_run_code_is_refused_unrun(tmp_path, name, kind):
    from gnnssd.datasets.mag240m import MAG240MSource

    root, marker = tmp_path / "mag240m", tmp_path / "ran"
    _write_layout(root)
    _hostile_files(root / name, marker)[kind]()
    with pytest.raises(DatasetError, match=str(root / name)):
        MAG240MSource(root).load_splits()
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["bare pickle", "legacy torch", "zip torch"])
def test_ogb_link_split_that_would_run_code_is_refused_unrun(tmp_path, kind):
    from gnnssd.datasets import ogb_link

    root, marker = tmp_path / "ogbl", tmp_path / "ran"
    path = root / "split" / "time" / "train.pt"
    path.parent.mkdir(parents=True)
    _hostile_files(path, marker)[kind]()
    source = ogb_link.OGBLinkSource.__new__(ogb_link.OGBLinkSource)
    source.root, source.split_name = root, "time"
    with pytest.raises(DatasetError, match=str(path)):
        source._load_part("train")
    assert not marker.exists()


def test_torch_file_reads_what_torch_saved(tmp_path):
    """The reader's own tensor rebuild against torch's: views, dtypes, empty and 0-d
    tensors, NumPy arrays, nested containers."""
    from gnnssd.datasets.torch_file import load_torch_file

    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    value = {"view": base[1:, ::2], "t": base.T, "half": torch.ones(3, dtype=torch.float16),
             "bool": torch.tensor([True, False]), "empty": torch.empty(0, 3), "scalar": torch.tensor(7),
             "array": np.arange(5, dtype=np.int32), "nested": [{"n": 3, "s": "x"}, (1.5, None)]}
    torch.save(value, tmp_path / "a.pt")
    read = load_torch_file(tmp_path / "a.pt")
    for key in ("view", "t", "half", "bool", "empty", "scalar"):
        np.testing.assert_array_equal(read[key], value[key].numpy())
        assert read[key].dtype == value[key].numpy().dtype and read[key].shape == tuple(value[key].shape)
    np.testing.assert_array_equal(read["array"], value["array"])
    assert read["nested"] == [{"n": 3, "s": "x"}, (1.5, None)]


def test_torch_file_with_a_view_past_its_storage_is_refused(tmp_path):
    """A crafted size/stride reaching past the stored bytes is refused, not read out of bounds."""
    from gnnssd.datasets.torch_file import _rebuild_tensor

    storage = np.arange(10, dtype=np.int64)
    with pytest.raises(pickle.UnpicklingError, match="past its storage"):
        _rebuild_tensor(storage, 0, (5,), (3,))
    with pytest.raises(pickle.UnpicklingError, match="negative"):
        _rebuild_tensor(storage, 0, (2,), (-1,))


# --- case 8: ogb-hetero names with ../ -------------------------------------------------------

def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "node-feat.csv.gz"
    secret.parent.mkdir()
    with gzip.open(secret, "wt") as f:
        f.write("\n".join("1.0,2.0" for _ in range(300)) + "\n")
    return secret


def test_ogb_hetero_node_type_named_with_dotdot_is_refused(tmp_path):
    from gnnssd.datasets.ogb_hetero import OGBHeteroSource

    root = tmp_path / "ogbn-mag"
    _write_mag_layout(root, ToyHeteroSource())
    _secret(tmp_path)
    counts = root / "raw" / "num-node-dict.csv.gz"
    with gzip.open(counts, "wt") as f:  # a node type whose feature folder is ../../../outside
        f.write("author,institution,paper,../../../outside\n200,20,300,300\n")
    with pytest.raises(DatasetError, match=r"leads outside the dataset folder"):
        OGBHeteroSource(root)


def test_ogb_hetero_relation_named_with_dotdot_is_refused(tmp_path):
    from gnnssd.datasets.ogb_hetero import OGBHeteroSource

    root = tmp_path / "ogbn-mag"
    _write_mag_layout(root, ToyHeteroSource())
    (tmp_path / "outside___paper").mkdir()  # raw/relations/paper___x/../../../../outside___paper
    shutil.copy(root / "raw" / "relations" / "paper___cites___paper" / "edge.csv.gz", tmp_path / "outside___paper")
    with gzip.open(root / "raw" / "triplet-type-list.csv.gz", "wt") as f:
        f.write("paper,x/../../../../outside,paper\n")
    # refused where the schema is made (a name with '/' is no file name), before any path is built
    with pytest.raises(DatasetError, match=r"relation 'x/\.\./\.\./\.\./\.\./outside' contains '/'"):
        OGBHeteroSource(root).load_relation_edges(0)
