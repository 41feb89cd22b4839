"""LABOR (layer-neighbour) sampling against its definition: the in-edge u -> v is kept iff
the source's variate r_u, shared by every destination of the layer, is <= fanout / degree;
each destination keeps `fanout` edges on average; fewer distinct sources than uniform
sampling where neighbourhoods overlap; deterministic given the seed. Through the loaders:
the numba kernel in memory and ssd mode, the stored rows either way."""
from __future__ import annotations

import numpy as np
import pytest

import gnnssd
from gnnssd.core.config import config_from_dict
from gnnssd.datasets import synthetic_source
from gnnssd.sampler.graphs import random_csc
from gnnssd.sampler.sampling import NeighborSampler, _uniform01
from gnnssd.storage_format import write_store
from tests.hetero_graph import ToyHeteroSource


def _clustered_csc(n: int = 600, degree: int = 20, cluster: int = 40, seed: int = 0):
    """Nodes in clusters of `cluster`, each with `degree` distinct in-neighbours from its
    own cluster: neighbourhoods that overlap, as in a community graph."""
    rng = np.random.default_rng(seed)
    sources = [np.sort(rng.choice(cluster, degree, replace=False)) + (v // cluster) * cluster for v in range(n)]
    indptr = np.arange(0, n * degree + 1, degree, dtype=np.int64)
    return indptr, np.concatenate(sources).astype(np.int32)


def _one_hop(indptr, indices, seeds, fanout, seed, batch_id=0, **options):
    m = NeighborSampler(indptr, indices, [fanout], method="labor", **options).sample(seeds, seed, batch_id)
    s, d = m.edges(0)
    return m.nodes[s], m.nodes[d], m


def test_an_edge_is_kept_iff_its_sources_variate_is_below_fanout_over_degree() -> None:
    indptr, indices = random_csc(500, 8000, seed=3)
    seeds = np.arange(0, 500, 3)
    fanout, seed, batch = 4, 77, 5
    src, dst, _ = _one_hop(indptr, indices, seeds, fanout, seed, batch)
    kept = set(zip(src.tolist(), dst.tolist()))
    for v in seeds:
        nbrs = indices[indptr[v]:indptr[v + 1]]
        threshold = 1.0 if len(nbrs) <= fanout else fanout / len(nbrs)
        # the output layer is layer 0 of a 1-layer sampler; its variates are (seed, batch, 0, u)
        expected = {(int(u), int(v)) for u in nbrs if _uniform01(seed, batch, 0, u) <= threshold}
        assert {e for e in kept if e[1] == v} == expected


def test_each_destination_keeps_fanout_edges_on_average() -> None:
    indptr, indices = _clustered_csc()
    seeds = np.arange(600)
    counts = [np.bincount(_one_hop(indptr, indices, seeds, 5, seed=11, batch_id=b)[1], minlength=600)
              for b in range(20)]
    counts = np.concatenate(counts)
    # 12,000 destinations of degree 20: the mean's standard error is ~0.02
    assert abs(counts.mean() - 5.0) < 0.1
    assert counts.max() > 5  # a count varies (uniform sampling takes exactly 5)


def test_fewer_distinct_sources_than_uniform_where_neighbourhoods_overlap() -> None:
    indptr, indices = _clustered_csc()
    rng = np.random.default_rng(0)
    labor = uniform = 0
    for b in range(10):
        seeds = np.sort(rng.choice(600, 64, replace=False))
        for method in ("labor", "uniform"):
            m = NeighborSampler(indptr, indices, [5, 5], method=method).sample(seeds, 3, b)
            if method == "labor":
                labor += int(m.num_src[0])
            else:
                uniform += int(m.num_src[0])
    assert labor < 0.8 * uniform


def test_labor_is_deterministic_given_the_seed() -> None:
    indptr, indices = random_csc(400, 6000, seed=1)
    seeds = np.arange(0, 400, 7)
    a, b, c = (NeighborSampler(indptr, indices, [3, 3], method="labor").sample(seeds, s, 2) for s in (9, 9, 10))
    assert np.array_equal(a.nodes, b.nodes) and np.array_equal(a.edge_src, b.edge_src)
    assert not np.array_equal(a.nodes, c.nodes)


@pytest.mark.parametrize("typed", [False, True])
def test_a_dense_graphs_mini_batches_keep_what_the_definition_keeps(typed) -> None:
    # 200 nodes of in-degree ~60, three mini-batches of 100 seeds sampled together, with
    # excluded pairs: each mini-batch's kept edges (and relations) are those whose source's
    # variate of that mini-batch is <= fanout / the relation's degree after the exclusion
    indptr, indices = random_csc(200, 60, seed=4)
    rng = np.random.default_rng(0)
    etypes = (np.concatenate([np.sort(rng.integers(0, 3, indptr[v + 1] - indptr[v])) for v in range(200)])
              .astype(np.int8) if typed else np.empty(0, np.int8))
    seeds = [np.sort(rng.choice(200, 100, replace=False)) for _ in range(3)]
    exclude = [rng.integers(0, 200, (30, 2)) for _ in range(3)]
    fanout, seed, first = 5, 9, 4
    sampler = NeighborSampler(indptr, indices, [fanout], etypes=etypes, num_relations=3 if typed else 1,
                              method="labor")
    got = sampler.sample_many(np.concatenate(seeds), np.array([0, 100, 200, 300]), seed, first, exclude)
    for b, m in enumerate(got):
        banned = {(int(u), int(v)) for u, v in exclude[b]} | {(int(v), int(u)) for u, v in exclude[b]}
        expected = set()
        for v in seeds[b]:
            lo, hi = indptr[v], indptr[v + 1]
            relations = etypes[lo:hi] if typed else np.zeros(hi - lo, np.int8)
            for r in np.unique(relations):
                nbrs = [int(u) for u in indices[lo:hi][relations == r] if (int(u), int(v)) not in banned]
                threshold = 1.0 if len(nbrs) <= fanout else fanout / len(nbrs)
                expected |= {(u, int(v), int(r)) for u in nbrs if _uniform01(seed, first + b, 0, u) <= threshold}
        s, d = m.edges(0)
        rel = m.edge_type if typed else np.zeros(len(s), np.int8)
        kept = list(zip(m.nodes[s].tolist(), m.nodes[d].tolist(), rel.tolist()))
        assert len(kept) == len(set(kept)) and set(kept) == expected


def test_excluded_edges_are_never_kept() -> None:
    indptr, indices = _clustered_csc()
    seeds = np.arange(40)
    pairs = np.stack([indices[indptr[0]:indptr[1]].astype(np.int64), np.zeros(20, np.int64)], axis=1)
    excluded = {(int(u), int(v)) for u, v in pairs} | {(int(v), int(u)) for u, v in pairs}
    every = {(int(u), int(v)) for v in seeds for u in indices[indptr[v]:indptr[v + 1]]}
    for trial in range(5):
        m = NeighborSampler(indptr, indices, [30], method="labor").sample(seeds, trial, 0, exclude=pairs)
        s, d = m.edges(0)
        kept = set(zip(m.nodes[s].tolist(), m.nodes[d].tolist()))
        assert kept == every - excluded  # fanout 30 > degree 20: all but the excluded


def test_typed_relations_each_keep_fanout_over_their_own_degree(tmp_path) -> None:
    store = gnnssd.Store.open(write_store(tmp_path / "s", ToyHeteroSource()))
    sampler = NeighborSampler(store.indptr, store.indices, [np.array([2, 1, 0, 0, 0])], store.etypes,
                              len(store.schema.relations), store.feature_rows, method="labor")
    seeds = np.arange(300)
    m = sampler.sample(seeds, 5, 0)
    etypes = np.asarray(store.etypes)
    s, d = m.edges(0)
    src, dst, rel = m.nodes[s], m.nodes[d], m.edge_type
    assert set(np.unique(rel).tolist()) <= {0, 1}
    for v in range(0, 300, 17):
        lo, hi = store.indptr[v], store.indptr[v + 1]
        for r, fanout in ((0, 2), (1, 1)):
            nbrs = np.asarray(store.indices[lo:hi])[etypes[lo:hi] == r]
            threshold = 1.0 if len(nbrs) <= fanout else fanout / len(nbrs)
            expected = {int(u) for u in nbrs if _uniform01(5, 0, 0, u) <= threshold}
            assert set(src[(dst == v) & (rel == r)].tolist()) == expected


def test_sampler_method_is_a_config_key() -> None:
    cfg = config_from_dict({"store": "s", "run_dir": "r", "sampler": {"method": "labor"}})
    assert cfg.sampler.method == "labor"
    with pytest.raises(ValueError, match=r"method: 'labr'; expected one of \('uniform', 'labor'\)"):
        NeighborSampler(np.zeros(2, np.int64), np.zeros(0, np.int32), [2], method="labr")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> gnnssd.Store:
    return gnnssd.Store.open(write_store(tmp_path_factory.mktemp("labor") / "tiny", synthetic_source("tiny")))


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_loaders_sample_by_labor_with_the_stored_rows(store, features) -> None:
    features_of = np.asarray(store.read_features(), np.float32)
    inputs = {}
    for method in ("uniform", "labor"):
        with gnnssd.NodeLoader(store, store.train_idx, fanouts=[5, 5], batch_size=64, features=features,
                               method=method, memory_budget="16MiB", device="cpu", seed=1) as loader:
            assert loader.source.sampling.method == method
            inputs[method] = 0
            for mb in loader:
                ids = mb.input_nodes.numpy()
                np.testing.assert_array_equal(mb.x.numpy(), features_of[ids])
                src, dst = mb.blocks[-1].edges()
                assert int(np.bincount(dst.numpy()).max()) <= 5 * 4  # a few over the fanout, never a flood
                inputs[method] += len(ids)
    assert inputs["labor"] < inputs["uniform"]


def test_a_bad_method_is_refused_by_the_loader(store) -> None:
    with pytest.raises(ValueError, match=r"method: 'labr'"):
        gnnssd.NodeLoader(store, store.train_idx, fanouts=[5], batch_size=64, method="labr", device="cpu")
