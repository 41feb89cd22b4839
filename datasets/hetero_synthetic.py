"""A synthetic heterogeneous graph shaped like MAG240M: papers, authors, institutions.

Papers carry features and labels; authors and institutions have neither. Relations are
MAG240M's three (paper-cites-paper, author-writes-paper, author-affiliated_with-institution)
and, with `add_reverse` (as DGL's MAG recipes do), their reverses (cited_by, written_by,
employs).

The label lives in the relations: every institution has a class, an author takes the class
of their first institution, and a paper's label is its first author's class. Co-authors
are mostly of the author's class and citations partly stay within the class. A paper's
features are its class centroid under heavy noise, so its own row is a weak signal (an MLP
stays low) while its authors' other papers tell the class (a relational GNN two hops away,
paper <- author <- paper, recovers it); flattening the relations mixes those signals with
the weaker citations.

Every part is a function of (seed, what, block): each relation draws its edges in blocks,
each block from its own stream, and features are generated in blocks of rows, so a
preprocess streams a relation (1.3 G citations for the `mag240m` preset) and the features
without holding either; what stays in memory is a class per node (int16) and each type's
nodes sorted by class (int32), the draws that join a class.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import Any, Iterator

import numpy as np

from gnnssd.storage_format import DatasetError, GraphSchema, NodeType

from .base import reversed_relations

FEATURE_BLOCK = 1 << 16  # rows generated per RNG stream: fixes the output whatever the chunking
NODE_BLOCK = 1 << 20  # nodes per RNG stream of a per-node draw (first author, first institution)
EDGE_BLOCK = 1 << 22  # edges per RNG stream of a relation's other drawn edges
RELATIONS = (("paper", "cites", "paper"), ("author", "writes", "paper"),
             ("author", "affiliated_with", "institution"))
REVERSES = {"cites": "cited_by", "writes": "written_by", "affiliated_with": "employs"}


@dataclass(frozen=True)
class HeteroSpec:
    papers: int
    authors: int
    institutions: int
    feat_dim: int
    classes: int
    cites_per_paper: float = 10.0
    authors_per_paper: float = 3.5
    institutions_per_author: float = 1.3
    #: Chance that a co-author (an author after the first) is of the first author's class.
    coauthor_homophily: float = 0.6
    #: Chance that a citation stays within the citing paper's class.
    cite_homophily: float = 0.3
    #: Noise around the class centroid of a paper's features (centroids are unit apart).
    noise: float = 4.0
    train_fraction: float = 0.6
    valid_fraction: float = 0.2
    test_fraction: float = 0.2
    add_reverse: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("papers", "authors", "institutions", "feat_dim", "classes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise DatasetError(f"hetero synthetic {name} {getattr(self, name)!r}: expected a positive integer")
        if self.train_fraction + self.valid_fraction + self.test_fraction > 1:
            raise DatasetError("hetero synthetic: train, valid and test fractions add up to more than 1")


PRESETS: dict[str, HeteroSpec] = {
    # seconds to preprocess and train: the tests' and the accuracy script's graph
    "mag-small": HeteroSpec(papers=20_000, authors=20_000, institutions=500, feat_dim=64, classes=16),
    # MAG240M's shape at a size this machine holds: 5 GiB of float16 paper features,
    # ~300M edges with reverses; MAG240M-like split sizes (about 11% of papers train)
    "mag": HeteroSpec(papers=10_000_000, authors=10_000_000, institutions=25_000, feat_dim=256,
                      classes=153, train_fraction=0.11, valid_fraction=0.014, test_fraction=0.01),
    # MAG240M's counts per node type and relation (1,297,748,926 cites, 386,022,720 writes,
    # 44,592,586 affiliated_with) and split sizes (1,112,392 / 138,949 / 146,818 papers);
    # features narrowed from 768 to 128 float16 (31.2 GB) so the store fits ~80 GB of disk
    "mag240m": HeteroSpec(papers=121_751_666, authors=122_383_112, institutions=25_721, feat_dim=128,
                          classes=153, cites_per_paper=1_297_748_926 / 121_751_666,
                          authors_per_paper=1 + 264_271_054 / 121_751_666,
                          institutions_per_author=44_592_586 / 122_383_112,
                          train_fraction=1_112_392 / 121_751_666, valid_fraction=138_949 / 121_751_666,
                          test_fraction=146_818 / 121_751_666),
}
# Half of MAG240M's papers and authors at its per-node rates (so half of each relation,
# 1.73 G edges with reverses; 15.6 GB of features): what a machine with ~70 GB of free disk
# preprocesses beside nothing else in about an hour
PRESETS["mag240m-half"] = replace(PRESETS["mag240m"], papers=60_875_833, authors=61_191_556)
PRESET_DTYPES = {"mag": "float16", "mag240m": "float16", "mag240m-half": "float16"}


class HeteroSyntheticSource:
    """The TypedSource of a HeteroSpec (see storage_format.preprocess.source.TypedSource)."""

    symmetric = False

    def __init__(self, spec: HeteroSpec, name: str = "hetero-synthetic"):
        self.spec = spec
        self.name = name
        relations = reversed_relations(list(RELATIONS), spec.add_reverse, REVERSES.get)
        self.schema = GraphSchema((NodeType("paper", spec.papers, True), NodeType("author", spec.authors, False),
                                   NodeType("institution", spec.institutions, False)), tuple(relations), "paper")
        self.num_nodes = self.schema.num_nodes
        self.feat_dim = spec.feat_dim

    def describe(self) -> dict[str, Any]:
        # draws 2: edges drawn in blocks (relation_edge_chunks); a store of the earlier
        # whole-relation draws is another graph, so a preprocess must not resume it
        return {"kind": "hetero-synthetic", "draws": 2, **asdict(self.spec)}

    def relation_edge_count(self, relation: int) -> int:
        """Edges of relation `relation` (a reverse has its forward relation's count)."""
        spec = self.spec
        forward = relation % len(RELATIONS)
        if forward == 0:
            return int(spec.papers * spec.cites_per_paper)
        if forward == 1:
            return spec.papers + self._extra_authorships
        if spec.institutions_per_author < 1:
            return int(spec.authors * spec.institutions_per_author)
        return spec.authors + int(spec.authors * (spec.institutions_per_author - 1))

    @property
    def num_edges(self) -> int:
        """Edges over every relation, reverses included (before repeats are dropped): what
        preprocess sizes its topology build and disk estimate by."""
        return sum(self.relation_edge_count(r) for r in range(len(self.schema.relations)))

    @property
    def _extra_authorships(self) -> int:
        return int(self.spec.papers * max(self.spec.authors_per_paper - 1, 0))

    def _rng(self, *what: int) -> np.random.Generator:
        return np.random.default_rng([self.spec.seed, *what])

    @cached_property
    def _class_dtype(self) -> np.dtype:
        return np.dtype(np.int16 if self.spec.classes < 2**15 else np.int32)

    @cached_property
    def _institution_class(self) -> np.ndarray:
        return self._rng(1).integers(0, self.spec.classes, self.spec.institutions).astype(self._class_dtype)

    def _first_institutions(self, block: int, lo: int, hi: int) -> np.ndarray:
        """Authors lo..hi-1's first institution (which sets the author's class)."""
        return self._rng(2, 0, block).integers(0, self.spec.institutions, hi - lo)

    def _first_authors(self, block: int, lo: int, hi: int) -> np.ndarray:
        """Papers lo..hi-1's first author, Zipf-skewed: some authors are prolific."""
        rng = self._rng(3, 0, block)
        return (rng.zipf(1.8, hi - lo) - 1 + rng.integers(0, self.spec.authors, hi - lo)) % self.spec.authors

    @cached_property
    def _author_class(self) -> np.ndarray:
        return np.concatenate([self._institution_class[self._first_institutions(b, lo, hi)]
                               for b, lo, hi in _blocks(self.spec.authors, NODE_BLOCK)])

    @cached_property
    def _paper_class(self) -> np.ndarray:
        return np.concatenate([self._author_class[self._first_authors(b, lo, hi)]
                               for b, lo, hi in _blocks(self.spec.papers, NODE_BLOCK)])

    @cached_property
    def _authors_by_class(self) -> tuple[np.ndarray, np.ndarray]:
        return self._by_class(self._author_class)

    @cached_property
    def _papers_by_class(self) -> tuple[np.ndarray, np.ndarray]:
        return self._by_class(self._paper_class)

    def _by_class(self, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(IDs sorted by class, start of each class in them; classes with no member
        borrow the whole range)."""
        order = np.argsort(classes, kind="stable").astype(np.int32 if len(classes) < 2**31 else np.int64)
        starts = np.searchsorted(classes[order], np.arange(self.spec.classes + 1))
        return order, starts

    def _affiliations(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(author, institution) type-local pairs: every author's first institution, then
        extra ones so that authors average `institutions_per_author`; below 1, only the
        first authors' first institutions, as MAG240M lists an institution for a third of
        its authors."""
        spec = self.spec
        listed = self.relation_edge_count(2)
        for b, lo, hi in _blocks(min(spec.authors, listed), NODE_BLOCK):
            yield np.arange(lo, hi), self._first_institutions(b, lo, hi)
        for b, lo, hi in _blocks(listed - spec.authors, EDGE_BLOCK):
            rng = self._rng(2, 1, b)
            yield rng.integers(0, spec.authors, hi - lo), rng.integers(0, spec.institutions, hi - lo)

    def _authorship(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(author, paper) type-local pairs: each paper's first author, then co-authors
        mostly of the first author's class (the paper's)."""
        spec = self.spec
        for b, lo, hi in _blocks(spec.papers, NODE_BLOCK):
            yield self._first_authors(b, lo, hi), np.arange(lo, hi)
        for b, lo, hi in _blocks(self._extra_authorships, EDGE_BLOCK):
            rng = self._rng(3, 1, b)
            papers = rng.integers(0, spec.papers, hi - lo)
            same = rng.random(hi - lo) < spec.coauthor_homophily
            coauthors = rng.integers(0, spec.authors, hi - lo)
            coauthors[same] = _member_of(self._authors_by_class, self._paper_class[papers[same]], rng)
            yield coauthors, papers

    def _citations(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(cited, citing) type-local pairs: the citing paper aggregates what it cites."""
        spec = self.spec
        for b, lo, hi in _blocks(self.relation_edge_count(0), EDGE_BLOCK):
            rng = self._rng(4, b)
            citing = rng.integers(0, spec.papers, hi - lo)
            cited = rng.integers(0, spec.papers, hi - lo)
            same = rng.random(hi - lo) < spec.cite_homophily
            cited[same] = _member_of(self._papers_by_class, self._paper_class[citing[same]], rng)
            yield cited, citing

    def relation_edge_chunks(self, relation: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Relation `relation`'s (src, dst) global IDs, block by block (each block its own
        stream, so the edges are the same however they are consumed; reverses: the forward
        pairs swapped)."""
        forward = relation % len(RELATIONS)
        src_type, _, dst_type = RELATIONS[forward]
        offsets = self.schema.offsets
        src_offset = offsets[self.schema.type_id(src_type)]
        dst_offset = offsets[self.schema.type_id(dst_type)]
        for src, dst in (self._citations, self._authorship, self._affiliations)[forward]():
            src, dst = src.astype(np.int64) + src_offset, dst.astype(np.int64) + dst_offset
            yield (src, dst) if relation < len(RELATIONS) else (dst, src)

    def load_relation_edges(self, relation: int) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) global IDs of relation `relation`, whole."""
        chunks = list(self.relation_edge_chunks(relation))
        if not chunks:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate([s for s, _ in chunks]), np.concatenate([d for _, d in chunks])

    def load_labels(self) -> np.ndarray:
        labels = np.full(self.num_nodes, -1, self._class_dtype)
        labels[: self.spec.papers] = self._paper_class
        return labels

    def load_splits(self) -> dict[str, np.ndarray]:
        spec = self.spec
        order = self._rng(5).permutation(spec.papers)
        cuts = np.cumsum([int(spec.papers * f) for f in (spec.train_fraction, spec.valid_fraction,
                                                          spec.test_fraction)])
        return {"train": np.sort(order[: cuts[0]]), "valid": np.sort(order[cuts[0]: cuts[1]]),
                "test": np.sort(order[cuts[1]: cuts[2]])}

    @cached_property
    def _centroids(self) -> np.ndarray:
        return self._rng(6).standard_normal((self.spec.classes, self.spec.feat_dim)).astype(np.float32) / np.sqrt(2)

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        """Paper rows from `start_row`, block by block (each block its own stream)."""
        labels = self._paper_class
        row = start_row
        while row < self.spec.papers:
            block = row // FEATURE_BLOCK
            lo, hi = block * FEATURE_BLOCK, min((block + 1) * FEATURE_BLOCK, self.spec.papers)
            noise = self._rng(7, block).standard_normal((hi - lo, self.spec.feat_dim), dtype=np.float32)
            rows = self._centroids[labels[lo:hi]] + self.spec.noise * noise
            yield rows[row - lo:]
            row = hi


def _blocks(total: int, size: int) -> Iterator[tuple[int, int, int]]:
    """(block, lo, hi) of `total` items in blocks of `size` (none when total <= 0)."""
    for block, lo in enumerate(range(0, max(total, 0), size)):
        yield block, lo, min(lo + size, total)


def _member_of(by_class: tuple[np.ndarray, np.ndarray], wanted: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A uniformly drawn member of each class in `wanted` (a class with no member: any ID)."""
    order, starts = by_class
    lo, hi = starts[wanted], starts[wanted + 1]
    empty = hi == lo
    lo, hi = np.where(empty, 0, lo), np.where(empty, len(order), hi)
    return order[lo + (rng.random(len(wanted)) * (hi - lo)).astype(np.int64)]


def hetero_synthetic_source(preset: str | None = None, **overrides: Any) -> HeteroSyntheticSource:
    """A preset (mag-small, mag) with `overrides` (None values ignored), or a spec from
    `overrides` alone."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if preset is None:
        return HeteroSyntheticSource(HeteroSpec(**given))
    if preset not in PRESETS:
        raise DatasetError(f"hetero synthetic preset {preset!r}: expected one of {sorted(PRESETS)}")
    source = HeteroSyntheticSource(replace(PRESETS[preset], **given), name=preset)
    source.default_dtype = PRESET_DTYPES.get(preset, "float32")
    return source
