"""What validating a store costs: `Store.open` (checksums of the small files and the cheap
content checks: dtypes, lengths, ends, one min/max pass; the checks also timed alone, their
files cached by then, and of them the order checks open makes since issue 33: perm/inv
inverse, indptr monotone) and `verify`'s full content checks
(indptr monotone, every index in range, perm/inv inverse, splits distinct, edge types) and
page checksums, per store, with rows (nodes + edges) per second; then the open after it,
which finds the files as the first open's check stamped them (storage_format.verified) and
hashes nothing: first open / stamped open is what the stamps save.

    python scripts/bench_verify.py STORE [STORE ...] [--json PATH] [--skip-pages]

Each store is timed in a fresh process after the page cache is dropped (as root; else
said), so the times include reading the files; the first open with an empty cache folder
of its own (no stamps), the stamped open in another fresh process with the same folder.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gnnssd.storage_format import Store
from gnnssd.storage_format.verified import CACHE_ENV, stamp_path

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_caches() -> str:
    try:
        subprocess.run(["sync"], check=True)
        DROP_CACHES.write_text("3\n")
        return "dropped"
    except OSError as exc:
        return f"not dropped ({exc.strerror})"


def measure(path: str, pages: bool) -> dict:
    """One store, in this process: open, the full content checks, the page checksums."""
    start = time.perf_counter()
    store = Store.open(path)
    opened = time.perf_counter() - start
    start = time.perf_counter()  # open's share that is content validation, its files now cached
    store._check_arrays()
    cheap = time.perf_counter() - start
    start = time.perf_counter()  # of which, since issue 33: perm/inv inverse, indptr monotone
    store._check_order_content()
    order = time.perf_counter() - start
    start = time.perf_counter()
    store._check_content()
    content = time.perf_counter() - start
    page_s = None
    if pages:
        start = time.perf_counter()
        store._check_pages()
        page_s = time.perf_counter() - start
    rows = store.num_nodes + store.num_edges
    return {"store": path, "nodes": store.num_nodes, "edges": store.num_edges,
            "feature_bytes": store.feature_bytes, "open_s": round(opened, 3),
            "open_content_checks_s": round(cheap, 3), "open_order_checks_s": round(order, 3),
            "content_s": round(content, 3), "content_rows_per_s": round(rows / content),
            "pages_s": None if page_s is None else round(page_s, 3),
            "pages_bytes_per_s": None if page_s is None else round(store.feature_bytes / page_s)}


def time_open(path: str) -> dict:
    """One store's open, in this process (the stamped one: the cache folder holds them;
    `stamped` says whether it did: a store changed less than RACY_NS before the first open
    is not stamped)."""
    stamped = stamp_path(Path(path)).is_file()
    start = time.perf_counter()
    Store.open(path)
    return {"stamped_open_s": round(time.perf_counter() - start, 4), "stamped": stamped}


def child(flag: str, path: str, cache: str, *options: str) -> dict:
    """This script's `flag` (--child, --child-open) on `path` in a fresh process after the
    page cache is dropped, with `cache` as gnnssd's cache folder: its JSON line."""
    dropped = drop_caches()
    done = subprocess.run([sys.executable, __file__, flag, path, *options], capture_output=True, text=True, check=True,
                          env={**os.environ, CACHE_ENV: cache})
    return {**json.loads(done.stdout.splitlines()[-1]), "page_cache": dropped}


def topology_bytes(path: str) -> int:
    """Bytes of the files open hashes (all but features.bin: the topology and node arrays)."""
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.suffix == ".npy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("stores", nargs="*")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-pages", action="store_true", help="leave out the page checksums")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-open", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, not args.skip_pages)))
        return
    if args.child_open:
        print(json.dumps(time_open(args.child_open)))
        return
    rows = []
    for path in args.stores:
        with tempfile.TemporaryDirectory(prefix="gnnssd-cache-") as cache:
            first = child("--child", path, cache, *(["--skip-pages"] if args.skip_pages else []))
            stamped = child("--child-open", path, cache)
        rows.append({**first, **stamped, "topology_bytes": topology_bytes(path),
                     "first_over_stamped": round(first["open_s"] / max(stamped["stamped_open_s"], 1e-4), 1)})
    print(f"{'store':14} {'nodes':>12} {'edges':>14} {'hashed MB':>9} {'open s':>7} {'stamped s':>9} {'ratio':>6} "
          f"{'checks s':>8} {'order s':>7} {'content s':>9} {'rows/s':>12} {'pages s':>8} {'GB/s':>6}")
    for r in rows:
        pages = "-" if r["pages_s"] is None else f"{r['pages_s']:8.1f} {r['pages_bytes_per_s'] / 1e9:6.2f}"
        print(f"{Path(r['store']).name:14} {r['nodes']:>12,} {r['edges']:>14,} {r['topology_bytes'] / 1e6:>9,.0f} "
              f"{r['open_s']:>7.2f} {r['stamped_open_s']:>9.3f} {r['first_over_stamped']:>6} "
              f"{r['open_content_checks_s']:>8.2f} {r['open_order_checks_s']:>7.2f} {r['content_s']:>9.1f} "
              f"{r['content_rows_per_s']:>12,} {pages}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=2))


if __name__ == "__main__":
    main()
