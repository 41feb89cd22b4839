"""OGB's heterogeneous raw layout (ogbn-mag's), written here from a known graph and read
back through preprocess: the store's heterograph, features, labels and splits match."""
from __future__ import annotations

import gzip
from pathlib import Path

import dgl
import numpy as np
import pytest
import torch

from gnnssd import NodeLoader
from gnnssd.core.config import ModelConfig, SSDConfig
from gnnssd.datasets.ogb_hetero import OGBHeteroSource
from gnnssd.inference.layerwise import layerwise_inference
from gnnssd.models.hetero import build_hetero_model
from gnnssd.storage_format import DatasetError, Store, write_store
from tests.hetero_graph import ToyHeteroSource

FORWARD = (("author", "affiliated_with", "institution"), ("author", "writes", "paper"),
           ("paper", "cites", "paper"))


def _csv(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in rows:
            f.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def _write_mag_layout(root: Path, toy: ToyHeteroSource) -> None:
    """ogbn-mag's files for the toy graph's forward relations (types in OGB's own order)."""
    off = toy.schema.offsets
    counts = {"author": 200, "institution": 20, "paper": 300}
    (root / "raw").mkdir(parents=True)
    with gzip.open(root / "raw" / "num-node-dict.csv.gz", "wt") as f:
        f.write(",".join(counts) + "\n" + ",".join(str(v) for v in counts.values()) + "\n")
    local = {"paper": 0, "author": off[1], "institution": off[2]}
    toy_index = {"cites": 0, "writes": 1, "affiliated_with": 3}
    for s, r, d in FORWARD:
        src, dst = toy.edges[toy_index[r]]
        _csv(root / "raw" / "relations" / f"{s}___{r}___{d}" / "edge.csv.gz",
             np.stack([src - local[s], dst - local[d]], 1))
    _csv(root / "raw" / "node-feat" / "paper" / "node-feat.csv.gz", toy.features)
    _csv(root / "raw" / "node-label" / "paper" / "node-label.csv.gz", toy.labels[:300])
    for name, ids in toy.splits.items():
        _csv(root / "split" / "time" / "paper" / f"{name}.csv.gz", ids)


@pytest.fixture
def toy_root(tmp_path):
    toy = ToyHeteroSource()
    _write_mag_layout(tmp_path / "ogbn-mag", toy)
    return toy, tmp_path / "ogbn-mag"


def test_the_store_holds_the_layouts_graph_features_labels_and_splits(toy_root, tmp_path):
    toy, root = toy_root
    source = OGBHeteroSource(root)
    assert source.schema.type_names == ["paper", "author", "institution"]  # featured first
    assert [r for _, r, _ in source.schema.relations] == ["affiliated_with", "writes", "cites",
                                                          "rev_affiliated_with", "rev_writes", "rev_cites"]
    store = Store.open(write_store(tmp_path / "store", source), verify=True)
    graph, expected = store.graph(), toy.dgl_graph()
    for s, r, d in FORWARD:
        ours = set(zip(*(t.tolist() for t in graph.edges(etype=(s, r, d)))))
        theirs = set(zip(*(t.tolist() for t in expected.edges(etype=(s, r, d)))))
        back = set(zip(*(t.tolist() for t in graph.edges(etype=(d, f"rev_{r}", s)))))
        assert ours == theirs and back == {(v, u) for u, v in theirs}
    np.testing.assert_allclose(store.read_features(), toy.features, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(store.labels)[:300], toy.labels[:300])
    np.testing.assert_array_equal(np.sort(store.valid_idx), np.sort(toy.splits["valid"]))


@pytest.mark.parametrize("model", ["rgcn", "rgat"])
def test_featured_types_of_different_dims_keep_their_own(toy_root, tmp_path, model):
    """Author rows of dim 3 beside paper rows of dim 8: stored padded to 8 with zeros; each
    type's x at its own dim, equal to its CSV rows, in memory and ssd mode; the relational
    models take the two widths (a training step runs)."""
    toy, root = toy_root
    author = np.random.default_rng(0).standard_normal((200, 3)).astype(np.float32)
    _csv(root / "raw" / "node-feat" / "author" / "node-feat.csv.gz", author)
    source = OGBHeteroSource(root)
    assert [(t.name, t.dim) for t in source.schema.node_types] == [("author", 3), ("paper", 8), ("institution", None)]
    store = Store.open(write_store(tmp_path / "store", source), verify=True)
    rows = store.read_features()
    assert store.feat_dim == 8 and not rows[:200, 3:].any()
    np.testing.assert_allclose(rows[:200, :3], author, rtol=1e-6)
    np.testing.assert_allclose(rows[200:], toy.features, rtol=1e-6)
    net = build_hetero_model(ModelConfig(name=model, hidden=8, layers=2), store.schema, store.feat_dim,
                             store.num_classes)
    for mode in ("memory", "ssd"):
        with NodeLoader(store, {"paper": np.arange(300)}, fanouts=[4, 4], batch_size=100, features=mode,
                        device="cpu", memory_budget="16MiB", seed=1) as loader:
            for mb in loader:
                assert mb.x["author"].shape[1] == 3 and mb.x["paper"].shape[1] == 8
                np.testing.assert_allclose(mb.x["author"].numpy(), author[mb.input_nodes["author"].numpy()], rtol=1e-6)
                np.testing.assert_allclose(mb.x["paper"].numpy(), toy.features[mb.input_nodes["paper"].numpy()],
                                           rtol=1e-6)
                logits = net(mb.blocks, mb.x)
                assert logits.shape == (len(mb.output_nodes["paper"]), store.num_classes)
                logits.sum().backward()
    # layer-wise inference reads each type at its own width too: equal to the model on DGL's
    # full-neighbour blocks of the store's heterograph fed the source's rows
    net.eval()
    papers = torch.arange(300)
    _, _, blocks = dgl.dataloading.MultiLayerFullNeighborSampler(2).sample_blocks(store.graph(), {"paper": papers})
    given = {"author": author, "paper": toy.features}
    with torch.no_grad():
        expected = net(blocks, {t: torch.from_numpy(given[t][blocks[0].srcnodes[t].data[dgl.NID].numpy()])
                                for t in given}).numpy()
    for mode in ("memory", "ssd"):
        got = np.concatenate(list(layerwise_inference(net, store, mode, SSDConfig(memory_budget="64KiB"),
                                                      tmp_path / f"scratch-{mode}")))
        np.testing.assert_allclose(got, expected, atol=1e-4)


def test_a_short_feature_file_is_refused(toy_root, tmp_path):
    toy, root = toy_root
    _csv(root / "raw" / "node-feat" / "paper" / "node-feat.csv.gz", toy.features[:250])
    with pytest.raises(DatasetError, match=r"node-feat\.csv\.gz: 250 feature rows for 300 'paper' nodes"):
        write_store(tmp_path / "store", OGBHeteroSource(root))
    assert not (tmp_path / "store").exists()


def test_an_edge_outside_its_types_range_is_refused_naming_the_relation(toy_root, tmp_path):
    toy, root = toy_root
    _csv(root / "raw" / "relations" / "author___writes___paper" / "edge.csv.gz", [[0, 5], [250, 1]])
    with pytest.raises(DatasetError, match=r"relation 'writes' edge 1 has source 550, not a 'author' node"):
        write_store(tmp_path / "store", OGBHeteroSource(root, add_reverse=False))
