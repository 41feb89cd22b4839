"""Fanouts are one value (gnnssd.sampler.Fanouts): parsed once from what a config file or a
loader's `fanouts=` gives, refused with the key, the value and what is expected, and turned
for a store into the sampler's per-layer, per-relation array and DGL's form."""
from __future__ import annotations

import dgl
import numpy as np
import pytest
import torch

from gnnssd.core import ConfigError, SamplerConfig
from gnnssd.core.config import config_from_dict
from gnnssd.sampler import Fanouts, NeighborSampler
from gnnssd.storage_format import GraphSchema

from tests.hetero_graph import RELATIONS, ToyHeteroSource

HOMOGENEOUS = GraphSchema.homogeneous(100)
TYPED = ToyHeteroSource().schema  # relations: cites, writes, written_by, affiliated_with, employs


@pytest.mark.parametrize("given", [[10, 5], (15, 10, 5), [-1, -1], [np.int64(4)], [{"cites": 2, "writes": 0}, 3]])
def test_a_parsed_fanouts_equals_the_list_it_was_written_as(given):
    fanouts = Fanouts.parse(given)
    assert fanouts == list(given) and fanouts.to_list() == list(given) and len(fanouts) == len(given)
    assert Fanouts.parse(fanouts) is fanouts  # parsed once: a Fanouts passes as it is
    assert str(fanouts) == str(list(given)) and all(type(f) in (int, dict) for f in fanouts)


@pytest.mark.parametrize("bad", [[], [0], [-5], [2.5], [True], "10,10", 10, [[2, 3]], [{}], [{"cites": -2}],
                                 [{"cites": 1.5}], [{3: 1}], [10**30, 2], [2**31], None])
def test_bad_fanouts_are_refused_naming_the_key_value_and_what_is_expected(bad):
    with pytest.raises(ValueError, match=r"^eval_fanouts: .*; expected a non-empty list of positive integers "
                                         r"\(one per layer; -1 = all neighbours\) up to 2,147,483,647, or per "
                                         r"layer a dict of them by relation name$"):
        Fanouts.parse(bad, "eval_fanouts")


def test_the_array_on_a_homogeneous_store_is_one_column_of_the_layers_fanouts():
    """What loading.typed.layer_fanouts gave the sampler ([10, -1]), as its one relation."""
    array = Fanouts.parse([10, -1]).array(HOMOGENEOUS)
    assert array.dtype == np.int64 and array.tolist() == [[10], [-1]]
    assert Fanouts.parse([10, -1]).dgl(HOMOGENEOUS) == [10, -1]
    with pytest.raises(ValueError, match=r"fanouts \[\{'_E': 2\}\]: per-relation fanouts need a heterogeneous store"):
        Fanouts.parse([{"_E": 2}]).array(HOMOGENEOUS)


def test_the_array_on_a_typed_store_has_a_fanout_per_relation_in_the_schemas_order():
    """What layer_fanouts / GraphSchema.relation_fanouts gave: one number for every
    relation, a dict by name with the relations it leaves out at 0."""
    fanouts = Fanouts.parse([{"writes": 4, "cites": 2}, 3, -1])
    assert fanouts.array(TYPED).tolist() == [[2, 4, 0, 0, 0], [3] * 5, [-1] * 5]
    assert fanouts.dgl(TYPED) == [dict(zip(RELATIONS, [2, 4, 0, 0, 0])), dict.fromkeys(RELATIONS, 3),
                                  dict.fromkeys(RELATIONS, -1)]
    with pytest.raises(ValueError, match=r"fanouts name relations \['cited'\]; the graph's relations are "
                                         r"\['cites', 'writes'"):
        Fanouts.parse([{"cited": 2}]).array(TYPED)


def test_dgls_sampler_takes_the_dgl_form_and_keeps_each_relation_within_its_fanout():
    source = ToyHeteroSource()
    graph = source.dgl_graph()
    fanouts = Fanouts.parse([{"cites": 2, "writes": 1}])
    seeds = {"paper": torch.arange(0, 300, 3)}
    _, _, (block,) = dgl.dataloading.NeighborSampler(fanouts.dgl(source.schema)).sample_blocks(graph, seeds)
    for rel, most in zip(RELATIONS, fanouts.array(source.schema)[0]):
        if rel[2] == "paper":
            degrees = block.in_degrees(etype=rel)
            full = graph.in_degrees(seeds["paper"], etype=rel)
            assert torch.equal(degrees, torch.clamp(full, max=int(most)))


def test_the_sampler_draws_the_same_from_the_array_as_from_the_list():
    rng = np.random.default_rng(0)
    indptr = np.concatenate([[0], np.cumsum(rng.integers(0, 12, 200))]).astype(np.int64)
    indices = rng.integers(0, 200, indptr[-1]).astype(np.int64)
    seeds = np.arange(0, 200, 7)
    listed = NeighborSampler(indptr, indices, [5, 3]).sample(seeds, seed=1)
    valued = NeighborSampler(indptr, indices, Fanouts.parse([5, 3]).array(HOMOGENEOUS)).sample(seeds, seed=1)
    np.testing.assert_array_equal(listed.edge_src, valued.edge_src)
    np.testing.assert_array_equal(listed.nodes, valued.nodes)
    with pytest.raises(ValueError, match=r"fanouts \[\[5, 3\]\]: layer 0 has 2 fanouts; expected one, or one per "
                                         r"relation \(1\)"):
        NeighborSampler(indptr, indices, [[5, 3]])
    with pytest.raises(ValueError, match=r"fanouts \[5, -3\]: expected -1 \(all neighbours\) or a count >= 0"):
        NeighborSampler(indptr, indices, [5, -3])


def test_the_config_holds_fanouts_as_the_value_and_writes_them_as_their_list():
    config = config_from_dict({"store": "s", "run_dir": "r",
                               "sampler": {"fanouts": [5, {"cites": 2}], "eval_fanouts": [-1, -1]}})
    assert isinstance(config.sampler.fanouts, Fanouts) and isinstance(config.sampler.eval_fanouts, Fanouts)
    assert config.to_dict()["sampler"]["fanouts"] == [5, {"cites": 2}]
    assert config.to_dict()["sampler"]["eval_fanouts"] == [-1, -1]
    assert config_from_dict({"store": "s", "run_dir": "r"}).to_dict()["sampler"]["eval_fanouts"] is None
    assert isinstance(SamplerConfig(fanouts=[3, 3]).fanouts, Fanouts)


def test_fanouts_given_in_code_are_checked_as_a_files_are():
    """A SamplerConfig made in code (as the loaders' eval_fanouts= make one) once kept any
    eval_fanouts unchecked until the sampler met them."""
    with pytest.raises(ConfigError, match=r"^eval_fanouts: \[0, 5\] is invalid; expected a non-empty list"):
        SamplerConfig(eval_fanouts=[0, 5])
