"""GPU benchmark (the device check's figures): compiled layers against PyTorch Geometric and
plain torch ops, end to end against compute-only and memory mode, loader threads.

(a) layers: each built-in layer (sage, gcn, gat), forward + backward on the first (largest)
    block of sampled mini-batches of a store, on one card: gnnssd's compiled layer on CSC
    blocks (Triton aggregation), the same layer with the aggregation as plain torch ops
    (index_select + index_add), and PyG's layer on the same edges (SAGEConv, GCNConv with
    the same symmetric edge norm, GATConv). Median of triton.testing.do_bench. With
    --typed-store (a heterogeneous store, e.g. mag-small) also R-GCN's and R-GAT's first
    relational layer (gnnssd.compiler.hetero: per-relation compiled layers summed) on its
    first typed block, compiled vs the same with the aggregation as torch ops (no PyG row:
    PyG's relational layers take one node set, not a typed block).
(b) end to end: a 3-layer GraphSAGE trained on N mini-batches: gnnssd ssd mode (a fraction
    of the features for its hot cache, buffers and queues, its x arrays on top), memory mode (DGL's sampler, rows in RAM), and compute-only
    (the same mini-batches sampled beforehand and held on the GPU). Mini-batches/s, the
    loader's stage times, and the foreground wait: time the training loop spent waiting for
    its next mini-batch (copy not hidden, or loader too slow).
(c) loader-only: ssd mode without a model, with 1, 2, 4, 8, 16 numba threads (one process each).
(d) device tier: the same training with `features: device` (the whole store on the GPU, sampled and
    gathered there: issue 47) against compute-only: mini-batches/s, the ratio, the load time and
    the device memory it took.
(e) gather where x is consumed (issue 46 item 2, issue 47 item 3): the ssd loader's training of (b)
    with x gathered on the host and copied whole (ssd.gather: host), gathered on the device (the GPU
    reads the cached rows from the pinned host cache in place, only cold rows cross), and that with
    ssd.device_budget at --budget-share of the features (the hottest rows in device memory):
    mini-batches/s and the share of x rows each level served.

    python scripts/bench_gpu.py --store STORE [--typed-store STORE] [--quick] [--json out.json]
                                [--parts layers,e2e,threads,device,gather]

Prints a table per part and writes every figure to --json. Needs CUDA for (a), and for (b), (d) and (e)
unless --device cpu (a dry run of their code, no figure to keep).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from gnnssd import NodeLoader
from gnnssd.compiler import CSCBlock, GATConvUDF, GraphConvUDF, SAGEConvUDF, TypedCSCBlock, compile as compile_layer
from gnnssd.compiler.kernels import csc as csc_kernels
from gnnssd.core import ModelConfig
from gnnssd.models.builtin import BlockGNN
from gnnssd.models.hetero import build_hetero_model
from gnnssd.storage_format import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_feed import budget_beside_x  # noqa: E402

FANOUTS = [15, 10, 5]
BATCH = 1024
HIDDEN = 256
#: Where (b) trains: the GPU; `--device cpu` dry-runs the same code on a machine without one.
DEVICE = torch.device("cuda")


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def table(title: str, rows: list[dict[str, Any]]) -> None:
    """A plain text table of `rows` (their keys as the header)."""
    print(f"\n== {title}")
    if not rows:
        print("(nothing measured)")
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print(" | ".join(k.ljust(w) for k, w in zip(keys, widths)))
    for c in cells:
        print(" | ".join(v.ljust(w) for v, w in zip(c, widths)))


def sample_batches(store: Store, n: int, seed: int = 0) -> list:
    """n mini-batches of the training nodes (memory mode, on the CPU)."""
    out = []
    with NodeLoader(store, store.train_idx, fanouts=FANOUTS, batch_size=BATCH, features="memory",
                    shuffle=True, seed=seed, device="cpu") as loader:
        for mb in loader:
            out.append(mb)
            if len(out) == n:
                break
    return out


# --- (a) layers -------------------------------------------------------------------------

def _edge_norm(csc: CSCBlock) -> torch.Tensor:
    """GCN's symmetric norm per edge (CSC order): 1 / sqrt(out_deg(u) * in_deg(v))."""
    out_deg = csc.out_degrees().clamp(min=1).float()
    in_deg = csc.in_degrees().clamp(min=1).float()
    return (out_deg[csc.indices] * in_deg[csc.dst_index()]).rsqrt()


