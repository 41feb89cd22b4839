"""Link prediction on one relation of a heterogeneous store: the split held out of every
relation both ways (against DGL's own remove_edges on the source's heterograph), edge
batches equal to DGL's full-neighbour blocks of the training graph without the batch's
pairs, memory and ssd batches alike, and a `task: link` on a relation that learns."""
from __future__ import annotations

import dgl
import numpy as np
import pytest
import torch

from gnnssd.cli.commands import main
from gnnssd.core.config import config_from_dict
from gnnssd.datasets.hetero_synthetic import HeteroSpec, HeteroSyntheticSource
from gnnssd.loading.edge_loader import EdgeLoader
from gnnssd.sampler import node_order
from gnnssd.storage_format import Store, write_store
from gnnssd.training.link import LinkTrainer
from tests.hetero_graph import ToyHeteroSource
from tests.sampler.test_hetero_sampling import _edge_sets, _node_sets


@pytest.fixture(scope="module")
def writes_store(tmp_path_factory):
    """The toy graph with 20% of its author-writes-paper pairs held out (written_by is
    their reverse); cites (paper -> paper, both directions and self-loops possible) stays."""
    source = ToyHeteroSource()
    out = tmp_path_factory.mktemp("hlink") / "store"
    write_store(out, source, edge_split=(0.8, 0.1, 0.1), edge_split_relation="writes", split_seed=3,
                eval_negatives=30)
    return source, Store.open(out, verify=True)


def _without_pairs(graph: dgl.DGLGraph, pairs: set[tuple[int, int]], offsets: dict[str, int]) -> dgl.DGLGraph:
    """`graph` (type-local IDs) minus, in every relation, the edges joining a pair of
    `pairs` (global IDs) in either direction, by dgl.remove_edges."""
    both = pairs | {(v, u) for u, v in pairs}
    for rel in graph.canonical_etypes:  # removing one relation's edges keeps the others' IDs
        src, dst = graph.edges(etype=rel, order="eid")
        ends = zip((src + offsets[rel[0]]).tolist(), (dst + offsets[rel[2]]).tolist())
        eids = torch.tensor([e for e, pair in enumerate(ends) if pair in both], dtype=torch.int64)
        graph = dgl.remove_edges(graph, eids, etype=rel)
    return graph


def _offsets(store: Store) -> dict[str, int]:
    return {t: int(store.schema.offsets[store.schema.type_id(t)]) for t in store.schema.type_names}


def _global(store: Store, split: str) -> set[tuple[int, int]]:
    off = _offsets(store)
    return {(u + off["author"], v + off["paper"]) for u, v in store.link_edges(split).tolist()}


def _training_graph(source: ToyHeteroSource, store: Store) -> dgl.DGLGraph:
    return _without_pairs(source.dgl_graph(), _global(store, "valid") | _global(store, "test"), _offsets(store))


def test_a_renumbered_typed_store_holds_the_same_split_and_training_graph(writes_store, tmp_path):
    """In degree order the store keeps the original-order store's split (the same pairs and
    negatives in the dataset's per-type IDs) and its training graph: held-out pairs are
    left out of the relabelled rebuild too."""
    source, store = writes_store
    out = write_store(tmp_path / "degree", source, order=node_order("degree"), edge_split=(0.8, 0.1, 0.1),
                      edge_split_relation="writes", split_seed=3, eval_negatives=30)
    renumbered = Store.open(out, verify=True)
    assert renumbered.manifest["order"] == "degree" and not np.array_equal(renumbered.perm, store.perm)
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(renumbered.link_edges(split), store.link_edges(split))
    np.testing.assert_array_equal(renumbered.link_negatives("test"), store.link_negatives("test"))
    ours, theirs = renumbered.graph(), store.graph()
    for rel in theirs.canonical_etypes:
        assert set(zip(*(t.tolist() for t in ours.edges(etype=rel)))) == \
            set(zip(*(t.tolist() for t in theirs.edges(etype=rel)))), rel


