"""Benchmark the MP-DFG compiler: UDF vs compiled vs dgl.nn, with per-pass ablation.

For GraphSAGE (mean), GCN and GAT, on a sampled block and on a whole power-law graph
(>= 1M edges; Chung-Lu generator below), it times forward+backward (median of
repeats after warm-up; the variants run round-robin in one process so that load from
other work on the machine hits them alike) of:
  udf       the UDF layer run by DGL (degree-bucketed update_all)
  lower     compiled, mailbox -> segment ops only        (level="lower")
  reorder   + concat split, node-wise hoisting, CSE      (level="reorder")
  compiled  + g-SpMM/g-SDDMM fusion, lowered to dgl.ops  (level="fuse", kernels=False)
  fused     + the numba attention kernel (GAT only)      (level="fuse", kernels=True)
  dgl_nn    the matching dgl.nn layer
Peak memory is measured in a fresh subprocess per variant: the peak resident set size
(VmHWM, reset through /proc/self/clear_refs after a warm-up step) during one
forward+backward minus the resident size before it: it sees every allocation torch, DGL and numba make
(glibc's mmap threshold is fixed so freed tensors leave the resident set).

  python scripts/bench_compiler.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

MODELS = ("sage", "gcn", "gat")
GRAPHS = ("blocks", "whole")
VARIANTS = ("udf", "lower", "reorder", "compiled", "fused", "dgl_nn")
SIZES = {  # nodes, average degree, block seeds, fanout, feature dim
    "full": dict(nodes=100_000, degree=12, seeds=8192, fanout=20, dim=64),
    "quick": dict(nodes=20_000, degree=10, seeds=1024, fanout=10, dim=32),
}


def chung_lu(nodes: int, degree: float, gamma: float = 2.2, seed: int = 0):
    """Edges of a Chung-Lu graph: endpoints drawn with power-law expected degrees."""
    rng = np.random.default_rng(seed)
    weight = (np.arange(nodes) + 1.0) ** (-1.0 / (gamma - 1.0))
    p = weight / weight.sum()
    edges = int(nodes * degree)
    src = rng.choice(nodes, size=edges, p=p)
    dst = rng.choice(nodes, size=edges, p=rng.permutation(p))
    return src, dst


def _peak_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _setup(model: str, graph_kind: str, size: dict, threads: int):
    """The graph (or block), an input and a factory for each variant's layer."""
    import dgl
    import numba
    import torch
    from dgl.nn import GATConv, GraphConv, SAGEConv

    import gnnssd  # noqa: F401
    from gnnssd.compiler import GATConvUDF, GraphConvUDF, SAGEConvUDF, compile

    torch.set_num_threads(threads)
    numba.set_num_threads(threads)
    torch.manual_seed(0)
    dgl.seed(0)
    src, dst = chung_lu(size["nodes"], size["degree"])
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=size["nodes"])
    if graph_kind == "blocks":
        seeds = torch.randperm(size["nodes"])[: size["seeds"]]
        g = dgl.to_block(dgl.sampling.sample_neighbors(g, seeds, size["fanout"]), seeds)
    g.create_formats_()
    dim = size["dim"]
    conv = {"sage": lambda: SAGEConv(dim, dim, "mean"),
            "gcn": lambda: GraphConv(dim, dim, norm="both", allow_zero_in_degree=True),
            "gat": lambda: GATConv(dim, dim // 4, num_heads=4, allow_zero_in_degree=True),
            }[model]()
    udf = {"sage": SAGEConvUDF, "gcn": GraphConvUDF, "gat": GATConvUDF}[model].from_dgl(conv)
    factories = {"udf": lambda: udf, "dgl_nn": lambda: conv,
                 "lower": lambda: compile(udf, level="lower", kernels=False),
                 "reorder": lambda: compile(udf, level="reorder", kernels=False),
                 "compiled": lambda: compile(udf, level="fuse", kernels=False),
                 "fused": lambda: compile(udf, level="fuse", kernels=True)}
    feat = torch.randn(g.num_src_nodes(), dim, requires_grad=True)
    return g, feat, factories


def _step(layer, g, feat) -> float:
    start = time.perf_counter()
    layer(g, feat).sum().backward()
    return (time.perf_counter() - start) * 1e3


def time_variants(model: str, graph_kind: str, variants: list[str], size: dict, reps: int,
                  udf_reps: int, threads: int) -> dict:
    """Median ms per variant; variants run round-robin so machine load hits all alike."""
    g, feat, factories = _setup(model, graph_kind, size, threads)
    layers = {v: factories[v]() for v in variants}
    for layer in layers.values():
        _step(layer, g, feat)  # warm-up: builds programs, JIT-compiles numba kernels
    times: dict = {v: [] for v in variants}
    for round_ in range(reps):
        for v, layer in layers.items():
            if v != "udf" or round_ < udf_reps:
                times[v].append(_step(layer, g, feat))
    return {"ms": {v: statistics.median(t) for v, t in times.items()},
            "edges": g.num_edges()}


def peak_memory(model: str, graph_kind: str, variant: str, size: dict, threads: int) -> dict:
    """Peak RSS growth of one forward+backward, after a warm-up, in this process."""
    g, feat, factories = _setup(model, graph_kind, size, threads)
    layer = factories[variant]()
    _step(layer, g, feat)
    baseline = _status_bytes("VmRSS")
    if not _peak_reset():
        return {"peak_bytes": None}
    _step(layer, g, feat)
    return {"peak_bytes": _status_bytes("VmHWM") - baseline}


def _subprocess(args: list[str]) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    # A fixed mmap threshold makes glibc return every large tensor to the OS when it is
    # freed (its default threshold adapts upwards and keeps freed blocks resident).
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def format_table(rows: list[dict]) -> str:
    cols = ["udf", "lower", "reorder", "compiled", "fused", "dgl_nn"]
    head = f"{'model':<6}{'graph':<8}{'edges':>9} " + "".join(f"{c + '_ms':>12}" for c in cols) \
        + f"{'udf/fused|comp':>15}{'comp/dgl':>10}{'fused/dgl':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ms = {c: r.get(f"{c}_ms") for c in cols}
        best = ms["fused"] or ms["compiled"]
        cells = "".join(f"{v:>12.2f}" if v is not None else f"{'-':>12}" for v in ms.values())
        ratio = lambda a, b: f"{a / b:>10.2f}" if a and b else f"{'-':>10}"  # noqa: E731
        lines.append(f"{r['model']:<6}{r['graph']:<8}{r['edges']:>9} {cells}"
                     f"{ms['udf'] / best:>15.1f}{ratio(ms['compiled'], ms['dgl_nn'])}"
                     f"{ratio(ms['fused'], ms['dgl_nn'])}")
    lines.append("")
    lines.append("peak RSS growth during one forward+backward after warm-up (MiB):")
    for r in rows:
        peaks = "  ".join(f"{k}={v / 2**20:.1f}" for k, v in r["peak_bytes"].items()
                          if v is not None)
        lines.append(f"  {r['model']:<5} {r['graph']:<7} {peaks}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="reduced sizes (a few minutes)")
    parser.add_argument("--json", help="write {'rows': [...]} to this path")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--graphs", default=",".join(GRAPHS))
    parser.add_argument("--threads", type=int, default=1,
                        help="torch and numba threads (default 1: stable timings on a "
                             "shared machine)")
    parser.add_argument("--time-worker", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--memory-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = SIZES["quick" if args.quick else "full"]
    reps = 7 if args.quick else 9
    if args.time_worker:
        model, graph_kind, variants = args.time_worker
        print(json.dumps(time_variants(model, graph_kind, variants.split(","), size, reps,
                                       3, args.threads)))
        return
    if args.memory_worker:
        print(json.dumps(peak_memory(*args.memory_worker, size, args.threads)))
        return
    common = ["--threads", str(args.threads)] + (["--quick"] if args.quick else [])
    rows = []
    for graph_kind in args.graphs.split(","):
        for model in args.models.split(","):
            variants = [v for v in VARIANTS if v != "fused" or model == "gat"]
            timed = _subprocess(["--time-worker", model, graph_kind, ",".join(variants),
                                 *common])
            row = {"model": model, "graph": graph_kind, "edges": timed["edges"],
                   "fused_ms": None, "peak_bytes": {}}
            for v in variants:
                row[f"{v}_ms"] = timed["ms"][v]
                row["peak_bytes"][v] = _subprocess(
                    ["--memory-worker", model, graph_kind, v, *common])["peak_bytes"]
            print(f"  {model:<5} {graph_kind:<7} " + " ".join(
                f"{v}={timed['ms'][v]:.1f}ms" for v in variants), file=sys.stderr, flush=True)
            rows.append(row)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "size": size, "threads": args.threads,
                       "peak_memory": "peak RSS growth during one forward+backward after "
                                      "warm-up (VmHWM after clear_refs), bytes"}, f, indent=1)


if __name__ == "__main__":
    main()
