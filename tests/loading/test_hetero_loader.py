"""NodeLoader on a heterogeneous store: memory (DGL's own hetero sampler) and ssd (the typed
numba sampler, the planner and io_uring) give the same mini-batches, x the stored rows."""
from __future__ import annotations

import dgl
import numpy as np
import pytest
import torch

import gnnssd
from gnnssd.sampler import node_order
from gnnssd.storage_format import Store, write_store
from tests.hetero_graph import ToyHeteroSource
from tests.sampler.test_hetero_sampling import _edge_sets, _node_sets


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    source = ToyHeteroSource(papers=3000, authors=2000, institutions=50, feat_dim=256)
    return source, Store.open(write_store(tmp_path_factory.mktemp("hetero") / "store", source))


def _batches(store, features, fanouts, **options):
    with gnnssd.NodeLoader(store, {"paper": store.train_idx}, fanouts=fanouts, batch_size=256,
                           features=features, **options) as loader:
        return list(loader)


# 3 MiB of paper rows; 14.5 MiB leaves buffers of ~1,000 rows beside 12 MiB of queues, so
# mini-batches are read in pieces; block_budget 0 reads rows, the default compact blocks.
@pytest.mark.parametrize("budget,block_budget", [("16MiB", None), ("14.5MiB", 0)])
def test_memory_and_ssd_give_the_same_all_neighbour_minibatches(toy, budget, block_budget):
    source, store = toy
    memory = _batches(store, "memory", [-1, -1])
    blocks = {} if block_budget is None else {"block_budget": block_budget}
    ssd = _batches(store, "ssd", [-1, -1], memory_budget=budget, hot_fraction=0.2, mega_batch=4, **blocks)
    assert len(memory) == len(ssd) == -(-len(store.train_idx) // 256)
    for a, b in zip(memory, ssd):
        assert torch.equal(a.output_nodes["paper"], b.output_nodes["paper"])
        assert torch.equal(a.y, b.y)
        np.testing.assert_array_equal(b.y.numpy(), source.labels[b.output_nodes["paper"].numpy()])
        for block_a, block_b in zip(a.blocks, b.blocks):
            assert _edge_sets(block_a) == _edge_sets(block_b)
            assert _node_sets(block_a) == _node_sets(block_b)
        for batch in (a, b):  # x: the stored rows of the paper inputs, in input order
            assert set(batch.x) == {"paper"}
            papers = batch.input_nodes["paper"].numpy()
            np.testing.assert_array_equal(batch.x["paper"].numpy(), source.features[papers])
            assert torch.equal(batch.blocks[0].srcnodes["paper"].data["feat"], batch.x["paper"])
            assert set(batch.input_nodes) == {"paper", "author", "institution"}


def test_per_relation_fanouts_through_the_loader(toy):
    source, store = toy
    fanouts = [{"cites": 3, "written_by": 2, "employs": 1}, {"cites": 2, "writes": 2}]
    for features in ("memory", "ssd"):
        for batch in _batches(store, features, fanouts, **({"memory_budget": "16MiB"} if features == "ssd" else {})):
            for block, layer in zip(batch.blocks, fanouts):
                for rel in block.canonical_etypes:
                    degrees = block.in_degrees(etype=rel)
                    assert (int(degrees.max()) if len(degrees) else 0) <= layer.get(rel[1], 0)


def test_seeds_name_one_node_type(toy):
    _, store = toy
    with pytest.raises(ValueError, match="node type 'venue'"):
        gnnssd.NodeLoader(store, {"venue": [1]}, fanouts=[2], batch_size=4)
    with pytest.raises(ValueError, match="one node type"):
        gnnssd.NodeLoader(store, {"paper": [1], "author": [2]}, fanouts=[2], batch_size=4)
    with pytest.raises(ValueError, match=r"seeds\['author'\]: node 2000 outside 0..1999"):
        gnnssd.NodeLoader(store, {"author": [2000]}, fanouts=[2], batch_size=4)


def test_a_misspelt_relation_is_refused_when_the_loader_is_built(toy):
    _, store = toy
    expected = r"fanouts name relations \['cited'\]; the graph's relations are \['cites', 'writes'"
    with pytest.raises(ValueError, match=expected):
        gnnssd.NodeLoader(store, {"paper": [1]}, fanouts=[{"cited": 2}], batch_size=4)  # not iterated
    with gnnssd.NodeLoader(store, {"paper": [1]}, fanouts=[2], batch_size=4) as loader:
        with pytest.raises(ValueError, match=expected):
            loader.with_seeds({"paper": [2]}, fanouts=[{"cited": 2}])
        with pytest.raises(ValueError, match=expected):
            gnnssd.EdgeLoader(loader.source, {"cites": ([0], [1])}, fanouts=[{"cited": 2}], batch_size=4)


@pytest.fixture(scope="module")
def renumbered(toy, tmp_path_factory):
    source, _ = toy
    path = write_store(tmp_path_factory.mktemp("hetero") / "degree", source, order=node_order("degree"))
    return Store.open(path, verify=True)


def test_a_renumbered_store_gives_the_same_minibatches_in_dataset_ids(toy, renumbered):
    """Degree order (store IDs differ from the dataset's within every type): memory and ssd
    give the original-order store's mini-batches and DGL's own full-neighbour hetero
    sampler's blocks, all in the dataset's per-type IDs; x the source's rows by those IDs."""
    source, store = toy
    assert renumbered.manifest["order"] == "degree"
    assert not np.array_equal(np.asarray(renumbered.perm)[:3000], np.arange(3000))
    seeds = {"paper": np.sort(source.splits["train"])[:600]}  # one seed order for both stores
    np.testing.assert_array_equal(np.sort(renumbered.train_idx), np.sort(source.splits["train"]))
    runs = {(name, features): _batches_of(s, seeds, features)
            for name, s in (("original", store), ("degree", renumbered)) for features in ("memory", "ssd")}
    graph, dgl_sampler = source.dgl_graph(), dgl.dataloading.MultiLayerFullNeighborSampler(2)
    reference = runs["original", "memory"]
    for run in runs.values():
        assert len(run) == len(reference) == -(-len(seeds["paper"]) // 256)
        for ref, batch in zip(reference, run):
            assert set(batch.output_nodes["paper"].tolist()) == set(ref.output_nodes["paper"].tolist())
            _, _, theirs = dgl_sampler.sample_blocks(graph, {"paper": batch.output_nodes["paper"]})
            for block, expected in zip(batch.blocks, theirs):
                assert _edge_sets(block) == _edge_sets(expected)
                assert _node_sets(block) == _node_sets(expected)
            assert {t: set(ids.tolist()) for t, ids in batch.input_nodes.items()} == \
                   {t: set(ids.tolist()) for t, ids in ref.input_nodes.items()}
            for t, ids in batch.input_nodes.items():
                assert torch.equal(batch.blocks[0].srcnodes[t].data[dgl.NID], ids)
            papers = batch.input_nodes["paper"].numpy()
            np.testing.assert_array_equal(batch.x["paper"].numpy(), source.features[papers])
            np.testing.assert_array_equal(batch.y.numpy(), source.labels[batch.output_nodes["paper"].numpy()])


def _batches_of(store, seeds, features):
    options = {"memory_budget": "14.5MiB", "hot_fraction": 0.2, "mega_batch": 4} if features == "ssd" else {}
    with gnnssd.NodeLoader(store, seeds, fanouts=[-1, -1], batch_size=256, features=features, **options) as loader:
        return list(loader)
