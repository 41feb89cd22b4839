"""The MAG-like synthetic source: deterministic, chunking-independent, typed edges in range,
reverses exactly swapped, and a label that lives in the relations."""
from __future__ import annotations

import numpy as np
import pytest

from gnnssd.datasets import hetero_synthetic_source
from gnnssd.storage_format import DatasetError

SMALL = {"papers": 3000, "authors": 2500, "institutions": 60}


def _source(**overrides):
    return hetero_synthetic_source("mag-small", **{**SMALL, **overrides})


def test_same_seed_same_graph_and_features_whatever_the_chunking():
    a, b = _source(), _source()
    for r in range(len(a.schema.relations)):
        for x, y in zip(a.load_relation_edges(r), b.load_relation_edges(r)):
            np.testing.assert_array_equal(x, y)
    whole = np.concatenate(list(a.feature_chunks(0, 3000)))
    assert whole.shape == (3000, a.feat_dim)
    np.testing.assert_array_equal(np.concatenate(list(b.feature_chunks(0, 777))), whole)
    np.testing.assert_array_equal(np.concatenate(list(b.feature_chunks(1234, 100))), whole[1234:])
    other = _source(seed=1)
    assert not np.array_equal(other.load_relation_edges(0)[0], a.load_relation_edges(0)[0])


def test_edges_join_the_types_their_relation_names_and_reverses_are_swapped():
    source = _source()
    schema, offsets = source.schema, source.schema.offsets
    for r, (src_type, _, dst_type) in enumerate(schema.relations):
        src, dst = source.load_relation_edges(r)
        for ends, name in ((src, src_type), (dst, dst_type)):
            t = schema.type_id(name)
            assert ends.min() >= offsets[t] and ends.max() < offsets[t + 1]
    for forward in range(3):
        src, dst = source.load_relation_edges(forward)
        back_src, back_dst = source.load_relation_edges(forward + 3)
        np.testing.assert_array_equal(back_src, dst)
        np.testing.assert_array_equal(back_dst, src)
    assert len(_source(add_reverse=False).schema.relations) == 3


def test_the_label_is_in_the_relations_not_in_the_features():
    _assert_the_label_is_in_the_relations(_source())


def _assert_the_label_is_in_the_relations(source):
    labels = source.load_labels()[:3000]
    offsets = source.schema.offsets
    authors, papers = source.load_relation_edges(1)  # writes
    members, institutions = source.load_relation_edges(2)  # affiliated_with
    institution_class = source._institution_class
    author_votes = np.zeros((2500, source.spec.classes))
    np.add.at(author_votes, (members - offsets[1], institution_class[institutions - offsets[2]]), 1)
    paper_votes = np.zeros((3000, source.spec.classes))
    np.add.at(paper_votes, (papers, author_votes[authors - offsets[1]].argmax(1)), 1)
    by_relations = float((paper_votes.argmax(1) == labels).mean())
    features = np.concatenate(list(source.feature_chunks(0, 3000)))
    by_nearest_centroid = float(((features @ source._centroids.T).argmax(1) == labels).mean())
    assert by_relations > 0.75 > by_nearest_centroid + 0.2, (by_relations, by_nearest_centroid)
    splits = source.load_splits()
    assert sum(len(s) for s in splits.values()) == 3000 and (labels >= 0).all()
    assert (source.load_labels()[3000:] == -1).all()


def test_unknown_preset_and_bad_sizes_are_refused():
    with pytest.raises(DatasetError, match="preset 'mag-huge'"):
        hetero_synthetic_source("mag-huge")
    with pytest.raises(DatasetError, match="papers 0"):
        hetero_synthetic_source("mag-small", papers=0)


@pytest.fixture
def small_blocks(monkeypatch):
    """Many node and edge blocks on a small graph: each block its own RNG stream."""
    from gnnssd.datasets import hetero_synthetic
    monkeypatch.setattr(hetero_synthetic, "NODE_BLOCK", 700)
    monkeypatch.setattr(hetero_synthetic, "EDGE_BLOCK", 2048)


@pytest.mark.parametrize("overrides", [{}, {"institutions_per_author": 0.3}])
def test_a_relation_streamed_in_blocks_is_the_relation_loaded_whole(small_blocks, overrides):
    source = _source(**overrides)
    for r in range(len(source.schema.relations)):
        chunks = list(source.relation_edge_chunks(r))
        assert len(chunks) > 1 or r % 3 == 2 and overrides
        src, dst = source.load_relation_edges(r)
        assert len(src) == source.relation_edge_count(r)
        np.testing.assert_array_equal(np.concatenate([s for s, _ in chunks]), src)
        np.testing.assert_array_equal(np.concatenate([d for _, d in chunks]), dst)
    if not overrides:  # the class still lives in the relations when drawn block by block
        _assert_the_label_is_in_the_relations(source)


def test_streaming_a_relation_holds_a_block_not_the_relation(small_blocks):
    """The 1.3 G citations of mag240m are streamed: the peak while walking a relation is
    a few blocks' arrays, whatever the relation's length."""
    import tracemalloc
    source = _source(papers=3000, cites_per_paper=200.0)  # 600k citations, ~290 blocks
    source._papers_by_class  # node-sized tables made before the measurement
    tracemalloc.start()
    edges = sum(len(s) for s, _ in source.relation_edge_chunks(0))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert edges == 600_000
    whole_relation = edges * 2 * 8
    assert peak < whole_relation / 20, (peak, whole_relation)