def _pyg_layer(name: str, d_in: int, d_out: int, heads: int, csc: CSCBlock) -> Callable[[torch.Tensor], torch.Tensor]:
    import torch_geometric.nn as pyg

    edge_index = torch.stack([csc.indices, csc.dst_index()])
    size = (csc.num_src, csc.num_dst)
    if name == "sage":
        conv = pyg.SAGEConv(d_in, d_out, aggr="mean").cuda()
        return lambda x: conv((x, x[: csc.num_dst]), edge_index, size=size)
    if name == "gcn":  # on the square graph over the sources: PyG's GCNConv takes no bipartite input
        conv = pyg.GCNConv(d_in, d_out, normalize=False, add_self_loops=False).cuda()
        weight = _edge_norm(csc)
        return lambda x: conv(x, edge_index, weight)[: csc.num_dst]
    conv = pyg.GATConv((d_in, d_in), d_out, heads=heads, add_self_loops=False).cuda()
    return lambda x: conv((x, x[: csc.num_dst]), edge_index, size=size)


def _gnnssd_layer(name: str, d_in: int, d_out: int, heads: int) -> torch.nn.Module:
    udf = {"sage": lambda: SAGEConvUDF(d_in, d_out), "gcn": lambda: GraphConvUDF(d_in, d_out),
           "gat": lambda: GATConvUDF(d_in, d_out, heads)}[name]()
    return compile_layer(udf).cuda()


def _relational_rows(store: Store, quick: bool) -> list[dict[str, Any]]:
    """R-GCN's and R-GAT's first relational layer on the first typed block of `store`:
    compiled (fused aggregation) and the same as torch ops, forward + backward."""
    from triton.testing import do_bench

    block = TypedCSCBlock.from_dgl(sample_batches(store, 1)[0].blocks[0]).to(DEVICE)
    widths = {t.name: t.dim or store.feat_dim for t in store.schema.node_types}
    h = {t: torch.randn(block.num_src_nodes(t), widths[t], device=DEVICE) for t in block.srctypes}
    rows = []
    for name in ("rgcn", "rgat"):
        heads = 4 if name == "rgat" else 1
        model = build_hetero_model(ModelConfig(name=name, hidden=HIDDEN, layers=2, heads=heads), store.schema,
                                   store.feat_dim, store.num_classes).to(DEVICE)
        layer, times = model.convs[0], {}
        for variant in ("gnnssd", "torch ops"):
            csc_kernels.FUSED_ON_CUDA = variant == "gnnssd"
            leaves = {t: x.clone().requires_grad_(True) for t, x in h.items()}

            def step() -> None:
                sum(out.sum() for out in layer(block, leaves).values()).backward()

            step()
            times[variant] = do_bench(step, warmup=25 if quick else 100, rep=100 if quick else 500,
                                      return_mode="median")
        csc_kernels.FUSED_ON_CUDA = True
        row = {"layer": f"{name} ({len(block.canonical_etypes)} relations)",
               "edges": sum(block.num_edges(r) for r in block.canonical_etypes),
               "dst": sum(block.num_dst.values()), "src": sum(block.num_src.values()), "in": store.feat_dim,
               "out": HIDDEN}
        row.update({f"{k} ms": v for k, v in times.items()})
        row["torch ops / gnnssd"] = times["torch ops"] / times["gnnssd"]
        rows.append(row)
    return rows


