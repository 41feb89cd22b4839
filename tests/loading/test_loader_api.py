"""What a DGL user's loop does with a loader: seeds as masks or IDs (bad ones refused by
name), fanouts checked, DGL's tuple, a store path, EdgeLoader's drop_last, MiniBatch.to."""
from __future__ import annotations

import dgl
import numpy as np
import pytest
import torch

import gnnssd
from gnnssd.datasets import synthetic_source
from gnnssd.sampler import node_order
from gnnssd.storage_format import write_store


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory):
    return write_store(tmp_path_factory.mktemp("api") / "tiny", synthetic_source("tiny"), order=node_order("degree"))


@pytest.fixture(scope="module")
def store(store_path) -> gnnssd.Store:
    return gnnssd.Store.open(store_path)


def _loader(store, seeds, **options) -> gnnssd.NodeLoader:
    return gnnssd.NodeLoader(store, seeds, **{"fanouts": [3, 3], "batch_size": 64, "device": "cpu", **options})


def test_a_boolean_mask_means_its_nonzero_nodes(store) -> None:
    mask = np.zeros(store.num_nodes, bool)
    mask[np.asarray(store.train_idx)] = True
    ids = np.sort(np.asarray(store.train_idx))
    with _loader(store, mask) as by_mask, _loader(store, ids) as by_ids:
        np.testing.assert_array_equal(by_mask.seeds, ids)
        for a, b in zip(by_mask, by_ids):
            np.testing.assert_array_equal(a.output_nodes.numpy(), b.output_nodes.numpy())
    with _loader(store, torch.from_numpy(mask)) as as_tensor:
        assert len(as_tensor.seeds) == mask.sum()


@pytest.mark.parametrize("features", ["memory", "ssd"])
@pytest.mark.parametrize("seeds,message", [
    (np.array([0.0, 1.0]), r"seeds: dtype float64 \(e\.g\. 0\.0\); expected integer node IDs or a boolean mask"),
    (np.array([3, -1]), r"seeds: node -1 outside 0\.\.{last}"),
    (np.array([0, 10**9]), r"seeds: node 1000000000 outside 0\.\.{last}"),
    (np.zeros(5, bool), r"seeds: a boolean mask of shape \(5,\); a mask must have one entry per node"),
    (np.zeros((2, 2), np.int64), r"seeds: shape \(2, 2\); expected a 1-D array"),
])
def test_bad_seeds_are_refused_by_name(store, seeds, message, features) -> None:
    with pytest.raises(ValueError, match=message.format(last=store.num_nodes - 1)):
        _loader(store, seeds, features=features, memory_budget="16MiB")


@pytest.mark.parametrize("fanouts", [[], [-5], [0, 3], [2.5], "10,10", [True]])
def test_bad_fanouts_are_refused(store, fanouts) -> None:
    expected = r"fanouts: .*; expected a non-empty list of positive integers \(one per layer; -1 = all neighbours\)"
    with pytest.raises(ValueError, match=expected):
        _loader(store, np.asarray(store.train_idx), fanouts=fanouts)
    with pytest.raises(ValueError, match=expected):
        gnnssd.EdgeLoader(store, np.zeros((1, 2), np.int64), fanouts=fanouts, batch_size=4)


def test_dgl_habits_work(store, store_path) -> None:
    """A store path, DGL's (input_nodes, output_nodes, blocks) with feat/label in the blocks,
    MiniBatch.to, and the labelled mask."""
    features, rows = store.features_memmap(), np.asarray(store.inv)
    with _loader(str(store_path), np.asarray(store.train_idx)) as loader:
        for input_nodes, output_nodes, blocks in loader:
            assert isinstance(blocks[0], dgl.DGLGraph)
            np.testing.assert_array_equal(blocks[0].srcdata["feat"].numpy(), features[rows[input_nodes.numpy()]])
            np.testing.assert_array_equal(blocks[-1].dstdata["label"].numpy(),
                                          np.asarray(store.labels)[rows[output_nodes.numpy()]])
        batch = next(iter(loader))
        assert batch.to("cpu") is batch
        assert bool(batch.labelled.all())  # training nodes carry labels


def test_an_x_gathered_on_another_device_than_the_blocks_is_not_put_in_them(store) -> None:
    """The device gather gives x on the GPU while DGL's blocks (a CPU build) and y are on the
    host: the batch is made, x stays in `x` (csc_blocks carry the graph). The meta device
    stands in for the GPU: DGL refuses its tensors in a CPU graph as it does CUDA ones."""
    with _loader(store, np.asarray(store.train_idx)) as loader:
        batch = next(iter(loader))

    def bare(block: dgl.DGLGraph) -> dgl.DGLGraph:
        return dgl.create_block(block.edges(), num_src_nodes=block.num_src_nodes(), num_dst_nodes=block.num_dst_nodes())

    for x, put in ((batch.x, True), (batch.x.to("meta"), False)):
        made = gnnssd.MiniBatch(batch.input_nodes, batch.output_nodes, [bare(b) for b in batch.blocks], x, batch.y)
        assert ("feat" in made.blocks[0].srcdata) is put and made.x is x


def test_edge_loader_drop_last(store) -> None:
    edges = np.stack([np.arange(10), np.arange(1, 11)], axis=1)
    with gnnssd.EdgeLoader(store, edges, fanouts=[2], batch_size=4, device="cpu", drop_last=True) as loader:
        assert len(loader) == 2
        assert [len(b.pos) for b in loader] == [4, 4]
    with gnnssd.EdgeLoader(store, edges, fanouts=[2], batch_size=4, device="cpu") as loader:
        assert [len(b.pos) for b in loader] == [4, 4, 2]


def test_loaders_share_one_feature_source(store) -> None:
    """A FeatureSource opened once serves a node and an edge loader; closing them releases
    nothing, closing the source releases it."""
    with gnnssd.FeatureSource(store, "ssd", gnnssd.core.config.SSDConfig(memory_budget="16MiB"), device="cpu") as source:
        nodes = gnnssd.NodeLoader(source, store.valid_idx, fanouts=[-1], batch_size=100)
        edges = gnnssd.EdgeLoader(source, np.array([[0, 1], [2, 3]]), fanouts=[2], batch_size=2)
        assert nodes.backend is edges.source.backend is source.backend and source.out_of_core
        assert sum(len(b.output_nodes) for b in nodes) == len(store.valid_idx)
        assert len(list(edges)) == 1
        nodes.close()
        edges.close()
        scratch = source._scratch
        assert scratch.is_dir()
        with pytest.raises(TypeError, match="memory_budget: options of the FeatureSource"):
            gnnssd.NodeLoader(source, store.valid_idx, fanouts=[-1], batch_size=100, memory_budget="1GiB")
    assert not scratch.exists()
