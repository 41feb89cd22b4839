"""Config files: YAML and TOML into typed objects, errors that name the key."""
from __future__ import annotations

import pytest

import yaml

from gnnssd.core.config import ConfigError, SamplerConfig, SSDConfig, config_from_dict, load_config

BASE = {"store": "s", "run_dir": "r"}


def test_yaml_and_toml_agree(tmp_path):
    (tmp_path / "c.yaml").write_text("store: s\nrun_dir: r\nmodel:\n  name: gat\n  heads: 2\n"
                                     "sampler:\n  fanouts: [5, -1]\n")
    (tmp_path / "c.toml").write_text('store = "s"\nrun_dir = "r"\n[model]\nname = "gat"\nheads = 2\n'
                                     "[sampler]\nfanouts = [5, -1]\n")
    a, b = load_config(tmp_path / "c.yaml"), load_config(tmp_path / "c.toml")
    assert a.to_dict() == b.to_dict()
    assert a.model.name == "gat" and a.sampler.fanouts == [5, -1] and a.train.epochs == 10
    assert a.store_path() == tmp_path / "s"


@pytest.mark.parametrize("data, message", [
    ({**BASE, "modle": {}}, "modle: unknown key"),
    ({**BASE, "model": {"hiden": 3}}, "model.hiden: unknown key"),
    ({**BASE, "model": {"hidden": 0}}, "model.hidden: 0 is invalid; expected a positive integer"),
    ({**BASE, "model": {"hidden": "big"}}, "model.hidden: 'big' is invalid; expected an integer"),
    ({**BASE, "model": {"name": "gin"}}, "model.name: 'gin' is invalid; expected one of"),
    ({**BASE, "model": {"dropout": 1.5}}, r"model.dropout: 1.5 is invalid; expected in \[0, 1\)"),
    ({**BASE, "train": {"lr": True}}, "train.lr: True is invalid; expected a number"),
    ({**BASE, "train": {"max_batches": 0}}, "train.max_batches: 0 is invalid; expected a positive integer or null"),
    ({**BASE, "sampler": {"fanouts": [10, 0]}}, "sampler.fanouts: .* expected a non-empty list"),
    ({**BASE, "sampler": {"fanouts": [10, "x"]}}, r"sampler.fanouts\[1\]: 'x' is invalid"),
    ({**BASE, "sampler": {"fanouts": [10, 10, 10]}}, "sampler.fanouts: 3 fanouts for model.layers = 2"),
    ({**BASE, "sampler": {"seed_order": "bfs"}}, "sampler.seed_order: 'bfs' is invalid; expected one of"),
    ({**BASE, "sampler": {"method": "labr"}}, r"sampler.method: 'labr' is invalid; expected one of \['uniform', 'labor'\]"),
    ({**BASE, "sampler": {"seed_window": 0}}, "sampler.seed_window: 0 is invalid; expected a positive integer"),
    ({**BASE, "features": "disk"}, "features: 'disk' is invalid"),
    ({"run_dir": "r"}, "store: required key missing"),
    ({**BASE, "model": 3}, "model: expected a mapping"),
    ({**BASE, "ssd": {"memory_budget": "lots"}}, r"ssd.memory_budget: 'lots' is invalid; expected a size above 0"),
    ({**BASE, "ssd": {"memory_budget": "0MiB"}}, r"ssd.memory_budget: '0MiB' is invalid; expected a size above 0"),
    ({**BASE, "ssd": {"memory_budget": True}}, r"ssd.memory_budget: True is invalid; expected a size above 0"),
    ({**BASE, "ssd": {"block_budget": "-1GiB"}}, r"ssd.block_budget: '-1GiB' is invalid; expected auto, or a size"),
    ({**BASE, "ssd": {"block_budget": "automatic"}}, r"ssd.block_budget: 'automatic' is invalid; expected auto"),
])
def test_bad_values_name_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml: no such config file"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("store: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(tmp_path / "bad.yaml")
    (tmp_path / "c.yaml").write_text("store: s\nrun_dir: r\ntrain: {epochs: -1}\n")
    with pytest.raises(ConfigError, match="c.yaml: train.epochs: -1 is invalid"):
        load_config(tmp_path / "c.yaml")


def test_overrides_are_validated(tmp_path):
    (tmp_path / "c.yaml").write_text("store: s\nrun_dir: r\n")
    assert load_config(tmp_path / "c.yaml", {"train.epochs": 3}).train.epochs == 3
    with pytest.raises(ConfigError, match="train.epoch: unknown key"):
        load_config(tmp_path / "c.yaml", {"train.epoch": 3})


