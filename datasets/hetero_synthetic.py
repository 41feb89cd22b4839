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

Every part is a function of (seed, what, block): each relation draws from its own stream,
features are generated in blocks of rows, so a preprocess can stream the `mag` preset
(10M papers x 256 float16) without holding its features.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import Any, Iterator

import numpy as np

from gnnssd.storage_format import DatasetError, GraphSchema, NodeType

from .base import relation_edges, reversed_relations

FEATURE_BLOCK = 1 << 16  # rows generated per RNG stream: fixes the output whatever the chunking
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
PRESET_DTYPES = {"mag": "float16", "mag240m": "float16"}


class HeteroSyntheticSource:
    """The TypedSource of a HeteroSpec (see storage_format.source.TypedSource)."""

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
        return {"kind": "hetero-synthetic", **asdict(self.spec)}

    @property
    def num_edges(self) -> int:
        """Edges over every relation, reverses included (before repeats are dropped): what
        preprocess sizes its topology build and disk estimate by."""
        spec = self.spec
        cites = int(spec.papers * spec.cites_per_paper)
        writes = spec.papers + int(spec.papers * max(spec.authors_per_paper - 1, 0))
        affiliations = (int(spec.authors * spec.institutions_per_author) if spec.institutions_per_author < 1
                        else spec.authors + int(spec.authors * (spec.institutions_per_author - 1)))
        return (cites + writes + affiliations) * (2 if spec.add_reverse else 1)

    def _rng(self, *what: int) -> np.random.Generator:
        return np.random.default_rng([self.spec.seed, *what])

    @cached_property
    def _institution_class(self) -> np.ndarray:
        return self._rng(1).integers(0, self.spec.classes, self.spec.institutions)

    @cached_property
    def _affiliations(self) -> tuple[np.ndarray, np.ndarray]:
        """(author, institution) type-local pairs: every author's first institution (which
        sets the author's class), then extra ones so that authors average
        `institutions_per_author`; below 1, only the first authors' first institutions are
        edges (`_forward_edges`), as MAG240M lists an institution for a third of its authors."""
        spec, rng = self.spec, self._rng(2)
        first = rng.integers(0, spec.institutions, spec.authors)
        extra = int(spec.authors * max(spec.institutions_per_author - 1, 0))
        authors = np.concatenate([np.arange(spec.authors), rng.integers(0, spec.authors, extra)])
        return authors, np.concatenate([first, rng.integers(0, spec.institutions, extra)])

    @cached_property
    def _author_class(self) -> np.ndarray:
        return self._institution_class[self._affiliations[1][: self.spec.authors]]

    @cached_property
    def _authorship(self) -> tuple[np.ndarray, np.ndarray]:
        """(author, paper) type-local pairs: each paper's first author (Zipf-skewed: some
        authors are prolific), then co-authors mostly of the first author's class."""
        spec, rng = self.spec, self._rng(3)
        first = (rng.zipf(1.8, spec.papers) - 1 + rng.integers(0, spec.authors, spec.papers)) % spec.authors
        extra = int(spec.papers * max(spec.authors_per_paper - 1, 0))
        papers = rng.integers(0, spec.papers, extra)
        same = rng.random(extra) < spec.coauthor_homophily
        coauthors = rng.integers(0, spec.authors, extra)
        wanted = self._author_class[first[papers[same]]]
        coauthors[same] = _member_of(self._by_class(self._author_class), wanted, rng)
        return np.concatenate([first, coauthors]), np.concatenate([np.arange(spec.papers), papers])

    @cached_property
    def _paper_class(self) -> np.ndarray:
        return self._author_class[self._authorship[0][: self.spec.papers]]

    def _by_class(self, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(IDs sorted by class, start of each class in them; classes with no member
        borrow the whole range)."""
        order = np.argsort(classes, kind="stable")
        starts = np.searchsorted(classes[order], np.arange(self.spec.classes + 1))
        return order, starts

    def _citations(self) -> tuple[np.ndarray, np.ndarray]:
        spec, rng = self.spec, self._rng(4)
        count = int(spec.papers * spec.cites_per_paper)
        citing = rng.integers(0, spec.papers, count)
        cited = rng.integers(0, spec.papers, count)
        same = rng.random(count) < spec.cite_homophily
        cited[same] = _member_of(self._by_class(self._paper_class), self._paper_class[citing[same]], rng)
        return cited, citing  # cited -> citing: the citing paper aggregates what it cites

    def load_relation_edges(self, relation: int) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) global IDs of relation `relation` (reverses: the forward pairs swapped)."""
        return relation_edges(relation, len(RELATIONS), self._forward_edges)

    def _forward_edges(self, forward: int) -> tuple[np.ndarray, np.ndarray]:
        if forward == 0:
            src_local, dst_local = self._citations()  # not kept: the largest relation
        else:
            src_local, dst_local = self._authorship if forward == 1 else self._affiliations
            if forward == 2 and self.spec.institutions_per_author < 1:
                listed = int(self.spec.authors * self.spec.institutions_per_author)
                src_local, dst_local = src_local[:listed], dst_local[:listed]
        src_type, _, dst_type = RELATIONS[forward]
        offsets = self.schema.offsets
        return (src_local.astype(np.int64) + offsets[self.schema.type_id(src_type)],
                dst_local.astype(np.int64) + offsets[self.schema.type_id(dst_type)])

    def load_labels(self) -> np.ndarray:
        labels = np.full(self.num_nodes, -1, np.int64)
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
