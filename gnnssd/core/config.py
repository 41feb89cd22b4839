"""The training configuration: one YAML or TOML file, validated into typed objects.

Every key is checked against the dataclasses below: an unknown key, a missing
required key or a value of the wrong type or range is a ConfigError naming the key
(as a dotted path) and what was expected.
"""
from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tomllib

from gnnssd.sampler import FANOUTS_EXPECTED, MAX_COUNT, Fanouts
from gnnssd.storage_format import (METHODS_EXPECTED, SmallFileError, parse_yaml, read_small_text, sampling_method,
                                   shown)

from .budget import AUTO, exact_size, parse_bytes


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message names the key."""


CONFIG_BYTES = 1 << 20  # a config file: a few KiB of keys


def _shown(value: Any) -> str:
    """A value quoted in an error message, cut short (storage_format.shown)."""
    return shown(value)


def is_count(value: Any, low: int = 0, high: int = MAX_COUNT) -> bool:
    """Whether `value` is an integer (Python's or NumPy's, not a bool) in [low, high]."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and low <= value <= high


def check_count(value: Any, key: str, low: int = 0, high: int = MAX_COUNT) -> int:
    """`value` as an int when `is_count`; else a ValueError naming `key`, the value and
    the range: the one check of epochs and counts a caller passes (set_epoch, first_epoch,
    reuse_epochs), so that -1, 1.5, "3", None or 2**70 fail here, not deep in DGL or numba."""
    if not is_count(value, low, high):
        raise ValueError(f"{key}: {shown(value)}; expected an integer from {low:,} to {high:,}")
    return int(value)


def is_count_from(low: int) -> typing.Callable[[Any], bool]:
    """`is_count` from `low` to MAX_COUNT, as a config field's check."""
    return lambda value: is_count(value, low)


def _positive(value: Any) -> bool:
    return value > 0