def test_default_evaluation_is_all_neighbours_except_on_a_graph_of_more_than_1e7_edges():
    from gnnssd.core.config import FULL_NEIGHBOUR_EVAL_EDGES, SamplerConfig

    default = SamplerConfig(fanouts=[15, 10, 5], batch_size=1024)
    assert default.evaluation(FULL_NEIGHBOUR_EVAL_EDGES) == ([-1, -1, -1], 4096)
    assert default.evaluation(FULL_NEIGHBOUR_EVAL_EDGES + 1) == ([15, 10, 5], 1024)
    chosen = SamplerConfig(fanouts=[15, 10, 5], batch_size=1024, eval_fanouts=[20, 20, 20], eval_batch_size=512)
    assert chosen.evaluation(10**10) == ([20, 20, 20], 512)


def test_sizes_are_held_as_bytes_however_they_were_written(tmp_path):
    """The file's "1.5GiB", a --set override's "8MiB", an int of bytes and SSDConfig made in
    code all give ints; "auto" (any case) stays auto."""
    (tmp_path / "c.yaml").write_text("store: s\nrun_dir: r\nssd: {memory_budget: 1.5GiB, block_budget: ' Auto'}\n")
    config = load_config(tmp_path / "c.yaml")
    assert config.ssd.memory_budget == 3 << 29 and config.ssd.block_budget == "auto"
    overridden = load_config(tmp_path / "c.yaml", {"ssd.block_budget": "8MiB", "ssd.memory_budget": 4096})
    assert overridden.ssd.block_budget == 8 << 20 and overridden.ssd.memory_budget == 4096
    assert SSDConfig().memory_budget == 1 << 30 and SSDConfig().block_budget == "auto"
    assert SSDConfig(memory_budget="16MiB", block_budget="0").block_budget == 0
    assert SSDConfig(memory_budget="16MiB").memory_budget == 16 << 20
    with pytest.raises(ConfigError, match=r"memory_budget: '16 MB/s' is invalid; expected a size above 0"):
        SSDConfig(memory_budget="16 MB/s")


def test_a_saved_config_loads_back_the_same_and_an_old_one_with_size_strings_loads(tmp_path):
    """A run directory's run_config.yaml is the config's to_dict as YAML: sizes as a unit
    that divides them ('24MiB'), else bytes; one saved before sizes were parsed once holds
    the strings the user wrote. Each loads back to the same bytes."""
    (tmp_path / "c.yaml").write_text("store: s\nrun_dir: r\nssd: {memory_budget: 24MiB, block_budget: 8MiB}\n")
    config = load_config(tmp_path / "c.yaml")
    assert (config.ssd.memory_budget, config.to_dict()["ssd"]["memory_budget"]) == (24 << 20, "24MiB")
    (tmp_path / "saved.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    assert load_config(tmp_path / "saved.yaml").to_dict() == config.to_dict()
    odd = load_config(tmp_path / "c.yaml", {"ssd.memory_budget": "3.2GiB"})
    assert odd.to_dict()["ssd"]["memory_budget"] == int(3.2 * 2**30) == odd.ssd.memory_budget
    old = config.to_dict()
    old["ssd"] = {**old["ssd"], "memory_budget": "24MiB", "block_budget": "8MiB"}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    assert load_config(tmp_path / "old.yaml").to_dict() == config.to_dict()


@pytest.mark.parametrize("name, method", [("LABOR", "labor"), ("sample_layer_neighbor", "labor"),
                                          ("LaborSampler", "labor"), ("Sample_Neighbor", "uniform"),
                                          ("NeighborSampler", "uniform"), ("uniform", "uniform")])
def test_sampler_method_takes_the_loaders_graphbolt_and_dgl_names(name, method):
    """sampler.method reads a name as the loaders' method= does (storage_format.sampling_method),
    in a file and in code, and holds the method's own name."""
    assert config_from_dict({**BASE, "sampler": {"method": name}}).sampler.method == method
    assert SamplerConfig(method=name).method == method


def test_an_unknown_sampler_method_lists_the_aliases_too():
    with pytest.raises(ConfigError, match=r"sampler.method: 'layer neighbour' is invalid; expected one of "
                                          r"\['uniform', 'labor'\] \(or GraphBolt's and DGL's names: .*"
                                          r"sample_layer_neighbor"):
        config_from_dict({**BASE, "sampler": {"method": "layer neighbour"}})
    with pytest.raises(ConfigError, match="method: 3 is invalid"):
        SamplerConfig(method=3)
