"""Heterogeneous stores: bad typed input refused by preprocess naming the relation, split or
option; a typed store whose checksums are valid but whose edge types are not refused by
`open` (cheap checks) or `verify` (full ones), never sampled into wrong blocks."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from gnnssd.cli.commands import main
from gnnssd.core.config import ConfigError, config_from_dict
from gnnssd.sampler import node_order
from gnnssd.storage_format import DatasetError, Store, StoreError, write_store
from gnnssd.storage_format.manifest import MANIFEST, manifest_checksum
from gnnssd.storage_format.schema import GraphSchema, NodeType
from gnnssd.training.link import LinkTrainer
from tests.faults.test_hostile_inputs import _array, _tamper
from tests.hetero_graph import RELATIONS, ToyHeteroSource


@pytest.fixture(scope="module")
def typed_store(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("hetero") / "store", ToyHeteroSource())


@pytest.fixture
def store_copy(typed_store, tmp_path):
    return shutil.copytree(typed_store, tmp_path / "store")


def test_relation_edge_of_the_wrong_node_type_is_refused_naming_the_relation(tmp_path):
    source = ToyHeteroSource()
    src, dst = source.edges[1]  # author -writes-> paper
    source.edges[1] = (np.concatenate([src, [5]]), np.concatenate([dst, [7]]))  # 5 is a paper
    with pytest.raises(DatasetError, match=r"relation 'writes' edge 900 has source 5, not a 'author' node \(300\.\.499\)"):
        write_store(tmp_path / "out", source)
    assert not (tmp_path / "out").exists()


def test_split_outside_the_target_type_is_refused(tmp_path):
    source = ToyHeteroSource()
    source.labels[310] = 1
    source.splits["test"] = np.concatenate([source.splits["test"], [310]])
    with pytest.raises(DatasetError, match=r"split 'test' holds node 310, not a node of the target type 'paper'"):
        write_store(tmp_path / "out", source)


NAMES = r"\['cites', 'writes', 'written_by', 'affiliated_with', 'employs'\]"


@pytest.mark.parametrize("options, message", [
    ({"edge_split": (0.8, 0.1, 0.1)},
     r"toy-hetero: --edge-split on a heterogeneous graph splits one relation; name it with "
     r"--edge-split-relation, one of " + NAMES),
    ({"edge_split": (0.8, 0.1, 0.1), "edge_split_relation": "reviews"},
     r"toy-hetero: --edge-split-relation 'reviews' is not a relation of the graph; its relations are " + NAMES),
    ({"edge_split_relation": "cites"}, r"--edge-split-relation 'cites' without --edge-split"),
])
def test_a_typed_edge_split_must_name_a_relation_of_the_graph(tmp_path, options, message):
    with pytest.raises(DatasetError, match=message):
        write_store(tmp_path / "out", ToyHeteroSource(), **options)
    assert not any(tmp_path.iterdir())  # refused before anything (lock, partial folder) is made


def test_cli_edge_split_without_a_relation_is_refused_naming_them(tmp_path, capsys):
    base = ["preprocess", "hetero-synthetic", "--papers", "200", "--out", str(tmp_path / "s"), "--edge-split",
            "0.8,0.1,0.1"]
    assert main(base) == 2
    assert "name it with --edge-split-relation, one of ['cites', 'writes', 'affiliated_with', 'cited_by'" \
        in capsys.readouterr().err
    assert main(base + ["--edge-split-relation", "reviews"]) == 2
    assert "--edge-split-relation 'reviews' is not a relation of the graph" in capsys.readouterr().err
    assert main(["preprocess", "synthetic", "--preset", "tiny", "--out", str(tmp_path / "h"), "--edge-split",
                 "0.8,0.1,0.1", "--edge-split-relation", "cites"]) == 2
    assert "the graph has one node type and one relation; drop --edge-split-relation" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_link_relation_edited_out_of_the_schema_is_refused_at_open(tmp_path):
    store = write_store(tmp_path / "store", ToyHeteroSource(), edge_split=(0.8, 0.1, 0.1),
                        edge_split_relation="writes", eval_negatives=5)
    manifest = json.loads((store / MANIFEST).read_text())
    manifest["link"]["relation"] = ["paper", "writes", "author"]
    manifest["checksum"] = manifest_checksum(manifest)
    (store / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=r"link.relation \['paper', 'writes', 'author'\] is not one of the "
                                         r"schema's relations"):
        Store.open(store)


def test_a_node_order_moving_a_node_into_another_types_range_is_refused_at_open(tmp_path):
    """perm and inv still inverse permutations, checksums valid, but store ID 299 (a
    paper's place) holds author 300: per-type IDs would name the wrong nodes."""
    path = write_store(tmp_path / "store", ToyHeteroSource(), order=node_order("degree"))
    perm, inv = _array(path, "perm.npy"), _array(path, "inv.npy")
    paper, author = int(perm[299]), int(perm[300])
    perm[299], perm[300] = author, paper
    inv[author], inv[paper] = 299, 300
    _tamper(path, "perm.npy", perm)
    _tamper(path, "inv.npy", inv)
    with pytest.raises(StoreError, match=rf"perm\.npy: perm\[299\] = {author}: store ID 299 is a 'paper' "
                                         "node, its dataset ID another type's"):
        Store.open(path)  # since issue 33: every result would be wrong, so open checks it


def test_schema_with_featureless_types_first_is_refused():
    with pytest.raises(DatasetError, match="node types with features must come first"):
        GraphSchema((NodeType("author", 3, False), NodeType("paper", 2, True)), RELATIONS[:1], "paper")
    with pytest.raises(DatasetError, match="relation names must be distinct"):
        GraphSchema((NodeType("paper", 2, True), NodeType("author", 3, False)),
                    (("paper", "cites", "paper"), ("author", "cites", "paper")), "paper")


def test_edge_type_out_of_range_is_refused_at_open(store_copy):
    etypes = _array(store_copy, "etypes.npy")
    etypes[17] = 9
    _tamper(store_copy, "etypes.npy", etypes)
    with pytest.raises(StoreError, match=r"etypes\.npy: entry 17 is 9, expected a relation in 0\.\.4"):
        Store.open(store_copy)


def test_edge_of_another_relations_types_is_refused_at_open(store_copy):
    store = Store.open(store_copy)
    indptr = np.asarray(store.indptr)
    etypes = _array(store_copy, "etypes.npy")
    # a paper's in-edge from a paper ("cites") relabelled "writes" (author -> paper): a
    # relation in range, wrong for the relation's source type; and in relation order, so
    # only the endpoint check can see it (the samplers would read an author's row silently)
    paper = int(np.flatnonzero((np.diff(indptr) > 0)[:300])[0])
    first = int(indptr[paper])
    assert etypes[first] == 0
    runs = etypes[first:indptr[paper + 1]]
    etypes[first:first + int((runs == 0).sum())] = 1
    _tamper(store_copy, "etypes.npy", etypes)
    with pytest.raises(StoreError, match=rf"etypes\.npy: edge {first} \(relation author-writes-paper\) has a source of another type"):
        Store.open(store_copy)


def test_edges_out_of_relation_order_are_refused_at_open(store_copy):
    store = Store.open(store_copy)
    indptr = np.asarray(store.indptr)
    etypes = _array(store_copy, "etypes.npy")
    node = next(v for v in range(300) if len(set(etypes[indptr[v]:indptr[v + 1]].tolist())) > 1)
    lo, hi = int(indptr[node]), int(indptr[node + 1])
    indices = _array(store_copy, "indices.npy")
    etypes[lo:hi], indices[lo:hi] = etypes[lo:hi][::-1].copy(), indices[lo:hi][::-1].copy()
    _tamper(store_copy, "etypes.npy", etypes)  # each edge keeps its own relation and source
    _tamper(store_copy, "indices.npy", indices)
    with pytest.raises(StoreError, match=r"etypes\.npy: edge \d+ .* is out of relation order"):
        Store.open(store_copy)


@pytest.mark.parametrize("dims, error", [
    ({"paper": 4}, "the schema's widest node type dim is 4, its rows are padded to feat_dim 8"),
    ({"author": 3}, "node type 'author' has dim 3, expected a positive integer on a type with features"),
    ({"paper": 0}, "node type 'paper' has dim 0")])
def test_a_node_type_dim_the_rows_cannot_hold_is_refused(store_copy, dims, error):
    """A manifest (checksum valid) whose per-type dims disagree with the stored rows: named."""
    manifest = json.loads((store_copy / MANIFEST).read_text())
    for t in manifest["schema"]["node_types"]:
        if t["name"] in dims:
            t["dim"] = dims[t["name"]]
    manifest["checksum"] = manifest_checksum(manifest)
    (store_copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=re.escape(error)):
        Store.open(store_copy).schema


def test_missing_etypes_in_a_typed_manifest_is_refused(store_copy):
    (store_copy / "etypes.npy").unlink()
    with pytest.raises(StoreError, match="etypes.npy: missing from the store"):
        Store.open(store_copy)


@pytest.mark.parametrize("limit, what", [(10_000, "the relations' offsets"), (30_000, "interleaving 3,375 edges")])
def test_a_typed_topology_above_the_memory_limit_is_refused_not_built(tmp_path, limit, what):
    """The typed topology is built in memory: above --memory-limit it is refused, naming the
    limit, before the step that would pass it; nothing is left at --out."""
    with pytest.raises(DatasetError, match=rf"topology is built in memory \({what} needs about .* more than "
                                           r"--memory-limit 0\.00 GiB; raise --memory-limit"):
        write_store(tmp_path / "out", ToyHeteroSource(), memory_limit=limit)
    assert not (tmp_path / "out").exists()


def test_layerwise_inference_of_a_homogeneous_model_on_a_typed_store_is_refused(typed_store, tmp_path):
    """A model whose layers take one tensor cannot run over a typed store's blocks: refused
    before any layer runs, naming what a typed model's layer takes."""
    from gnnssd.core.config import ModelConfig
    from gnnssd.inference.layerwise import layerwise_inference
    from gnnssd.models.builtin import build_model

    model = build_model(ModelConfig(name="sage", hidden=8, layers=2), 8, 4)
    for features in ("memory", "ssd"):
        with pytest.raises(TypeError, match=r"heterogeneous store needs a model whose layer\(i, block, h\) "
                                            "takes and returns dicts of rows by node type"):
            list(layerwise_inference(model, Store.open(typed_store), features, scratch_dir=tmp_path))
    assert not (tmp_path / "layerwise").exists() or not list((tmp_path / "layerwise").iterdir())


def test_a_typed_model_whose_layer_returns_one_tensor_is_named(typed_store):
    """A model of the user's whose layer gives one tensor, not rows by node type."""
    import torch

    from gnnssd.inference.layerwise import layerwise_inference

    class OneTensor(torch.nn.Module):
        num_layers = 1

        def layer(self, i, block, h):
            return h["paper"][: block.num_dst_nodes("paper")]

    with pytest.raises(TypeError, match=r"model.layer\(0, block, h\) returned Tensor; expected a dict "
                                        "of rows by node type"):
        list(layerwise_inference(OneTensor(), Store.open(typed_store), "memory"))


def test_a_typed_link_task_with_a_target_only_model_is_refused(tmp_path):
    store = write_store(tmp_path / "store", ToyHeteroSource(), edge_split=(0.8, 0.1, 0.1),
                        edge_split_relation="writes", eval_negatives=5)
    config = config_from_dict({"store": str(store), "run_dir": str(tmp_path / "run"), "task": "link",
                               "model": {"name": "mlp"}, "link": {"eval_negatives": 5}})
    with pytest.raises(ConfigError, match="mlp embeds the target type only; a link task on a heterogeneous "
                                          "store needs rgcn or rgat"):
        LinkTrainer(config)
