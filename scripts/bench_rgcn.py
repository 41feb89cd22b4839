"""R-GCN and R-GAT: the compiled relational layers (gnnssd.compiler.hetero) against dgl.nn's
HeteroGraphConv, forward + backward of the whole built-in model on sampled typed blocks.

The same mini-batches (memory mode, DGL's sampler, sampled once beforehand) and the same
parameters for every variant; the variants run round-robin in one process, so that load
from other work on the machine hits them alike:
  dgl.nn         the model with dgl.nn's HeteroGraphConv on DGL's blocks
  compiled/dgl   the compiled model on DGL's blocks (its ops lowered to dgl.ops)
  compiled/csc   the compiled model on the blocks' per-relation CSC (TypedCSCBlock, torch
                 ops and on CUDA Triton kernels: what runs on a GPU without DGL's CUDA build)
On `--device cuda` only compiled/csc can run (PyPI's DGL is CPU-only), with its torch-ops
twin (`compiled/csc torch ops`: the fused aggregation kernel off). Building the CSC of a
mini-batch's blocks (TypedCSCBlock.from_dgl) is timed on its own (the loader does it once
per mini-batch). Every variant's logits are checked against dgl.nn's first. Each repeat is
timed as wall time and as the process's CPU time (time.process_time: on a machine shared
with other work the CPU time moves far less than the wall time; with --threads 1 it is the
work done).

    python scripts/bench_rgcn.py --store STORE [--quick] [--device cpu|cuda] [--json PATH]

STORE: a typed store, e.g. `gnnssd preprocess hetero-synthetic --preset mag-small --out STORE`.
Prints a table (median ms per mini-batch over the repeats) and writes every figure to --json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F

from gnnssd import NodeLoader
from gnnssd.compiler import TypedCSCBlock
from gnnssd.compiler.kernels import csc as csc_kernels
from gnnssd.core import ModelConfig
from gnnssd.models.hetero import build_hetero_model
from gnnssd.storage_format import Store


def sample_batches(store: Store, n: int, fanouts: list[int], batch: int) -> list:
    with NodeLoader(store, store.train_idx, fanouts=fanouts, batch_size=batch, features="memory",
                    shuffle=True, seed=0, device="cpu") as loader:
        return [mb for _, mb in zip(range(n), loader)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def twins(store: Store, name: str, hidden: int, device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    """dgl.nn's model and the compiled one with the same parameters."""
    cfg = {"name": name, "hidden": hidden, "layers": 2, "heads": 4, "dropout": 0.0}
    torch.manual_seed(0)
    reference = build_hetero_model(ModelConfig(**cfg, compile=False), store.schema, store.feat_dim, store.num_classes)
    compiled = build_hetero_model(ModelConfig(**cfg), store.schema, store.feat_dim, store.num_classes)
    compiled.load_state_dict(reference.state_dict(), strict=True)
    return reference, compiled.to(device)


def bench_model(store: Store, name: str, batches: list, device: torch.device, hidden: int,
                reps: int) -> list[dict[str, Any]]:
    reference, compiled = twins(store, name, hidden, device)
    inputs = [(mb.blocks, mb.x, mb.y) for mb in batches]
    csc = [([TypedCSCBlock.from_dgl(b).to(device) for b in blocks], {k: v.to(device) for k, v in x.items()},
            y.to(device)) for blocks, x, y in inputs]
    variants: dict[str, tuple[torch.nn.Module, list, bool]] = {}  # model, inputs, fused kernel on
    if device.type == "cpu":
        variants["dgl.nn"] = (reference, inputs, True)
        variants["compiled/dgl"] = (compiled, inputs, True)
    variants["compiled/csc"] = (compiled, csc, True)
    if device.type == "cuda":
        variants["compiled/csc torch ops"] = (compiled, csc, False)

    with torch.no_grad():  # the compiled variants compute dgl.nn's logits
        expected = reference(*inputs[0][:2])
        errors = {}
        for variant, (model, data, fused) in variants.items():
            csc_kernels.FUSED_ON_CUDA = fused
            errors[variant] = float((model(*data[0][:2]).cpu() - expected).abs().max())

    def step(model: torch.nn.Module, data: list) -> None:
        for blocks, x, y in data:
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(blocks, x), y, ignore_index=-1).backward()

    times: dict[str, list[float]] = {v: [] for v in variants}
    cpu_times: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(reps + 1):  # the first round warms up (compiles each program)
        for variant, (model, data, fused) in variants.items():
            csc_kernels.FUSED_ON_CUDA = fused
            sync(device)
            start, cpu_start = time.perf_counter(), time.process_time()
            step(model, data)
            sync(device)
            if rep:
                times[variant].append((time.perf_counter() - start) / len(data) * 1e3)
                cpu_times[variant].append((time.process_time() - cpu_start) / len(data) * 1e3)
    csc_kernels.FUSED_ON_CUDA = True
    build = []
    for _ in range(reps):
        start = time.perf_counter()
        for blocks, _, _ in inputs:
            [TypedCSCBlock.from_dgl(b) for b in blocks]
        build.append((time.perf_counter() - start) / len(inputs) * 1e3)

    def ratio(series: dict[str, list[float]], variant: str) -> float | None:
        return statistics.median(series["dgl.nn"]) / statistics.median(series[variant]) if "dgl.nn" in series else None

    edges = sum(b.num_edges() for b in batches[0].blocks)
    rows = []
    for variant, ms in times.items():
        rows.append({"model": name, "variant": variant, "device": device.type,
                     "CPU ms per mini-batch": statistics.median(cpu_times[variant]),
                     "dgl.nn / this (CPU)": ratio(cpu_times, variant),
                     "wall ms per mini-batch": statistics.median(ms), "dgl.nn / this (wall)": ratio(times, variant),
                     "max |logit diff|": errors[variant], "edges of the first mini-batch": edges,
                     "reps": ms, "cpu_reps": cpu_times[variant]})
    rows.append({"model": name, "variant": "TypedCSCBlock.from_dgl (per mini-batch, both blocks)", "device": "cpu",
                 "wall ms per mini-batch": statistics.median(build), "reps": build})
    return rows


def table(rows: list[dict[str, Any]], keys: list[str]) -> None:
    def cell(v: Any) -> str:
        return "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    cells = [[cell(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print(" | ".join(k.ljust(w) for k, w in zip(keys, widths)))
    for c in cells:
        print(" | ".join(v.ljust(w) for v, w in zip(c, widths)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="a typed (heterogeneous) store")
    parser.add_argument("--quick", action="store_true", help="4 mini-batches, 3 repeats")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--fanouts", default="10,10", help="per layer, on every relation")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--models", default="rgcn,rgat")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's)")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.reps = 4, 3
    store = Store.open(args.store)
    device = torch.device(args.device)
    batches = sample_batches(store, args.batches, [int(f) for f in args.fanouts.split(",")], args.batch_size)
    if args.threads:  # after sampling: the loader sets its own
        torch.set_num_threads(args.threads)
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        rows += bench_model(store, name, batches, device, args.hidden, args.reps)
    print(f"forward + backward of the whole model, {len(batches)} mini-batches of {args.batch_size} seeds, "
          f"fanouts {args.fanouts}, hidden {args.hidden}, torch threads {torch.get_num_threads()}; "
          f"median of {args.reps} repeats")
    table(rows, ["model", "variant", "device", "CPU ms per mini-batch", "dgl.nn / this (CPU)", "wall ms per mini-batch",
                 "dgl.nn / this (wall)", "max |logit diff|"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "args": vars(args), "torch_threads": torch.get_num_threads()}, f, indent=1)


if __name__ == "__main__":
    main()
