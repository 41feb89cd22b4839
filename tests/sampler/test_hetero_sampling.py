"""Typed sampling against DGL's own heterogeneous sampler on the same DGLHeteroGraph."""
from __future__ import annotations

import dgl
import numpy as np
import pytest
import torch

from gnnssd.sampler import Fanouts, NeighborSampler, node_order
from gnnssd.loading.form import to_dgl_blocks
from gnnssd.storage_format import Store, write_store
from tests.hetero_graph import ToyHeteroSource


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    source = ToyHeteroSource()
    store = Store.open(write_store(tmp_path_factory.mktemp("hetero") / "store", source), verify=True)
    return source, store


def _sampler(store: Store, fanouts) -> NeighborSampler:
    return NeighborSampler(store.indptr, store.indices, fanouts, store.etypes,
                           len(store.schema.relations), store.feature_rows)


def _edge_sets(block: dgl.DGLGraph) -> dict:
    """Per relation, the set of (source NID, destination NID) pairs (order-free)."""
    out = {}
    for rel in block.canonical_etypes:
        s, d = block.edges(etype=rel)
        src_ids = block.srcnodes[rel[0]].data[dgl.NID][s]
        dst_ids = block.dstnodes[rel[2]].data[dgl.NID][d]
        out[rel] = set(zip(src_ids.tolist(), dst_ids.tolist()))
    return out


def _node_sets(block: dgl.DGLGraph) -> dict:
    return {t: (set(block.srcnodes[t].data[dgl.NID].tolist()), set(block.dstnodes[t].data[dgl.NID].tolist()))
            for t in block.srctypes}


def test_all_neighbour_blocks_equal_dgls_hetero_sampler(toy):
    source, store = toy
    graph = source.dgl_graph()
    seeds = np.array([3, 17, 42, 150, 299])
    ours = to_dgl_blocks(_sampler(store, [-1, -1, -1]).sample(seeds, seed=1), schema=store.schema)
    _, _, theirs = dgl.dataloading.MultiLayerFullNeighborSampler(3).sample_blocks(
        graph, {"paper": torch.from_numpy(seeds)})
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        assert sorted(a.canonical_etypes) == sorted(b.canonical_etypes)
        assert _edge_sets(a) == _edge_sets(b)
        assert _node_sets(a) == _node_sets(b)
        for t in a.dsttypes:  # destinations first among the sources, per type (DGL's blocks)
            n = a.num_dst_nodes(t)
            assert torch.equal(a.srcnodes[t].data[dgl.NID][:n], a.dstnodes[t].data[dgl.NID])
    assert torch.equal(ours[-1].dstnodes["paper"].data[dgl.NID], torch.from_numpy(seeds))


def test_per_relation_fanouts_draw_existing_edges_within_each_fanout(toy):
    source, store = toy
    graph = source.dgl_graph()
    fanouts = {"cites": 2, "writes": 1, "written_by": 3, "affiliated_with": 1, "employs": 0}
    sampler = _sampler(store, Fanouts.parse([fanouts] * 2).array(store.schema))
    blocks = to_dgl_blocks(sampler.sample(np.arange(0, 300, 7), seed=5), schema=store.schema)
    for block in blocks:
        for rel, pairs in _edge_sets(block).items():
            assert len(pairs) == block.num_edges(rel)  # no edge twice
            for u, v in pairs:
                assert graph.has_edges_between(u, v, etype=rel)
            dst = block.dstnodes[rel[2]].data[dgl.NID]
            got = np.bincount([v for _, v in pairs], minlength=int(dst.max()) + 1 if len(dst) else 0)
            degree = graph.in_degrees(dst, etype=rel).numpy()
            taken = got[dst.numpy()] if len(dst) else np.empty(0)
            np.testing.assert_array_equal(taken, np.minimum(degree, fanouts[rel[1]]))


def test_a_relations_draw_does_not_depend_on_other_relations_fanouts(toy):
    _, store = toy
    seeds = np.arange(0, 300, 11)
    schema = store.schema
    one = _sampler(store, Fanouts.parse([{"cites": 2, "writes": 1}]).array(schema)).sample(seeds, seed=9)
    two = _sampler(store, Fanouts.parse([{"cites": 2, "writes": 3}]).array(schema)).sample(seeds, seed=9)
    cites = [r for _, r, _ in schema.relations].index("cites")

    def cited(mfgs):
        src, dst = mfgs.edges(0)
        mine = mfgs.edge_type == cites
        return set(zip(mfgs.nodes[src[mine]].tolist(), mfgs.nodes[dst[mine]].tolist()))

    assert cited(one) == cited(two) and cited(one)


def test_featureless_types_read_no_rows(toy):
    _, store = toy
    mfgs = _sampler(store, [-1, -1]).sample(np.array([5, 6]), seed=0)
    assert (mfgs.input_nodes >= store.feature_rows).any()
    np.testing.assert_array_equal(mfgs.input_rows, mfgs.input_nodes[mfgs.input_nodes < 300])


@pytest.mark.parametrize("order", ["original", "degree"])
def test_store_graph_is_the_sources_heterograph(toy, order, tmp_path):
    source, store = toy
    if order != "original":  # store IDs differ from the dataset's within every type
        store = Store.open(write_store(tmp_path / "store", source, order=node_order(order)))
    ours, theirs = store.graph(), source.dgl_graph()
    assert sorted(ours.canonical_etypes) == sorted(theirs.canonical_etypes)
    for rel in theirs.canonical_etypes:
        assert set(zip(*(t.tolist() for t in ours.edges(etype=rel)))) == \
            set(zip(*(t.tolist() for t in theirs.edges(etype=rel))))
    assert {t: ours.num_nodes(t) for t in ours.ntypes} == {t: theirs.num_nodes(t) for t in theirs.ntypes}