def _finite_positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def _finite_non_negative(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def _check(check: typing.Callable[[Any], bool], expected: str) -> dict[str, Any]:
    return {"check": check, "expected": expected}


@dataclass
class ModelConfig:
    #: "mlp": linear layers on each node's own features (no message passing): the floor
    #: a GNN must beat.
    #: "rgcn" / "rgat": relational GNNs, for heterogeneous stores (gnnssd.models.hetero).
    name: Literal["sage", "gcn", "gat", "mlp", "rgcn", "rgat"] = "sage"
    hidden: int = field(default=256, metadata=_check(_positive, "a positive integer"))
    layers: int = field(default=2, metadata=_check(_positive, "a positive integer"))
    dropout: float = field(default=0.5, metadata=_check(lambda v: 0 <= v < 1, "in [0, 1)"))
    heads: int = field(default=4, metadata=_check(_positive, "a positive integer"))
    #: Run the layers as UDF-style message passing compiled by gnnssd's MP-DFG compiler
    #: (same parameters and results as the dgl.nn layers); false: the dgl.nn layers.
    compile: bool = True
    #: Input of node types without features in rgcn/rgat: "embedding" (a learnable row per
    #: node, xavier-initialised, as DGL's R-GCN example has them: on the mag-small preset
    #: 14 points more accurate than zeros; but for MAG240M's 122M authors at 768 float32
    #: that is 350 GiB before Adam's state, refused naming this key) or "zeros" (their
    #: neighbours inform them; nothing node-sized is held).
    featureless: Literal["zeros", "embedding"] = "embedding"


#: A fanouts key: the file's list checked item by item as written (a wrong item named by its
#: index), then parsed once into the one fanouts value (gnnssd.sampler.Fanouts), which
#: checks the counts; a config file shows it as its list again.
FANOUTS = {"file": list[int | dict[str, int]], "parse": Fanouts.parse, "show": Fanouts.to_list,
           "expected": FANOUTS_EXPECTED}


#: Above this many edges the default evaluation samples like training (SamplerConfig.evaluation):
#: on papers-mini (2.2M nodes, 47M edges) one all-neighbour mini-batch of 2,220 validation seeds
#: reached 97% of the nodes in three hops, and the process was killed at 16 GiB.
FULL_NEIGHBOUR_EVAL_EDGES = 10_000_000


@dataclass
class SamplerConfig:
    fanouts: Fanouts = field(default_factory=lambda: Fanouts((10, 10)), metadata=FANOUTS)
    batch_size: int = field(default=1024, metadata=_check(_positive, "a positive integer"))
    #: Fanouts for evaluation and prediction; default: all neighbours, or on a graph of more
    #: than FULL_NEIGHBOUR_EVAL_EDGES edges the training fanouts (see `evaluation`).
    eval_fanouts: Fanouts | None = field(default=None, metadata=FANOUTS)
    eval_batch_size: int = field(default=4096, metadata=_check(_positive, "a positive integer"))
    #: Training seed order per epoch: "random" (uniform shuffle) or "proximity" (runs of
    #: `seed_window` consecutive store IDs, visited in random order, shuffled inside; with a
    #: locality node order a mega-batch's seeds are graph neighbours; see seed_batches).
    seed_order: Literal["random", "proximity"] = "random"
    seed_window: int = field(default=16384, metadata=_check(_positive, "a positive integer"))
    #: Epochs trained on each epoch's samples (after DiskGNN): epochs 1..K share the seed
    #: order and neighbour draws of epoch 1, epochs K+1..2K those of epoch K+1, ... With
    #: features: ssd the group's later epochs replay the first one's plans and compact
    #: blocks kept on disk (no sampling, planning or repacking). Node tasks only.
    reuse_epochs: int = field(default=1, metadata=_check(is_count_from(1), f"an integer from 1 to {MAX_COUNT:,}"))
    #: Neighbour sampling: "uniform" (min(fanout, degree) in-neighbours per node, without
    #: replacement) or "labor" (layer-neighbour sampling, as DGL's LaborSampler: fanout
    #: in-neighbours per node on average, sources shared across a layer's nodes, so fewer
    #: distinct input rows per mini-batch); GraphBolt's and DGL's names of them too, any
    #: case (storage_format.sampling_method: the loaders' `method=` parser), held as one of the two.
    method: Literal["uniform", "labor"] = field(default="uniform",
                                                metadata={"parse": sampling_method, "expected": METHODS_EXPECTED})

    def __post_init__(self) -> None:
        _parse_fields(self)

    def evaluation(self, num_edges: int) -> tuple[Fanouts, int]:
        """(fanouts, batch size) of evaluation on a graph of `num_edges` edges: the
        configured ones; by default all neighbours, except on a graph larger than
        FULL_NEIGHBOUR_EVAL_EDGES, where a power-law graph's all-neighbour mini-batch would
        gather most of the graph: there the training fanouts and (at most) batch size, as
        DGL's papers100M examples evaluate (exact all-neighbour inference: `predict --layerwise`)."""
        if self.eval_fanouts is not None:
            return self.eval_fanouts, self.eval_batch_size
        if num_edges > FULL_NEIGHBOUR_EVAL_EDGES:
            return self.fanouts, min(self.eval_batch_size, self.batch_size)
        return Fanouts.all_neighbours(len(self.fanouts)), self.eval_batch_size


def _bytes_or_auto(value: Any) -> int | str:
    """"auto" (any case, spaces around it) as AUTO, anything else as parse_bytes reads it."""
    return AUTO if isinstance(value, str) and value.strip().lower() == AUTO else parse_bytes(value)


SIZES = "bytes, or a number with B/KiB/MiB/GiB/TiB or KB/MB/GB/TB"


def _shown_size(value: int | str) -> int | str:
    """A size as a file would hold it ('3GiB' where a unit divides it; "auto" as it is)."""
    return exact_size(value) if isinstance(value, int) else value


#: A size field: the file says "1.25GiB" or 1342177280, the config holds the int; `parse`
#: runs once, where the value is read (_build, or __post_init__ for a dataclass made in code).
POSITIVE_SIZE = {"parse": parse_bytes, "show": _shown_size, **_check(_positive, f"a size above 0: {SIZES}")}
NON_NEGATIVE_SIZE = {"parse": parse_bytes, "show": _shown_size, "expected": f"0 or a size: {SIZES}"}
SIZE_OR_AUTO = {"parse": _bytes_or_auto, "show": _shown_size, "expected": f"auto, or a size: {SIZES}"}


def _parse_fields(obj: Any) -> None:
    """Parse the parsed fields (sizes, fanouts, the sampling method) of a dataclass made in
    code (e.g. SSDConfig(memory_budget="1GiB"), SamplerConfig(fanouts=[15, 10], method="LABOR")),
    or refuse them naming the field: a value is held in its one parsed form wherever it came from."""
    for f in dataclasses.fields(obj):
        if "parse" in f.metadata:
            setattr(obj, f.name, _parsed(f, getattr(obj, f.name), f.name))


def _parsed(f: dataclasses.Field, value: Any, key: str) -> Any:
    if value is None and f.default is None:  # an optional field left unset
        return None
    try:
        parsed = f.metadata["parse"](value)
    except ValueError:
        raise ConfigError(f"{key}: {_shown(value)} is invalid; expected {f.metadata['expected']}") from None
    if "check" in f.metadata and not f.metadata["check"](parsed):
        raise ConfigError(f"{key}: {_shown(value)} is invalid; expected {f.metadata['expected']}")
    return parsed


@dataclass
class SSDConfig:
    """`features: ssd`: what the out-of-core pipeline may use."""

    #: Hot cache + mega-batch buffers + queues + the x arrays handed to the consumer
    #: together, in bytes; the file may say "1.25GiB".
    memory_budget: int = field(default=1 << 30, metadata=POSITIVE_SIZE)
    #: Mini-batches per mega-batch (M); a group whose rows overflow a buffer is split.
    mega_batch: int = field(default=16, metadata=_check(_positive, "a positive integer"))
    #: Share of the budget (after queues) for the hot cache; the rest is two buffers.
    hot_fraction: float = field(default=0.4, metadata=_check(lambda v: 0 <= v < 1, "in [0, 1)"))
    #: Disk space for compact blocks repacked ahead of training; 0 = extents only; "auto":
    #: 0 when the features are at most twice memory_budget, else 3x the features' size
    #: with packers (1x with packers 0), capped at a quarter of the free space where the
    #: blocks go (0 if that is below memory_budget). The chosen value is logged
    #: (gnnssd.core.budget.auto_block_budget).
    block_budget: int | Literal["auto"] = field(default=AUTO, metadata=SIZE_OR_AUTO)
    queue_depth: int = field(default=128, metadata=_check(_positive, "a positive integer"))
    io_backend: Literal["auto", "io_uring", "threads"] = "auto"
    #: Check every page read from features.bin against the store's CRC32C page checksums.
    verify_checksums: bool = True
    #: Threads of every numba stage of the loader (sampling, planning, gather), at most the
    #: process's NUMBA_NUM_THREADS (set that in the environment to go above numba's
    #: default, the core count); 0: all of them.
    threads: int = field(default=0, metadata=_check(lambda v: v >= 0, "0 (all) or a positive integer"))
    #: Packer processes that plan windows of mini-batches ahead of training, and repack
    #: them where compact blocks are written (gnnssd.pipeline.packers), when an epoch's
    #: samples are not kept for reuse; started by the first stream of more than a few
    #: mini-batches and kept until the loader closes: "auto" is the cores left beside the
    #: trainer (at least 1); 0 plans and repacks in the trainer's own threads.
    packers: int | Literal["auto"] = field(default=AUTO, metadata=_check(
        lambda v: v == AUTO or 0 <= v <= 256,
        "auto, or an integer from 0 to 256"))
    #: float16 stores: x stays float16 (half the bytes to gather, pin and copy) and the
    #: consumer widens it; set by a GPU consumer that widens on the device. Other dtypes:
    #: no effect.
    widen_on_device: bool = False
    #: `features: device`: the share of the device's memory kept free for training (the
    #: store's arrays, or `device_budget`, must fit in its free memory less this share of
    #: its total).
    device_reserve: float = field(default=0.2, metadata=_check(lambda v: 0 <= v < 1, "in [0, 1)"))
    #: `features: ssd`: bytes of the hottest feature rows kept on the loader's device beside
    #: the host hot cache (the same ranking: the device holds the hottest rows, the host
    #: cache the next ones); 0: none. Not part of memory_budget (on `device: cpu` it is a
    #: CPU tensor beside it); the file may say "2GiB".
    device_budget: int = field(default=0, metadata=NON_NEGATIVE_SIZE)
    #: `features: ssd`: where x is assembled. "device": on the loader's device, which reads
    #: the cached rows itself (a GPU over the pinned host cache in place) while only the
    #: cold rows cross; "host": gathered on the host and copied whole; "auto": device on a
    #: GPU, host on the CPU.
    gather: Literal["auto", "host", "device"] = "auto"

    def __post_init__(self) -> None:
        _parse_fields(self)


@dataclass
class LinkConfig:
    """`task: link`: train on the store's link split (sampler.batch_size positive edges a batch)."""

    #: Negative destinations drawn per positive edge in training.
    negatives: int = field(default=1, metadata=_check(_positive, "a positive integer"))
    #: Fixed negatives per valid/test edge ranked against it (at most the store's).
    eval_negatives: int = field(default=1000, metadata=_check(_positive, "a positive integer"))
    #: Edge score: dot product of the endpoint embeddings, or an MLP on their product.
    decoder: Literal["dot", "mlp"] = "dot"


@dataclass
class TrainConfig:
    epochs: int = field(default=10, metadata=_check(is_count_from(1), f"an integer from 1 to {MAX_COUNT:,}"))
    lr: float = field(default=0.003, metadata=_check(_finite_positive, "a finite positive number"))
    weight_decay: float = field(default=0.0, metadata=_check(_finite_non_negative,
                                                             "a finite non-negative number"))
    eval_every: int = field(default=1, metadata=_check(_positive, "a positive integer"))
    #: At most this many mini-batches an epoch (on each rank), the first of the epoch's
    #: shuffled order: a measured part of an epoch of a graph too large for whole ones.
    max_batches: int | None = field(default=None, metadata=_check(_positive, "a positive integer or null"))
    progress: bool = True


@dataclass
class Config:
    store: str
    run_dir: str
    #: memory: rows in RAM; ssd: streamed from the SSD; device: the whole store on the
    #: training device, sampled and gathered there (gnnssd.loading.backends.device).
    features: Literal["memory", "ssd", "device"] = "memory"
    seed: int = 0
    #: Bit-identical reruns: one CPU thread for torch and DGL kernels, whose parallel
    #: reductions otherwise sum in a varying order (runs then agree only to rounding).
    deterministic: bool = False
    device: Literal["auto", "cpu", "cuda"] = "auto"
    #: "node": node classification; "link": link prediction on the store's edge split.
    task: Literal["node", "link"] = "node"
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    ssd: SSDConfig = field(default_factory=SSDConfig)
    link: LinkConfig = field(default_factory=LinkConfig)
    #: Where the file was read from: relative paths inside it are relative to its folder.
    base_dir: Path = field(default=Path("."), metadata={"internal": True})

    def store_path(self) -> Path:
        return self.base_dir / self.store

    def run_path(self) -> Path:
        return self.base_dir / self.run_dir

    def validate(self) -> None:
        store, run = self.store_path().resolve(), self.run_path().resolve()
        if run == store or store in run.parents:
            raise ConfigError(f"run_dir: {self.run_dir} is {'the store' if run == store else 'inside the store'} "
                              f"{self.store}; a preprocess --out of that store would replace it: "
                              "keep runs outside the store")
        n_layers = self.model.layers
        if self.model.name in ("gat", "rgat") and n_layers > 1 and self.model.heads > self.model.hidden:
            raise ConfigError(f"model.heads: {self.model.heads} is more than model.hidden = "
                              f"{self.model.hidden}; GAT splits model.hidden across its heads "
                              f"(expected 1..{self.model.hidden})")
        if len(self.sampler.fanouts) != n_layers:
            raise ConfigError(f"sampler.fanouts: {len(self.sampler.fanouts)} fanouts for "
                              f"model.layers = {n_layers}; give one fanout per layer")
        if self.sampler.eval_fanouts is not None and len(self.sampler.eval_fanouts) != n_layers:
            raise ConfigError(f"sampler.eval_fanouts: {len(self.sampler.eval_fanouts)} fanouts "
                              f"for model.layers = {n_layers}")
        if self.task == "link" and self.sampler.reuse_epochs != 1:
            raise ConfigError(f"sampler.reuse_epochs: {self.sampler.reuse_epochs} with task: link; link "
                              f"prediction draws new edge batches and negatives every epoch (expected 1)")

    def to_dict(self) -> dict[str, Any]:
        """The config as a file would hold it (sizes as '3GiB' where a unit divides them)."""
        data = dataclasses.asdict(self)
        data.pop("base_dir")
        _show_parsed(self, data)
        return data


def _show_parsed(obj: Any, data: dict[str, Any]) -> None:
    """The parsed fields of `obj` in `data` as a file writes them (sizes as '3GiB' where a
    unit divides them, fanouts as their list)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if "show" in f.metadata:
            data[f.name] = None if value is None else f.metadata["show"](value)
        elif dataclasses.is_dataclass(value):
            _show_parsed(value, data[f.name])


def as_config(config: Config | str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """`config` itself, or the Config of the file it names (with `overrides`)."""
    return config if isinstance(config, Config) else load_config(config, overrides)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Read a .yaml/.yml/.toml file into a Config; `overrides` are dotted keys."""
    path = Path(path)
    if not os.path.lexists(path):
        raise ConfigError(f"{path}: no such config file")
    try:
        text = read_small_text(path, CONFIG_BYTES, "config file")
    except SmallFileError as exc:
        raise ConfigError(f"{exc}; save the config as a UTF-8 file") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = parse_yaml(text, str(path)) or {}
        else:
            raise ConfigError(f"{path}: unknown config format {path.suffix!r}; use .yaml or .toml")
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except SmallFileError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    try:
        config = config_from_dict(data, base_dir=path.parent)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return config


def config_from_dict(data: dict[str, Any], base_dir: Path = Path(".")) -> Config:
    config = _build(Config, data, "")
    config.base_dir = base_dir
    config.validate()
    return config


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for depth, key in enumerate(parents, 1):
        data = data.setdefault(key, {})
        if not isinstance(data, dict):
            prefix = ".".join(parents[:depth])
            raise ConfigError(f"{dotted}: {prefix} is {_shown(data)}, not a section with keys")
    data[last] = value


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {_shown(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}: unknown key; expected one of {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, f in fields.items():
        key = prefix + name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{key}: required key missing")
            continue
        value = (_parsed(f, _file_shaped(f, data[name], key), key) if "parse" in f.metadata
                 else _convert(hints[name], data[name], key))
        if "check" in f.metadata and value is not None and not f.metadata["check"](value):
            raise ConfigError(f"{key}: {_shown(data[name])} is invalid; expected {f.metadata['expected']}")
        values[name] = value
    return cls(**values)


def _file_shaped(f: dataclasses.Field, value: Any, key: str) -> Any:
    """A parsed field's value as the file gave it, checked against the file's shape first
    when the field has one (fanouts: each wrong item named by its key, `sampler.fanouts[1]`)."""
    return value if value is None or "file" not in f.metadata else _convert(f.metadata["file"], value, key)


def _convert(hint: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key + ".")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options[:-1]:
            try:
                return _convert(option, value, key)
            except ConfigError:
                pass
        return _convert(options[-1], value, key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {_shown(value)} is invalid; expected one of {list(args)}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: {_shown(value)} is invalid; expected a mapping")
        return {_convert(args[0], k, key): _convert(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: {_shown(value)} is invalid; expected a list")
        return [_convert(args[0], item, f"{key}[{i}]") for i, item in enumerate(value)]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: {_shown(value)} is invalid; expected true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: {_shown(value)} is invalid; expected an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: {_shown(value)} is invalid; expected a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: {_shown(value)} is invalid; expected a string")
        return value
    raise TypeError(f"config field {key} has unsupported type {hint}")
