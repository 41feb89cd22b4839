"""Preprocess variants side by side: wall time, CPU use, peak RSS and throughput.

Each variant is one `gnnssd preprocess ogb` run in its own process (so its peak RSS is its
own, from wait4), one after the other on the same machine; the store is deleted after its
checksums are recorded, and the table says whether every variant wrote the same topology.

    python scripts/bench_preprocess.py --json out.json \
        --run "limit-2GiB|.venv/bin/gnnssd|DATA/ogbn-x|--memory-limit 2GiB" \
        --run "in-memory|.venv/bin/gnnssd|DATA/ogbn-x|"

A variant is "NAME|GNNSSD_EXECUTABLE|DATASET_ROOT|EXTRA ARGS" (another checkout's
executable measures the code before a change).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any


def run_variant(spec: str, work: Path) -> dict[str, Any]:
    name, exe, root, extra = spec.split("|")
    out = work / f"store-{name}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [exe, "preprocess", "ogb", "--root", root, "--out", str(out), *shlex.split(extra)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{name}: {' '.join(cmd)} failed:\n{stderr[-3000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    feature_bytes = manifest["num_nodes"] * manifest["features"]["row_bytes"]
    input_edges = _input_edges(Path(root))
    row = {
        "name": name, "command": " ".join(cmd), "wall_s": wall,
        "user_s": usage.ru_utime, "sys_s": usage.ru_stime,
        "cpu_use": (usage.ru_utime + usage.ru_stime) / wall,
        "peak_rss_gib": usage.ru_maxrss * 1024 / 2**30,
        "nodes": manifest["num_nodes"], "input_edges": input_edges,
        "store_edges": manifest["num_edges"],
        "edges_per_s": input_edges / wall, "feature_mb_per_s": feature_bytes / 1e6 / wall,
        "topology_crc32": [manifest["files"][f]["crc32"] for f in ("indptr.npy", "indices.npy")],
    }
    shutil.rmtree(out)
    return row


def _input_edges(root: Path) -> int:
    """E from the binary layout's header, or the CSV edge file's line count."""
    if (root / "raw" / "data.npz").exists():
        from gnnssd.datasets.npz_stream import NpzMember

        return NpzMember(root / "raw" / "data.npz", "edge_index").shape[1]
    import gzip

    with gzip.open(root / "raw" / "edge.csv.gz", "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, metavar="NAME|EXE|ROOT|ARGS")
    parser.add_argument("--work", default="bench_preprocess_out", help="where stores are written")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in args.run:
        rows.append(run_variant(spec, work))
        Path(args.json).write_text(json.dumps(rows, indent=2))
    print(f"{'variant':<22}{'nodes':>12}{'edges':>14}{'wall s':>9}{'CPU':>6}{'peak RSS':>10}"
          f"{'edges/s':>12}{'feat MB/s':>10}")
    for r in rows:
        print(f"{r['name']:<22}{r['nodes']:>12,}{r['input_edges']:>14,}{r['wall_s']:>9.1f}"
              f"{r['cpu_use']:>6.2f}{r['peak_rss_gib']:>8.2f}Gi{r['edges_per_s']:>12,.0f}"
              f"{r['feature_mb_per_s']:>10.1f}")
    same = {tuple(r["topology_crc32"]) for r in rows if r["input_edges"] == rows[0]["input_edges"]}
    print("same topology files across variants of one graph:", len(same) == 1)


if __name__ == "__main__":
    main()
