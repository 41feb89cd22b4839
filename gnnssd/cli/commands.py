"""The `gnnssd` command line: preprocess, train, eval, predict, embed, info, verify, export, demo.

It starts at once: what trains, samples or preprocesses (torch, DGL, numba) is imported by
the commands that use it, so `gnnssd --help`, `info` and `verify` load none of torch and DGL
(tests/cli/test_startup.py)."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from gnnssd.core import ConfigError, setup_logging
from gnnssd.storage_format import FEATURE_DTYPES, StoreError


def _source_from_args(args: argparse.Namespace) -> Any:
    from gnnssd import datasets

    if args.source == "synthetic":
        return datasets.synthetic_source(
            args.preset, num_nodes=args.nodes, feat_dim=args.feat_dim, num_classes=args.classes,
            avg_degree=args.avg_degree, local_fraction=args.local_fraction, local_size=args.local_size,
            seed=args.seed)
    if args.source == "hetero-synthetic":
        return datasets.hetero_synthetic_source(args.preset, papers=args.papers, seed=args.seed,
                                                add_reverse=False if args.no_reverse else None)
    if args.source == "ogb-hetero":
        return datasets.OGBHeteroSource(args.root, split_name=args.split_name, add_reverse=not args.no_reverse)
    if args.source == "mag240m":
        return datasets.MAG240MSource(args.root, add_reverse=not args.no_reverse, test_split=args.test_split)
    if args.source == "planetoid":
        return datasets.PlanetoidSource(args.root, args.name, normalize=not args.raw_features)
    if args.source == "npz":
        return datasets.HeterophilousSource(args.file, split=args.split)
    if args.source == "ogb":
        return datasets.ogb_source(args.root, split_name=args.split_name, symmetric=args.symmetric)
    if args.source == "graphbolt" and args.typed:
        return datasets.GraphBoltHeteroSource(args.root, task=args.task, feature=args.feature,
                                              add_reverse=args.add_reverse)
    if args.source == "graphbolt":
        return datasets.GraphBoltSource(args.root, task=args.task, feature=args.feature,
                                        symmetric=args.symmetric)
    if args.source == "igb":
        return datasets.IGBSource(args.root, size=args.size, classes=args.classes,
                                  symmetric=args.symmetric)
    if args.source == "ogb-link":
        return datasets.OGBLinkSource(args.root, split_name=args.split_name, symmetric=args.symmetric,
                                      eval_negatives=args.eval_negatives, seed=args.split_seed)
    raise AssertionError(args.source)


#: What a preprocess stage's progress counts (rows of features otherwise).
PROGRESS_UNITS = {"sort edges": "edge", "merge buckets": "bucket", "renumber": "pass", "page checksums": "B",
                  "relations": "relation"}


def _progress_bar() -> Callable[[str, int, int], None]:
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def notify(stage: str, done: int, total: int) -> None:
        bar = bars.get(stage)
        if bar is None:
            bar = bars[stage] = tqdm(total=total, desc=stage, unit=PROGRESS_UNITS.get(stage, "row") if total > 1 else "step",
                                     unit_scale=True, leave=False, mininterval=1.0)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return notify


def cmd_preprocess(args: argparse.Namespace) -> None:
    from gnnssd.datasets import FlattenedSource
    from gnnssd.sampler import node_order
    from gnnssd.storage_format import Store, parse_fractions, schema_parts, write_store

    edge_split = parse_fractions(args.edge_split) if args.edge_split else None
    source = _source_from_args(args)
    dtype = args.dtype or getattr(source, "default_dtype", "float32")
    schema_parts(source, flatten=args.flatten, self_loops=args.self_loops)  # refuses what the kind cannot have
    if args.flatten:
        source = FlattenedSource(source)
    if args.self_loops:
        from .self_loops import WithSelfLoops

        source = WithSelfLoops(source)
    out = write_store(args.out, source, order=node_order(args.order), dtype=dtype,
                      progress=_progress_bar(), memory_limit=args.memory_limit,
                      edge_split=edge_split, split_seed=args.split_seed,
                      eval_negatives=args.eval_negatives, edge_split_relation=args.edge_split_relation)
    print(Store.open(out).summary())


def _size_arg(value: str) -> int:
    from gnnssd.core import parse_bytes

    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` pairs as dotted keys and values, each VALUE through the bounded YAML
    loader (plain values: a tag such as !!python/... or an alias bomb fails); a key given
    twice is refused, not the last one silently taken."""
    from gnnssd.storage_format import SmallFileError, parse_yaml, shown

    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {shown(pair)}: expected KEY=VALUE, e.g. train.epochs=5")
        if key in overrides:
            raise ConfigError(f"{key}: --set given twice ({shown(overrides[key], 100)}, then {shown(value, 100)}); "
                              "give each key once")
        try:
            overrides[key] = parse_yaml(value, key)
        except SmallFileError as exc:
            raise ConfigError(f"{exc} (--set value {shown(value, 100)}: a plain YAML value, e.g. 5, 0.01, "
                              "true, [10, 10])") from None
    return overrides


