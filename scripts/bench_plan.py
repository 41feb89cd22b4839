"""Mega-batch planning and feature reads on a real store, against per-row page reads.

For each node order (original, degree, locality) and mega-batch size M, plans the same
mini-batches of epoch 0 and reads their features from disk with O_DIRECT three ways:
  per_row  one page request per cold input row of each mini-batch (the Ginex/GraphBolt
           way), hot cache = the whole memory budget minus one mini-batch's rows;
  pages    gnnssd's merged page extents per mega-batch;
  planner  what the read planner picks per mega-batch from the cost model: extents or
           compact blocks (repack scan + block writes are included in the time).
gnnssd's memory: two mega-batch buffers sized for the largest mega-batch, an 8 MiB
staging area, and the hot cache takes the rest of the budget (planned twice: first with
half the budget as hot cache to size the buffers). `fits` = no: the buffers alone exceed
the budget; such rows use half the budget as hot cache and are shown for information. The limit is the useful bytes (rows that
must come from disk, once per mega-batch) at the drive's calibrated sequential bandwidth.
Each strategy is timed --repeats times and the fastest run counts. Columns: ampl = bytes
read / useful bytes; pred_s = cost-model time; t/lim = time_s / limit_s; vs_row and
pvs_row = per_row time / this time, measured and predicted.
Orders other than the store's are made here: the CSC is renumbered and features.bin is
copied in the new order under --work. `order=locality+knob` also turns the locality knob on.

    uv run python scripts/bench_plan.py [--store DIR] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gnnssd.pipeline.calibration import CALIBRATION_FILE, calibrate, load_cost_model
from gnnssd.pipeline.direct_io import DirectIO
from gnnssd.pipeline.hot_cache import HotCache
from gnnssd.pipeline import FeatureFile, MegaBatchBuffers
from gnnssd.sampler.order import degree_order, hotness, locality_order
from gnnssd.sampler.plan import PlanConfig, Planner
from gnnssd.sampler.readplan import pages_plan, per_row_requests, windows
from gnnssd.sampler.seed_order import Proximity, Shuffled, seed_batches
from gnnssd.pipeline.repack import delete, repack
from gnnssd.storage_format import Store
from gnnssd.storage_format.preprocess.csc import renumber_csc
from gnnssd.storage_format.manifest import PAGE


def ensure_store(args) -> Path:
    if args.store:
        return Path(args.store)
    nodes = args.nodes or (600_000 if args.quick else 2_500_000)
    path = Path(args.work) / f"store_{nodes}"
    if not (path / "manifest.json").exists():
        cmd = [sys.executable, "-m", "gnnssd", "preprocess", "synthetic", "--nodes", str(nodes), "--feat-dim", "128", "--out", str(path)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return path


def permuted_features(src: Path, dst: Path, perm: np.ndarray, row_bytes: int, chunk_rows: int = 1 << 16) -> None:
    """features.bin with row i = source row perm[i], padded to a page; streamed by chunks."""
    if dst.exists() and dst.stat().st_size == src.stat().st_size:
        return
    tmp = dst.with_suffix(".tmp")
    n = len(perm)
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        for lo in range(0, n, chunk_rows):
            ids = perm[lo : lo + chunk_rows]
            order = np.argsort(ids, kind="stable")
            with mmap.mmap(fin.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                rows = np.frombuffer(mapped, np.uint8, count=n * row_bytes).reshape(n, row_bytes)
                block = np.empty((len(ids), row_bytes), np.uint8)
                block[order] = rows[ids[order]]
                del rows
            fout.write(block.data)
        fout.write(bytes(-(n * row_bytes) % PAGE))
        fout.flush()
        os.fsync(fout.fileno())
        os.posix_fadvise(fout.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    tmp.rename(dst)


def timed_loads(loader: MegaBatchBuffers, plans, block_dir: Path) -> float:
    start = time.perf_counter()
    for p in plans:
        loader.load(p, block_dir)
    return time.perf_counter() - start


def per_row_baseline(io, features: Path, mfgs_list, hot_rows: np.ndarray, row_bytes: int, model, sample: int, repeats: int) -> np.ndarray:
    """Per mini-batch: (measured time, model time, requests, bytes); the time is measured on
    the first `sample` mini-batches and extrapolated by rows (per-row reads are linear)."""
    cold = [np.setdiff1d(m.input_nodes, hot_rows, assume_unique=True) for m in mfgs_list]
    total_rows = sum(len(c) for c in cold)
    f = io.open(features)
    out = np.empty((max(len(c) for c in cold), row_bytes), np.uint8)
    staging = io.alloc(16 << 20)
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for c in cold[:sample]:
            c = np.sort(c)
            io.read_rows(f, c, row_bytes, *per_row_requests(c, row_bytes), out[: len(c)], staging)
        runs.append(time.perf_counter() - start)
    elapsed = min(runs)
    measured_rows = sum(len(c) for c in cold[:sample])
    io.close(f)
    lengths = np.concatenate([per_row_requests(c, row_bytes)[1] for c in cold])
    totals = np.array([elapsed * total_rows / measured_rows, model.read_time(lengths), len(lengths), lengths.sum()])
    return totals / len(cold)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", help="store directory (default: generate one under --work)")
    parser.add_argument("--nodes", type=int, help="nodes of the generated store")
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "gnnssd_bench_plan"))
    parser.add_argument("--mega", default="1,8,32,128", help="mega-batch sizes M")
    parser.add_argument("--orders", default="original,degree,locality,locality+knob")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fanouts", default="10,5")
    parser.add_argument("--minibatches", type=int, help="mini-batches read per configuration (at least M)")
    parser.add_argument("--budget", type=float, default=0.125, help="memory budget, fraction of the feature bytes")
    parser.add_argument("--disk-budget", type=float, default=0.25, help="block disk space, fraction of the feature bytes")
    parser.add_argument("--per-row-sample", type=int, default=8, help="mini-batches actually read by the per_row baseline")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per strategy; the fastest counts (shared drive)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="write {'rows': [...]} here")
    args = parser.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    store = Store.open(ensure_store(args))
    if not (store.path / CALIBRATION_FILE).exists():
        calibrate(store.path, seconds=0.5 if args.quick else 2.0)
    model = load_cost_model(store.path)
    rb, n = store.row_bytes, store.num_nodes
    feature_bytes = n * rb
    budget_rows = int(args.budget * feature_bytes) // rb
    disk_budget = int(args.disk_budget * feature_bytes)
    base_indptr, base_indices = np.asarray(store.indptr), np.asarray(store.indices)
    base_train = np.asarray(store.train_store_ids)
    heat = hotness(base_indptr, base_indices, fanouts, base_train)
    staging = 8 << 20
    io = DirectIO(queue_depth=128)
    print(f"store {store.path}: {n} nodes, {store.num_edges} edges, {rb} B rows, features {feature_bytes / 2**20:.0f} MiB; "
          f"memory budget {args.budget:.1%} = {budget_rows} rows (2 buffers + hot cache + {staging >> 20} MiB staging), disk budget {disk_budget / 2**20:.0f} MiB; "
          f"I/O {io.backend}; model: {model.request_s * 1e6:.1f} us/request, read {model.read_bw / 1e9:.2f} GB/s, write {model.write_bw / 1e9:.2f} GB/s")

    rows = []
    head = f"{'M':>4s} {'order':14s} {'strategy':8s} {'fits':>4s} {'inputs':>9s} {'unique':>9s} {'share':>5s} {'hot_hits':>9s} {'pages':>8s} {'extents':>8s} {'ampl':>5s} {'pred_s':>7s} {'time_s':>7s} {'limit_s':>7s} {'t/lim':>6s} {'vs_row':>6s} {'pvs_row':>7s} {'disk_MiB':>8s}"
    print(head)
    for order_name in args.orders.split(","):
        base_order, knob = order_name.split("+")[0], order_name.endswith("+knob")
        if base_order == "original":
            perm = np.arange(n, dtype=np.int64)
        elif base_order == "degree":
            perm = degree_order(base_indptr, base_indices)
        else:
            perm = locality_order(base_indptr, base_indices, 0.5 * args.budget, fanouts, base_train)
        inv = np.empty(n, np.int64)
        inv[perm] = np.arange(n)
        if base_order == "original":
            indptr, indices, features = base_indptr, base_indices, store.features_path
        else:
            indptr, indices = renumber_csc(base_indptr, base_indices, perm, inv)
            features = Path(args.work) / f"features_{base_order}.bin"
            permuted_features(store.features_path, features, perm, rb)
        train = inv[base_train]
        hot_order = np.argsort(-heat[perm], kind="stable")
        baseline = None
        for m in (int(x) for x in args.mega.split(",")):
            count = max(args.minibatches or (16 if args.quick else 32), m)
            cfg = PlanConfig(fanouts=fanouts, mega_batch=m, seed=0)
            # the locality knob: a mega-batch's seeds are one run of nearby IDs
            order = Proximity(args.batch_size * m) if knob else Shuffled()
            batches = seed_batches(train, args.batch_size, order, 0, 0)[:count]

            def plan(num_hot: int) -> tuple[np.ndarray, list]:
                hot = np.sort(hot_order[:num_hot])
                return hot, list(Planner(indptr, indices, cfg, hot).plan_batches(batches, 0))

            hot_rows, plans = plan(budget_rows // 2)
            free = budget_rows - staging // rb - 2 * max(len(p.rows) for p in plans)
            fits = free > 0
            if fits:  # fewer cold rows with a larger cache: the buffers stay large enough
                hot_rows, plans = plan(free)
            mfgs = [x for p in plans for x in p.minibatches]
            if baseline is None or knob:  # same mini-batches for every M (unless the knob regroups them)
                per_batch = max(len(x.input_nodes) for x in mfgs)
                base_hot = np.sort(hot_order[: max(budget_rows - per_batch, 0)])
                baseline = per_row_baseline(io, features, mfgs[: args.per_row_sample * 4], base_hot, rb, model, args.per_row_sample, args.repeats)
            base_time, base_pred, base_requests, base_bytes = baseline * len(mfgs)
            stats = {k: sum(p.stats[k] for p in plans) for k in ("input_rows", "unique_rows", "hot_hits", "read_rows", "minibatch_cold_rows")}
            capacity = max(len(p.rows) for p in plans)
            useful = stats["read_rows"] * rb
            limit = useful / model.read_bw
            source = FeatureFile(io, features, store.feat_dim, store.feat_dtype, model, staging)
            loader = MegaBatchBuffers(HotCache(source, hot_rows, store.num_nodes), capacity)
            results = []
            for p in plans:
                p.read = pages_plan(p.read_rows, rb, model)
            t = min(timed_loads(loader, plans, Path(args.work) / "blocks") for _ in range(args.repeats))
            results.append(("pages", t, sum(p.read.predicted_s for p in plans), sum(p.read.pages for p in plans),
                            sum(len(p.read.offsets) for p in plans), sum(p.read.nbytes for p in plans), 0))
            planned = list(windows(plans, rb, model, disk_budget))
            times = []
            for _ in range(args.repeats):
                t, peak, prev, scan_extents, scan_bytes = 0.0, 0, 0, 0, 0
                for window, scan in planned:
                    start = time.perf_counter()
                    size = repack(io, features, rb, window, scan, Path(args.work) / "blocks", staging)
                    t += time.perf_counter() - start + timed_loads(loader, window)
                    for p in window:
                        delete(p, Path(args.work) / "blocks")
                    peak, prev = max(peak, prev + size), size  # the next window is written while this one trains
                    scan_extents += len(scan.offsets)
                    scan_bytes += int(scan.lengths.sum()) + 2 * size
                times.append(t)
            t = min(times)
            results.append(("planner", t, sum(p.read.predicted_s for p in plans), sum(p.read.pages for p in plans),
                            sum(len(p.read.offsets) for p in plans) + scan_extents, sum(p.read.nbytes for p in plans) + scan_bytes, peak))
            source.close()
            results.append(("per_row", base_time, base_pred, base_requests, base_requests, base_bytes, 0))
            for strategy, t, pred, pages, extents, nbytes, disk in results:
                row = {
                    "mega_batch": m, "order": order_name, "strategy": strategy, "fits_budget": bool(fits) if strategy != "per_row" else True,
                    "minibatches": len(mfgs), "input_rows": stats["input_rows"], "unique_rows": stats["unique_rows"],
                    "sharing": stats["input_rows"] / stats["unique_rows"], "hot_hits": stats["hot_hits"],
                    "read_rows": stats["read_rows"], "pages": int(pages), "extents": int(extents), "bytes_read": int(nbytes),
                    "useful_bytes": useful, "read_amplification": nbytes / useful, "predicted_s": pred, "time_s": t,
                    "limit_s": limit, "time_over_limit": t / limit,
                    # the same time against the bytes a per-mini-batch loader needs (no mega-batch dedup)
                    "time_over_minibatch_limit": t / (stats["minibatch_cold_rows"] * rb / model.read_bw),
                    "hot_rows": len(hot_rows), "speedup_vs_per_row": base_time / t, "predicted_speedup_vs_per_row": base_pred / pred, "extra_disk_bytes": int(disk), "disk_budget_bytes": disk_budget,
                }
                if strategy == "planner":
                    row["blocks"] = sum(p.read.strategy == "block" for p in plans)
                rows.append(row)
                print(f"{m:4d} {order_name:14s} {strategy:8s} {'yes' if row['fits_budget'] else 'no':>4s} {row['input_rows']:9d} {row['unique_rows']:9d} "
                      f"{row['sharing']:5.2f} {row['hot_hits']:9d} {row['pages']:8d} {row['extents']:8d} {row['read_amplification']:5.2f} "
                      f"{pred:7.3f} {t:7.3f} {limit:7.3f} {row['time_over_limit']:6.2f} {row['speedup_vs_per_row']:6.2f} {row['predicted_speedup_vs_per_row']:7.2f} {disk / 2**20:8.1f}", flush=True)
    io.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