def bench_layers(store: Store, quick: bool, typed_store: Store | None = None) -> list[dict[str, Any]]:
    from triton.testing import do_bench

    mb = sample_batches(store, 1)[0]
    csc = CSCBlock.from_dgl(mb.blocks[0]).to("cuda")
    d_in = store.feat_dim
    x = torch.randn(csc.num_src, d_in, device="cuda")
    rows = []
    for name in ("sage", "gcn", "gat"):
        heads = 4 if name == "gat" else 1
        d_out = HIDDEN // heads
        layer = _gnnssd_layer(name, d_in, d_out, heads)
        variants: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"gnnssd": lambda x: layer(csc, x)}
        variants["torch ops"] = lambda x: layer(csc, x)  # the same layer, run with the fused kernel off
        try:
            variants["PyG"] = _pyg_layer(name, d_in, d_out, heads, csc)
        except ImportError as err:
            print(f"PyG not available: {err}")
        times = {}
        for variant, fn in variants.items():
            csc_kernels.FUSED_ON_CUDA = variant != "torch ops"
            xs = x.clone().requires_grad_(True)

            def step() -> None:
                fn(xs).sum().backward()

            step()
            times[variant] = do_bench(step, warmup=25 if quick else 100, rep=100 if quick else 500,
                                      return_mode="median")
        csc_kernels.FUSED_ON_CUDA = True
        row = {"layer": name, "edges": csc.num_edges, "dst": csc.num_dst, "src": csc.num_src,
               "in": d_in, "out": d_out * heads}
        row.update({f"{k} ms": v for k, v in times.items()})
        if "PyG" in times:
            row["PyG / gnnssd"] = times["PyG"] / times["gnnssd"]
        row["torch ops / gnnssd"] = times["torch ops"] / times["gnnssd"]
        rows.append(row)
    if typed_store is not None:
        rows += _relational_rows(typed_store, quick)
    table("(a) one layer, forward + backward, first block (median ms)", rows)
    return rows


# --- (b) end to end ---------------------------------------------------------------------

def _model(store: Store) -> torch.nn.Module:
    dims = [store.feat_dim, HIDDEN, HIDDEN, int(store.num_classes)]
    return BlockGNN([compile_layer(SAGEConvUDF(a, b)) for a, b in zip(dims[:-1], dims[1:])], 0.5).to(DEVICE)