@contextlib.contextmanager
def _trainer(config: str, overrides: dict[str, Any]) -> Iterator[Any]:
    """The trainer of the config's task (gnnssd.training.tasks), closed (threads joined, scratch
    removed, lock released) however the command ends; a second Ctrl-C cannot cut that short."""
    from gnnssd.core import one_interrupt
    from gnnssd.training import Trainer

    with one_interrupt():
        trainer = Trainer(config, overrides)
        try:
            yield trainer
        finally:
            trainer.close()


def cmd_train(args: argparse.Namespace) -> None:
    from gnnssd.core import launched_by_torchrun, load_config
    from gnnssd.training import distributed

    job = (args.config, _parse_overrides(args.set), args.resume)
    if args.nproc < 1:
        raise ConfigError(f"--nproc {args.nproc}: expected a positive number of ranks")
    if args.nproc > 1 and launched_by_torchrun():
        raise ConfigError("--nproc: this process is already a rank of torchrun; give the ranks "
                          "to torchrun (--nproc-per-node) and drop --nproc")
    if args.nproc > 1:
        load_config(*job[:2])  # a bad config fails here, once, not on every rank
        distributed.launch(args.nproc, train_job, *job)
    elif launched_by_torchrun():
        distributed.run_rank(train_job, *job)
    else:
        train_job(*job)


def train_job(config: str, overrides: dict[str, Any], resume: bool) -> None:
    """`gnnssd train` in one process, or in one rank of several (rank 0 prints)."""
    from gnnssd.training import RUN_CONFIG

    with _trainer(config, overrides) as trainer:
        trainer.fit(resume=resume)
    if not trainer.ranks.is_main:
        return
    best = trainer.best
    key, name = trainer.SELECTION, trainer.SELECTION_NAME
    valid = "none (empty split)" if best[f"valid_{key}"] is None else f"{best[f'valid_{key}']:.4f}"
    test = "none (empty split)" if best.get(f"test_{key}") is None else f"{best[f'test_{key}']:.4f}"
    print(f"best valid {name} {valid} at epoch {best['epoch']}, test {name} {test}")
    print(f"run directory: {trainer.run_dir} (metrics.jsonl, checkpoint.pt, {RUN_CONFIG})")


def cmd_eval(args: argparse.Namespace) -> None:
    with _trainer(args.config, _parse_overrides(args.set)) as trainer:
        if args.scores is not None and not hasattr(trainer, "scores"):
            raise ConfigError(f"--scores: task {trainer.config.task} has no edge scores (task link has)")
        trainer.load_best()
        result = {split: trainer.evaluate(split) for split in args.split}
        if args.scores is not None:
            arrays = {}
            for split in args.split:
                arrays[f"{split}_edges"], arrays[f"{split}_pos"], arrays[f"{split}_neg"] = trainer.scores(split)
            _write_new(args.scores, arrays)
    print(json.dumps(result, indent=2))


def _write_new(out: Path, arrays: dict[str, Any]) -> None:
    """`arrays` as the .npz `out`, refusing to overwrite a file gnnssd did not just make."""
    import numpy as np

    from gnnssd.storage_format import atomic_file

    if os.path.lexists(out):
        raise ConfigError(f"--scores: {out} exists; pick a new file")
    with atomic_file(out) as f:
        np.savez(f, **arrays)
    print(f"wrote {', '.join(arrays)} to {out}")


