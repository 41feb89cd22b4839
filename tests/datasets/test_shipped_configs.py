"""The configs shipped in datasets/configs: each loads and validates, names in its header a
preprocess command the CLI accepts for a preset that exists, writing the store the config
reads; an ssd budget is below its features' size; the README names each."""
from __future__ import annotations

import shlex

import numpy as np
import pytest

from gnnssd.cli.commands import build_parser
from gnnssd.core.config import load_config
from gnnssd.datasets import PRESETS, hetero_synthetic_source
from gnnssd.datasets.hetero_synthetic import PRESET_DTYPES as HETERO_DTYPES
from gnnssd.datasets.hetero_synthetic import PRESETS as HETERO_PRESETS
from gnnssd.datasets.synthetic import PRESET_DTYPES

from tests.conftest import REPO

CONFIGS = REPO / "datasets" / "configs"
SHIPPED = ["papers", "papers-mini", "mag", "mag240m", "mag240m-half"]


def _preprocess_command(path):
    """The `gnnssd preprocess ...` line of the config's header comment, parsed by the CLI."""
    lines = [line.lstrip("# ").strip() for line in path.read_text().splitlines() if line.startswith("#")]
    commands = [line for line in lines if line.startswith("gnnssd preprocess")]
    assert len(commands) == 1, f"{path.name}: expected one preprocess command in its header"
    return build_parser().parse_args(shlex.split(commands[0])[1:])


def _feature_bytes(args) -> int:
    if args.source == "synthetic":
        spec = PRESETS[args.preset]
        return spec.num_nodes * spec.feat_dim * np.dtype(PRESET_DTYPES.get(args.preset, "float32")).itemsize
    spec = HETERO_PRESETS[args.preset]
    return spec.papers * spec.feat_dim * np.dtype(HETERO_DTYPES.get(args.preset, "float32")).itemsize


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_loads_and_names_the_store_its_preprocess_writes(name):
    path = CONFIGS / f"{name}.yaml"
    config = load_config(path)
    config.validate()
    args = _preprocess_command(path)
    presets = PRESETS if args.source == "synthetic" else HETERO_PRESETS
    assert args.preset in presets
    # the header's --out is relative to the repository root, the config's store to its folder
    assert (REPO / args.out).resolve() == config.store_path().resolve()
    if args.source == "hetero-synthetic":
        assert config.model.name in ("rgcn", "rgat")
    if config.features == "ssd":
        assert config.ssd.memory_budget < _feature_bytes(args)


def test_the_readme_names_every_shipped_config():
    readme = (REPO / "README.md").read_text()
    for name in SHIPPED:
        assert f"datasets/configs/{name}.yaml" in readme, name


def test_the_mag240m_preset_has_mag240m_counts():
    spec = HETERO_PRESETS["mag240m"]
    assert (spec.papers, spec.authors, spec.institutions) == (121_751_666, 122_383_112, 25_721)
    assert int(spec.papers * spec.cites_per_paper) == 1_297_748_926
    assert spec.papers + int(spec.papers * (spec.authors_per_paper - 1)) == 386_022_720
    assert int(spec.authors * spec.institutions_per_author) == 44_592_586
    assert [int(spec.papers * f) for f in (spec.train_fraction, spec.valid_fraction, spec.test_fraction)] == \
        [1_112_392, 138_949, 146_818]


def test_fewer_affiliations_than_authors_lists_the_first_ones():
    """Below one institution per author (MAG240M lists 0.36), the first authors' first
    institutions are the relation's edges; the labels are those of every author's."""
    whole = hetero_synthetic_source("mag-small", papers=2000, authors=1000, institutions=50)
    third = hetero_synthetic_source("mag-small", papers=2000, authors=1000, institutions=50,
                                    institutions_per_author=0.3)
    r = whole.schema.relations.index(("author", "affiliated_with", "institution"))
    src, dst = third.load_relation_edges(r)
    assert len(src) == 300
    np.testing.assert_array_equal(src, whole.load_relation_edges(r)[0][:300])
    np.testing.assert_array_equal(dst, whole.load_relation_edges(r)[1][:300])
    np.testing.assert_array_equal(third.load_labels(), whole.load_labels())


@pytest.mark.parametrize("overrides", [{}, {"institutions_per_author": 0.3}, {"add_reverse": False}])
def test_the_hetero_source_declares_the_edges_it_makes(overrides):
    source = hetero_synthetic_source("mag-small", papers=2000, authors=1000, institutions=50, **overrides)
    assert source.num_edges == sum(len(source.load_relation_edges(r)[0]) for r in range(len(source.schema.relations)))