def _train(model: torch.nn.Module, batches, n: int, warmup: int) -> dict[str, float]:
    """Train on the first n mini-batches of `batches`; rate and foreground wait after `warmup`."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    it = iter(batches)
    wait = 0.0
    done = 0
    start = None
    while done < n:
        t0 = time.perf_counter()
        mb = next(it, None)
        if mb is None:
            break
        if done == warmup:
            sync()
            start, wait = time.perf_counter(), 0.0
            t0 = start
        wait += time.perf_counter() - t0
        loss = F.cross_entropy(model(mb.model_blocks, mb.x), mb.y, ignore_index=-1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        done += 1
    sync()
    elapsed = time.perf_counter() - start
    measured = done - warmup
    return {"batches": measured, "batches/s": measured / elapsed, "wait share": wait / elapsed}


def _e2e_length(quick: bool, batches: int | None) -> tuple[int, int]:
    """(mini-batches trained, of which warm-up) of one system in (b) and (d)."""
    n, warmup = (40, 5) if quick else (150, 10)
    return batches or n, warmup


def compute_only(store: Store, n: int, warmup: int) -> dict[str, Any]:
    """Training on mini-batches sampled beforehand and already on the device: the rate a loader can at best feed."""
    held = [mb.to(DEVICE) for mb in sample_batches(store, min(n, 30), seed=1)]
    sync()
    cycle = (held[i % len(held)] for i in range(n))
    return {"system": f"compute-only (held on {DEVICE.type})", **_train(_model(store), cycle, n, warmup)}


def bench_e2e(store: Store, quick: bool, budget_share: float, batches: int | None) -> list[dict[str, Any]]:
    n, warmup = _e2e_length(quick, batches)
    rows = [compute_only(store, n, warmup)]
    budget = ssd_budget(store, budget_share, DEVICE)
    for system, options in (("memory (rows in RAM)", {"features": "memory"}),
                            (f"gnnssd ssd (budget {budget_share:g} of features + x arrays)",
                             {"features": "ssd", "memory_budget": budget})):
        with NodeLoader(store, store.train_idx, fanouts=FANOUTS, batch_size=BATCH, shuffle=True, seed=0,
                        device=DEVICE, **options) as loader:
            result = _train(_model(store), loader, n, warmup)
            stages = {f"{k} s/mb": v / max(result["batches"] + warmup, 1) for k, v in loader.stage_times().items()}
        rows.append({"system": system, **result, **stages})
    base = rows[0]["batches/s"]
    for row in rows:
        row["vs compute-only"] = row["batches/s"] / base
    table(f"(b) end to end, 3-layer GraphSAGE, batch {BATCH}, fanouts {FANOUTS}", rows)
    return rows


# --- (d) the device tier ----------------------------------------------------------------

def bench_device(store: Store, quick: bool, batches: int | None) -> list[dict[str, Any]]:
    """`features: device` end to end against compute-only (issue 47's target: >= 0.4x)."""
    n, warmup = _e2e_length(quick, batches)
    rows = [compute_only(store, n, warmup)]
    used = torch.cuda.memory_allocated(DEVICE) if DEVICE.type == "cuda" else 0
    start = time.perf_counter()
    with NodeLoader(store, store.train_idx, fanouts=FANOUTS, batch_size=BATCH, shuffle=True, seed=0,
                    device=DEVICE, features="device") as loader:
        sync()
        loaded = time.perf_counter() - start
        stored = torch.cuda.memory_allocated(DEVICE) - used if DEVICE.type == "cuda" else None
        loader.stage_times()  # not the load
        epochs = (mb for _ in itertools.count() for mb in loader)  # as many as n takes
        result = _train(_model(store), epochs, n, warmup)
        stages = {f"{k} s/mb": v / max(result["batches"] + warmup, 1) for k, v in loader.stage_times().items()}
    rows.append({"system": "gnnssd device (store on the device)", **result, **stages, "load s": loaded,
                 "store bytes on device": stored})
    for row in rows:
        row["vs compute-only"] = row["batches/s"] / rows[0]["batches/s"]
    table(f"(d) device tier, 3-layer GraphSAGE, batch {BATCH}, fanouts {FANOUTS}", rows)
    return rows


# --- (e) gather where x is consumed ------------------------------------------------------

LEVELS = ("rows_device", "rows_host_cache", "rows_read")


def bench_gather(store: Store, quick: bool, budget_share: float, batches: int | None) -> list[dict[str, Any]]:
    """The ssd loader of (b) with its x gathered on the host, on the device, and on the
    device beside a device slice of `budget_share` of the features."""
    n, warmup = _e2e_length(quick, batches)
    budget = ssd_budget(store, budget_share, DEVICE)
    slice_bytes = int(store.feature_bytes * budget_share)
    rows = []
    for system, options in (("ssd, host gather", {"gather": "host"}), ("ssd, device gather", {"gather": "device"}),
                            (f"ssd, device gather, device_budget {budget_share:g} of features",
                             {"gather": "device", "device_budget": slice_bytes})):
        try:
            with NodeLoader(store, store.train_idx, fanouts=FANOUTS, batch_size=BATCH, shuffle=True, seed=0,
                            device=DEVICE, features="ssd", memory_budget=budget, **options) as loader:
                loader.io_stats()  # not the set-up
                loader.stage_times()
                result = _train(_model(store), loader, n, warmup)
                io = loader.io_stats()
                stages = {f"{k} s/mb": v / max(result["batches"] + warmup, 1) for k, v in loader.stage_times().items()}
        except Exception as err:  # noqa: BLE001 - a device run is rare: the other ways' rows still come
            traceback.print_exc()
            rows.append({"system": system, "error": f"{type(err).__name__}: {err}"})
            continue
        served = max(sum(io[k] for k in LEVELS), 1)
        rows.append({"system": system, **result, **{f"{k} share": io[k] / served for k in LEVELS}, **stages})
    host = rows[0].get("batches/s")
    for row in rows:
        if host and "batches/s" in row:
            row["vs host gather"] = row["batches/s"] / host
    table(f"(e) x gathered where it is consumed, 3-layer GraphSAGE, batch {BATCH}, fanouts {FANOUTS}", rows)
    return rows


# --- (c) loader threads -----------------------------------------------------------------

def ssd_budget(store: Store, share: float, device: torch.device | str) -> int:
    """`share` of the features for the ssd loader's hot cache, buffers and queues, and the x
    arrays it hands out on top (bench_feed.budget_beside_x; docs/BENCHMARKS.md, issue 32's
    fifth round)."""
    return budget_beside_x(int(store.feature_bytes * share), lambda budget: NodeLoader(
        store, store.train_idx, fanouts=FANOUTS, batch_size=BATCH, seed=0, features="ssd",
        memory_budget=budget, device=device))


def loader_only(store_path: str, n: int, budget_share: float) -> dict[str, float]:
    store = Store.open(store_path)
    with NodeLoader(store, store.train_idx, fanouts=FANOUTS, batch_size=BATCH, shuffle=True, seed=0,
                    features="ssd", memory_budget=ssd_budget(store, budget_share, "cpu"), device="cpu") as loader:
        it = iter(loader)
        next(it)
        start, cpu0 = time.perf_counter(), time.process_time()
        done = sum(1 for _, _ in zip(range(n), it))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return {"batches": done, "batches/s": done / wall, "process CPU s/mb": cpu / max(done, 1)}


def bench_threads(store_path: str, quick: bool, budget_share: float) -> list[dict[str, Any]]:
    rows = []
    for threads in (1, 2, 4, 8, 16):
        if threads > (os.cpu_count() or 1):
            break
        env = {**os.environ, "NUMBA_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
        run = subprocess.run([sys.executable, __file__, "--store", store_path, "--loader-only",
                              "--batches", str(20 if quick else 60), "--budget-share", str(budget_share)],
                             env=env, capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stderr[-2000:])
            continue
        rows.append({"threads": threads, **json.loads(run.stdout.strip().splitlines()[-1])})
    for row in rows:
        row["vs 1 thread"] = row["batches/s"] / rows[0]["batches/s"]
    table("(c) loader-only mini-batches/s, ssd mode, by numba threads", rows)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True)
    parser.add_argument("--typed-store", help="a heterogeneous store: (a) also times rgcn's and rgat's layers on it")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--parts", default="layers,e2e,threads")
    parser.add_argument("--budget-share", type=float, default=1 / 8)
    parser.add_argument("--device", default="cuda", help="cpu: dry-run (b) and (d) without a GPU")
    parser.add_argument("--e2e-batches", type=int, help="mini-batches per system in (b) (default 40, 150)")
    parser.add_argument("--loader-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, default=20, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if args.loader_only:
        print(json.dumps(loader_only(args.store, args.batches, args.budget_share)))
        return
    store = Store.open(args.store)
    figures: dict[str, Any] = {"store": Path(args.store).name, "nodes": store.num_nodes, "feat_dim": store.feat_dim,
                               "feature_bytes": store.feature_bytes, "cpus": os.cpu_count(),
                               "torch": torch.__version__, "numpy": np.__version__}
    if torch.cuda.is_available():
        figures["card"] = torch.cuda.get_device_name()
    print(json.dumps(figures))
    parts = args.parts.split(",")
    typed = Store.open(args.typed_store) if args.typed_store else None
    runs = {"layers": lambda: bench_layers(store, args.quick, typed), "e2e": lambda: bench_e2e(store, args.quick, args.budget_share, args.e2e_batches),
            "threads": lambda: bench_threads(args.store, args.quick, args.budget_share),
            "device": lambda: bench_device(store, args.quick, args.e2e_batches),
            "gather": lambda: bench_gather(store, args.quick, args.budget_share, args.e2e_batches)}
    for part in parts:
        try:
            figures[part] = runs[part]()
        except Exception as err:  # noqa: BLE001 - one part failing must not lose the others' figures
            figures[part] = {"error": f"{type(err).__name__}: {err}"}
            print(f"{part} failed: {type(err).__name__}: {err}")
            traceback.print_exc()
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1, default=float))


if __name__ == "__main__":
    main()