def test_a_relations_split_leaves_every_relation_both_ways(writes_store):
    source, store = writes_store
    assert store.link_relation == ("author", "writes", "paper")
    assert store.manifest["preprocess"]["edge_split"]["relation"] == "writes"
    splits = {s: _global(store, s) for s in ("train", "valid", "test")}
    off = _offsets(store)
    writes = set(zip(*(e.tolist() for e in source.edges[1])))  # global IDs already
    assert set.union(*splits.values()) == writes  # each distinct pair in one split, directions kept
    assert sum(map(len, splits.values())) == len(writes)
    assert 0 < len(splits["valid"]) == len(splits["test"]) < len(splits["train"])
    stored, reference = store.graph(), _training_graph(source, store)
    for rel in reference.canonical_etypes:
        ours = set(zip(*(t.tolist() for t in stored.edges(etype=rel))))
        assert ours == set(zip(*(t.tolist() for t in reference.edges(etype=rel)))), rel
    held = {(u - off["author"], v) for u, v in splits["valid"] | splits["test"]}
    assert not held & set(zip(*(t.tolist() for t in stored.edges(etype="writes"))))
    assert not {(v, u) for u, v in held} & set(zip(*(t.tolist() for t in stored.edges(etype="written_by"))))
    negatives = store.link_negatives("test")
    assert negatives.shape == (len(splits["test"]), 30)
    assert negatives.min() >= 0 and negatives.max() < store.schema.node_types[0].count  # papers
    assert not (negatives == store.link_edges("test")[:, 1:]).any()


def _edge_batches(store: Store, features: str, fanouts, **options) -> list:
    with EdgeLoader(store, {"writes": store.link_edges("train")}, fanouts=fanouts, batch_size=64, negatives=2,
                    features=features, seed=4, **options) as loader:
        loader.set_epoch(1)
        return list(loader)


def _batch_pairs(batch) -> set[tuple[int, int]]:
    """The batch's positive edges as (author, paper) IDs within their types."""
    authors = batch.output_nodes["author"][batch.pos[:, 0]]
    return set(zip(authors.tolist(), batch.output_nodes["paper"][batch.pos[:, 1]].tolist()))


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_all_neighbour_edge_batches_equal_dgls_blocks_without_the_batchs_pairs(writes_store, features):
    source, store = writes_store
    off = _offsets(store)
    train_graph = _training_graph(source, store)
    held = _global(store, "valid") | _global(store, "test")
    for batch in _edge_batches(store, features, [-1, -1], memory_budget="16MiB"):
        pairs = {(u + off["author"], v) for u, v in _batch_pairs(batch)}
        seeds = {t: ids for t, ids in batch.output_nodes.items() if len(ids)}
        reference = _without_pairs(train_graph, pairs, off)
        _, _, theirs = dgl.dataloading.MultiLayerFullNeighborSampler(2).sample_blocks(reference, seeds)
        for ours, block in zip(batch.blocks, theirs):
            assert _edge_sets(ours) == _edge_sets(block)
            assert _node_sets(ours) == _node_sets(block)
            for rel, edges in _edge_sets(ours).items():  # neither a held-out pair nor the batch's own
                both = {(u + off[rel[0]], v + off[rel[2]]) for u, v in edges}
                both |= {(v, u) for u, v in both}
                assert not both & (held | pairs), rel