def cmd_predict(args: argparse.Namespace) -> None:
    import numpy as np

    from gnnssd.core import load_config
    from gnnssd.storage_format import atomic_file
    from gnnssd.training import check_classifies, check_output

    config = load_config(args.config, _parse_overrides(args.set))
    check_classifies(config)
    out = Path(args.out)
    check_output(out, config.run_path())
    if args.layerwise:
        from gnnssd.cli.layerwise_commands import predict_layerwise

        predictions = predict_layerwise(config)
    else:
        with _trainer(args.config, _parse_overrides(args.set)) as trainer:
            trainer.load_best()
            predictions = trainer.predict()
    with atomic_file(out) as f:
        np.save(f, predictions)
    print(f"wrote {len(predictions):,} predicted classes, indexed by original node ID, to {out}")


def cmd_embed(args: argparse.Namespace) -> None:
    from gnnssd.core import load_config
    from gnnssd.cli.layerwise_commands import embed
    from gnnssd.training import check_output

    config = load_config(args.config, _parse_overrides(args.set))
    check_output(Path(args.out), config.run_path())
    n, dim = embed(config, Path(args.out), args.layer)
    print(f"wrote {n:,} embeddings of width {dim}, indexed by original node ID, to {args.out}")


def cmd_info(args: argparse.Namespace) -> None:
    from gnnssd.storage_format import Store

    print(Store.open(args.store).summary())


def cmd_verify(args: argparse.Namespace) -> None:
    from gnnssd.storage_format import Store

    checked = Store.open(args.store).verify()
    print(f"{args.store}: all {len(checked)} files match their checksums, and every page of "
          "features.bin its page checksum")


def cmd_report(args: argparse.Namespace) -> None:
    from .report import render_report

    for path in render_report(args.run_dir):
        print(path)


def cmd_calibrate(args: argparse.Namespace) -> None:
    from gnnssd.pipeline import calibrate

    model = calibrate(args.store, seconds=args.seconds)
    print(f"{args.store}: {model}")


def cmd_export(args: argparse.Namespace) -> None:
    from gnnssd.storage_format import Store

    from .export import export_graphbolt

    path = export_graphbolt(Store.open(args.store), Path(args.out))
    print(f"wrote {path} (a DGL GraphBolt OnDiskDataset in the dataset's IDs: "
          f"dgl.graphbolt.OnDiskDataset({str(path.parent)!r}).load())")


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo

    run_demo(Path(args.out))


class _NodeOrderNames:
    """`--order`'s choices, the node orders' names, read from the sampler only when a
    preprocess command checks or prints them (the sampler's import loads numba; argparse
    reads the choices while building the parser unless the argument has a metavar)."""

    def __iter__(self) -> Iterator[str]:
        from gnnssd.sampler import ORDERS

        return iter(ORDERS)

    def __contains__(self, name: object) -> bool:
        return name in list(self)


