"""The heterogeneous topology built out of core (per relation through the bucketed external
sort, interleaved a node range at a time): equal to the in-memory build, in the source's
order and relabelled, with a link split's held-out pairs left out; a preprocess over the
limit writes the same store as one within it, and resumes after a kill in any step."""
from __future__ import annotations

import numpy as np
import pytest

from gnnssd.datasets import hetero_synthetic_source
from gnnssd.sampler import node_order
from gnnssd.storage_format import Store, write_store
from gnnssd.storage_format.preprocess import typed_csc
from gnnssd.storage_format.preprocess.csc import renumber_csc_to_file
from gnnssd.storage_format.link_split import relation_link_split
from gnnssd.storage_format.preprocess.typed_csc import checked_relation_edges, typed_csc_to_files

from tests.storage_format.test_preprocess_scale import Interrupted, _interrupt_at


def _source():
    return hetero_synthetic_source("mag-small", papers=1500, authors=1200, institutions=40)


@pytest.fixture
def small_chunks(monkeypatch):
    """Many chunks, buckets and node ranges on a small graph."""
    monkeypatch.setattr(typed_csc, "RELATION_CHUNK_EDGES", 1000)
    monkeypatch.setattr(typed_csc, "INTERLEAVE_EDGES", 3000)


def _link(source):
    schema = source.schema
    r = 1  # writes: author -> paper
    t = schema.type_id(schema.relations[r][2])
    return relation_link_split(*checked_relation_edges(source, schema, r), source.num_nodes,
                               (int(schema.offsets[t]), schema.node_types[t].count), (0.8, 0.1, 0.1), 3, 20,
                               schema.relations[r][1])


@pytest.mark.parametrize("with_link", [False, True])
def test_out_of_core_build_equals_the_in_memory_one(tmp_path, small_chunks, with_link):
    source = _source()
    link = _link(source) if with_link else None
    expected = typed_csc.typed_csc(source, lambda *a: None, link=link)
    got = typed_csc_to_files(source, lambda *a: None, 700, tmp_path / "scratch", tmp_path / "indices.npy",
                             tmp_path / "etypes.npy", link=link)
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert not (tmp_path / "scratch").exists()


def test_a_typed_csc_renumbered_through_window_files_equals_one_built_from_relabelled_edges(tmp_path):
    """Renumbering keeps each row's relation runs in schema order and sorts each run by
    the new source: the CSC built from the relabelled edges, whatever the window size."""
    source = _source()
    n = source.num_nodes
    indptr, indices, etypes = typed_csc.typed_csc(source, lambda *a: None)
    offsets = source.schema.offsets  # a typed order keeps each type's IDs
    perm = np.concatenate([lo + np.random.default_rng(t).permutation(hi - lo)
                           for t, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:]))])
    inv = np.empty(n, np.int64)
    inv[perm] = np.arange(n)
    relabelled = [(inv[s], inv[d]) for s, d in (checked_relation_edges(source, source.schema, r)
                                                for r in range(len(source.schema.relations)))]

    class Relabelled:
        name, schema, num_nodes = "relabelled", source.schema, n

        def load_relation_edges(self, r):
            return relabelled[r]

    expected = typed_csc.typed_csc(Relabelled(), lambda *a: None)
    for chunk in (500, 1 << 20):
        new_indptr, new_indices = renumber_csc_to_file(indptr, indices, perm, inv.astype(indices.dtype),
                                                       tmp_path / "indices.npy", chunk, lambda *a: None,
                                                       etypes, tmp_path / "etypes.npy")
        np.testing.assert_array_equal(new_indptr, expected[0])
        np.testing.assert_array_equal(new_indices, expected[1])
        new_etypes = np.load(tmp_path / "etypes.npy")
        assert new_etypes.dtype == etypes.dtype
        np.testing.assert_array_equal(new_etypes, expected[2])
        assert not list(tmp_path.glob("indices.npy.window-*"))


def _files(store) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(store.iterdir()) if p.name != "manifest.json"}


@pytest.mark.parametrize("order", ["original", "degree"])
def test_a_store_over_the_memory_limit_equals_one_within_it(tmp_path, small_chunks, order):
    kwargs = dict(order=order if order == "original" else node_order(order), edge_split=(0.8, 0.1, 0.1),
                  edge_split_relation="writes", eval_negatives=20)
    within = write_store(tmp_path / "within", _source(), **kwargs)
    heard = []
    over = write_store(tmp_path / "over", _source(), memory_limit=1, **kwargs,
                       progress=lambda stage, done, total: heard.append(stage))
    assert "interleave" in heard  # the out-of-core build ran
    assert _files(over) == _files(within)
    Store.open(over, verify=True)


@pytest.mark.parametrize("stage, count", [("merge buckets", 3), ("relations", 2), ("interleave", 2),
                                          ("renumber", 1)])
def test_the_out_of_core_typed_build_resumes_after_a_kill_in_any_step(tmp_path, small_chunks, stage, count):
    """Stopped in a relation's buckets, between relations, in the interleave or in the
    renumbering into store order (after its first pass); rerun, every file equals an
    uninterrupted run's."""
    kwargs = dict(order=node_order("degree"), memory_limit=1)
    reference = write_store(tmp_path / "reference", _source(), **kwargs)
    out = tmp_path / "store"
    with pytest.raises(Interrupted):
        write_store(out, _source(), progress=_interrupt_at(stage, count), **kwargs)
    assert not out.exists()
    write_store(out, _source(), **kwargs)
    assert _files(out) == _files(reference)


class _LoadedWhole:
    """A source that loads each relation whole (no relation_edge_chunks stream)."""

    def __init__(self, source):
        self._source = source

    def __getattr__(self, name):
        if name in ("relation_edge_chunks", "relation_edge_count"):
            raise AttributeError(name)
        return getattr(self._source, name)


class _BadSecondChunk(_LoadedWhole):
    """A streamed relation whose second chunk has a source outside its type."""

    def relation_edge_count(self, r):
        return self._source.relation_edge_count(r)

    def relation_edge_chunks(self, r):
        for i, (src, dst) in enumerate(self._source.relation_edge_chunks(r)):
            if i == 1:
                src = src.copy()
                src[5] = self.schema.offsets[-1]  # one past the last node
            yield src, dst


def _build(source, folder):
    return typed_csc_to_files(source, lambda *a: None, 700, folder / "scratch", folder / "indices.npy",
                              folder / "etypes.npy")


def test_a_relation_loaded_whole_builds_what_the_stream_builds(tmp_path, small_chunks):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    for a, b in zip(_build(_source(), tmp_path / "a"), _build(_LoadedWhole(_source()), tmp_path / "b")):
        np.testing.assert_array_equal(a, b)


def test_a_bad_edge_in_a_streamed_chunk_is_named_by_its_place_in_the_relation(tmp_path, monkeypatch):
    from gnnssd.datasets import hetero_synthetic
    from gnnssd.storage_format import DatasetError
    monkeypatch.setattr(hetero_synthetic, "NODE_BLOCK", 600)  # cites: 1500 papers x 10 in blocks of 4096
    monkeypatch.setattr(hetero_synthetic, "EDGE_BLOCK", 4096)
    with pytest.raises(DatasetError, match=r"relation 'cites' edge 4101 has source \d+, not a 'paper' node"):
        _build(_BadSecondChunk(_source()), tmp_path)