def test_memory_and_ssd_edge_batches_are_the_same(writes_store):
    source, store = writes_store
    memory = _edge_batches(store, "memory", [-1, {"writes": -1, "cites": 3}])
    ssd = _edge_batches(store, "ssd", [-1, {"writes": -1, "cites": 3}], memory_budget="16MiB")
    train = store.link_edges("train")
    assert len(memory) == len(ssd) == -(-len(train) // 64)
    seen = []
    for a, b in zip(memory, ssd):
        assert a.relation == b.relation == ("author", "writes", "paper")
        assert torch.equal(a.pos, b.pos) and torch.equal(a.neg, b.neg)
        for t in ("author", "paper"):
            assert torch.equal(a.output_nodes[t], b.output_nodes[t])
        pos = np.stack([a.output_nodes["author"][a.pos[:, 0]], a.output_nodes["paper"][a.pos[:, 1]]], 1)
        neg = np.stack([a.output_nodes["author"][a.neg[:, 0]], a.output_nodes["paper"][a.neg[:, 1]]], 1)
        np.testing.assert_array_equal(neg[:, 0], np.repeat(pos[:, 0], 2))
        assert not (neg[:, 1] == np.repeat(pos[:, 1], 2)).any()  # papers, never the positive's
        for batch in (a, b):
            assert set(batch.x) == {"paper"}
            np.testing.assert_array_equal(batch.x["paper"].numpy(), source.features[batch.input_nodes["paper"].numpy()])
        # the output layer's sampled cites draws differ (DGL's and gnnssd's streams); writes are all taken
        rel = ("author", "writes", "paper")
        assert _edge_sets(a.blocks[-1])[rel] == _edge_sets(b.blocks[-1])[rel]
        seen.append(pos)
    np.testing.assert_array_equal(np.unique(np.concatenate(seen), axis=0), np.unique(train, axis=0))


def test_edge_loader_names_the_relation_on_a_typed_store(writes_store):
    _, store = writes_store
    edges = store.link_edges("train")
    with pytest.raises(ValueError, match=r"one relation's edges as a dict, e.g. \{'cites': \(src, dst\)\}"):
        EdgeLoader(store, edges, fanouts=[2], batch_size=8)
    with pytest.raises(ValueError, match=r"relation 'reviews'; expected one of \['cites', 'writes'"):
        EdgeLoader(store, {"reviews": edges}, fanouts=[2], batch_size=8)
    bad = edges.copy()
    bad[3, 0] = 250
    with pytest.raises(ValueError, match=r"edges\['writes'\]: 'author' node 250 outside 0..199"):
        EdgeLoader(store, {"writes": bad}, fanouts=[2], batch_size=8)


SIGNAL = HeteroSpec(papers=800, authors=320, institutions=16, feat_dim=16, classes=8, cites_per_paper=6.0,
                    cite_homophily=0.9, noise=1.0)


def _expected_random_mrr(negatives: int) -> float:
    """MRR of a score that ranks the positive uniformly among its negatives."""
    return float(np.mean(1 / np.arange(1, negatives + 2)))


def test_a_link_task_on_cites_learns_above_an_untrained_encoder(tmp_path):
    """Citations mostly stay within a class that the papers' features and authors tell:
    a trained R-GCN ranks the cited paper well above an untrained one and chance (ssd
    features: training and evaluation out of core; the memory mode's batches are the
    same, see above)."""
    store = write_store(tmp_path / "store", HeteroSyntheticSource(SIGNAL), edge_split=(0.8, 0.1, 0.1),
                        edge_split_relation="cites", eval_negatives=50)
    config = config_from_dict({
        "store": str(store), "run_dir": str(tmp_path / "run"), "task": "link", "seed": 1, "features": "ssd",
        "model": {"name": "rgcn", "hidden": 32, "dropout": 0.0},
        "sampler": {"fanouts": [{"cites": 5, "cited_by": 5, "written_by": 3, "writes": 3}, 5], "batch_size": 256},
        "train": {"epochs": 3, "lr": 0.01, "progress": False}, "ssd": {"memory_budget": "16MiB"},
        "link": {"negatives": 2, "eval_negatives": 50, "decoder": "mlp"}})
    trainer = LinkTrainer(config)
    try:
        untrained = trainer.evaluate("test")["mrr"]
        history = trainer.fit()
        trained = trainer.evaluate("test")
    finally:
        trainer.close()
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert trained["edges"] == len(Store.open(store).link_edges("test"))
    chance = _expected_random_mrr(50)
    assert trained["mrr"] > 1.5 * max(untrained, chance), (trained["mrr"], untrained, chance)


def test_cli_preprocesses_a_relations_split(tmp_path, capsys):
    out = tmp_path / "store"
    assert main(["preprocess", "hetero-synthetic", "--preset", "mag-small", "--papers", "300", "--edge-split",
                 "0.8,0.1,0.1", "--edge-split-relation", "cites", "--eval-negatives", "5", "--out", str(out)]) == 0
    assert "edges of paper-cites-paper, 5 negatives per eval edge" in capsys.readouterr().out
    store = Store.open(out)
    assert store.link_relation == ("paper", "cites", "paper")
    held = {tuple(p) for p in np.concatenate([store.link_edges("valid"), store.link_edges("test")]).tolist()}
    graph = store.graph()
    for rel in ("cites", "cited_by"):  # a held-out citation is gone both ways from both relations
        pairs = set(zip(*(t.tolist() for t in graph.edges(etype=rel))))
        assert not pairs & (held | {(v, u) for u, v in held})