def _ogb_layout(sources: Any, name: str, help: str) -> argparse.ArgumentParser:
    """The parser of a source reading an OGB raw layout: its root and which split folder."""
    parser = sources.add_parser(name, help=help)
    parser.add_argument("--root", required=True)
    parser.add_argument("--split-name", help="folder under split/ (default: the only one)")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gnnssd", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    pre = commands.add_parser("preprocess", help="turn a dataset into a store")
    sources = pre.add_subparsers(dest="source", required=True)
    synthetic = sources.add_parser("synthetic", help="generated power-law graph with communities")
    synthetic.add_argument("--preset", help="tiny, small, medium, large, papers-mini or papers "
                                            "(datasets/README.md)")
    synthetic.add_argument("--nodes", type=int)
    synthetic.add_argument("--feat-dim", type=int)
    synthetic.add_argument("--classes", type=int)
    synthetic.add_argument("--avg-degree", type=float)
    synthetic.add_argument("--local-fraction", type=float,
                           help="fraction of edges inside small neighbourhoods (default 0: no locality)")
    synthetic.add_argument("--local-size", type=int, help="nodes per neighbourhood (default 1024)")
    synthetic.add_argument("--seed", type=int)
    hetero = sources.add_parser("hetero-synthetic", help="generated MAG240M-like heterogeneous graph "
                                "(papers, authors, institutions)")
    hetero.add_argument("--preset", default="mag-small", help="mag-small, mag, mag240m or mag240m-half (datasets/README.md)")
    hetero.add_argument("--papers", type=int, help="papers (default: the preset's)")
    hetero.add_argument("--seed", type=int)
    hetero.add_argument("--no-reverse", action="store_true",
                        help="no reverse relations (cited_by, written_by, employs)")
    planetoid = sources.add_parser("planetoid", help="Planetoid pickles (ind.NAME.*)")
    planetoid.add_argument("--root", required=True, help="folder holding ind.NAME.* files")
    planetoid.add_argument("--name", required=True, help="cora, citeseer or pubmed")
    planetoid.add_argument("--raw-features", action="store_true", help="skip row normalisation")
    npz = sources.add_parser("npz", help="heterophilous-graphs .npz file")
    npz.add_argument("--file", required=True)
    npz.add_argument("--split", type=int, default=0, help="which of the ten splits")
    ogb = _ogb_layout(sources, "ogb", "OGB node-property raw layout (raw/*.csv.gz or raw/data.npz, split/)")
    ogb.add_argument("--symmetric", action="store_true", help="add reverse edges")
    ogb_hetero = _ogb_layout(sources, "ogb-hetero", "OGB heterogeneous node-property raw layout "
                             "(ogbn-mag: raw/relations/SRC___REL___DST, raw/node-feat/TYPE)")
    ogb_hetero.add_argument("--no-reverse", action="store_true", help="no reverse relation rev_NAME per relation")
    mag240m = sources.add_parser("mag240m", help="OGB-LSC MAG240M layout (meta.pt, split_dict.pt, processed/)")
    mag240m.add_argument("--root", required=True, help="folder holding meta.pt and processed/")
    mag240m.add_argument("--no-reverse", action="store_true", help="no reverse relation rev_NAME per relation")
    mag240m.add_argument("--test-split", help="split_dict.pt key to test on (its labels are hidden in "
                                              "the public release; default: no test split)")
    ogb_link = _ogb_layout(sources, "ogb-link", "OGB link-property raw layout (ogbl-collab, "
                           "ogbl-citation2: raw/, split/NAME/{train,valid,test}.pt)")
    ogb_link.add_argument("--symmetric", action="store_true", help="add reverse edges")
    graphbolt = sources.add_parser("graphbolt", help="DGL GraphBolt OnDiskDataset (metadata.yaml), "
                                   "homogeneous")
    graphbolt.add_argument("--root", required=True, help="folder holding metadata.yaml")
    graphbolt.add_argument("--task", help="task name in metadata.yaml (default: the only one)")
    graphbolt.add_argument("--feature", default="feat", help="node feature name (default feat)")
    graphbolt.add_argument("--symmetric", action="store_true", help="add reverse edges")
    graphbolt.add_argument("--typed", action="store_true",
                           help="a heterogeneous dataset (typed nodes and edges): one relation per edge type")
    graphbolt.add_argument("--add-reverse", action="store_true",
                           help="with --typed: a reverse relation rev_NAME per relation")
    igb = sources.add_parser("igb", help="IGB260M homogeneous layout (paper, paper__cites__paper)")
    igb.add_argument("--root", required=True, help="folder holding SIZE/processed/")
    igb.add_argument("--size", default="small", choices=["experimental", "small", "medium", "large", "full"])
    igb.add_argument("--classes", default="19", choices=["19", "2K"])
    igb.add_argument("--symmetric", action="store_true", help="add reverse edges")
    for sub in (synthetic, hetero, planetoid, npz, ogb, ogb_hetero, mag240m, ogb_link, graphbolt, igb):
        sub.add_argument("--out", required=True, help="store directory to write")
        sub.add_argument("--order", choices=_NodeOrderNames(), metavar="ORDER", default="original",
                         help="node order on disk: %(choices)s (default %(default)s)")
        sub.add_argument("--dtype", choices=FEATURE_DTYPES,
                         help="feature dtype on disk (default: the synthetic preset's, else float32)")
        sub.add_argument("--memory-limit", type=_size_arg, metavar="SIZE",
                         help="bound on the topology build, e.g. 2GiB; a larger edge list is "
                              "sorted out of core (default: half the available memory)")
        sub.add_argument("--edge-split", metavar="TRAIN,VALID,TEST",
                         help="hold out valid/test edges for link prediction, e.g. 0.85,0.05,0.10")
        sub.add_argument("--edge-split-relation", metavar="RELATION",
                         help="the relation a heterogeneous graph's --edge-split holds out edges of, "
                              "e.g. cites (its reverse's twins are held out too)")
        sub.add_argument("--split-seed", type=int, default=0, help="seed of the edge split and negatives")
        sub.add_argument("--eval-negatives", type=int, default=1000,
                         help="fixed negatives stored per valid/test edge")
        sub.add_argument("--flatten", action="store_true",
                         help="a heterogeneous dataset as one node type and one relation (featureless "
                              "types get zero rows): the baseline that ignores relations")
        sub.add_argument("--self-loops", action="store_true",
                         help="add an edge v -> v to every node (as dgl.add_self_loop; a GAT's habit)")
        sub.set_defaults(func=cmd_preprocess)

    for name, func, text in (("train", cmd_train, "train a model"),
                             ("eval", cmd_eval, "evaluate the best checkpoint"),
                             ("predict", cmd_predict, "predict every node's class"),
                             ("embed", cmd_embed, "layer-wise inference: every node's embedding")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--config", required=True, help="YAML or TOML config file")
        sub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override a config key, e.g. train.epochs=5")
        sub.set_defaults(func=func)
        if name == "train":
            sub.add_argument("--resume", action="store_true", help="continue from the checkpoint")
            sub.add_argument("--nproc", type=int, default=1,
                             help="data-parallel ranks on this machine (torch.distributed)")
        if name == "eval":
            sub.add_argument("--split", nargs="+", default=["valid", "test"])
            sub.add_argument("--scores", type=Path, metavar="OUT.npz",
                             help="task link: also write each split's edges and the scores of them and of "
                                  "their negatives ({split}_edges, {split}_pos, {split}_neg) for another evaluator")
        if name == "predict":
            sub.add_argument("--out", required=True, help=".npy file for the predictions")
            sub.add_argument("--layerwise", action="store_true",
                             help="layer-wise full-neighbour inference (out of core with features: ssd)")
        if name == "embed":
            sub.add_argument("--out", required=True, help=".npy file for the embeddings")
            sub.add_argument("--layer", type=int, help="output of layer K (1-based; default: the last)")

    for name, func, text in (("info", cmd_info, "summarise a store"),
                             ("verify", cmd_verify, "check every file of a store")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("store")
        sub.set_defaults(func=func)

    report = commands.add_parser("report", help="plot a run's metrics as PNG files")
    report.add_argument("run_dir")
    report.set_defaults(func=cmd_report)

    calibrate = commands.add_parser("calibrate", help="measure the drive under a store "
                                    "(request cost, read/write bandwidth) for the read planner")
    calibrate.add_argument("store")
    calibrate.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    calibrate.set_defaults(func=cmd_calibrate)

    export = commands.add_parser("export", help="write a store in another system's layout")
    formats = export.add_subparsers(dest="format", required=True)
    graphbolt_out = formats.add_parser("graphbolt", help="DGL GraphBolt OnDiskDataset (metadata.yaml + .npy), "
                                       "in the dataset's own IDs")
    graphbolt_out.add_argument("store")
    graphbolt_out.add_argument("out", help="a new directory")
    graphbolt_out.set_defaults(func=cmd_export)

    demo = commands.add_parser("demo", help="generate, preprocess, train and evaluate a tiny graph")
    demo.add_argument("--out", default="demo_out")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    try:
        args.func(args)
    except (ValueError, StoreError, RuntimeError, OSError) as exc:  # ConfigError, DatasetError too
        print(f"gnnssd: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gnnssd: interrupted; the last checkpoint and any previous store are intact",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
