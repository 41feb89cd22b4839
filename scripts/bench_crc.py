#!/usr/bin/env python3
"""Page CRC32C throughput: the store's numba code (storage_format/page_crc.py, slice-by-8,
pages in parallel) against the I/O engine's C code by each path the CPU has (SSE4.2's crc32
instruction; AVX-512 VPCLMULQDQ folding), on the same random buffer, interleaved (forwards,
then backwards, ...; medians), in GB/s.

    python scripts/bench_crc.py [--mib 256] [--repeats 5] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial
from typing import Any, Callable

import numba
import numpy as np

from gnnssd.io_engine import crc as engine_crc
from gnnssd.storage_format import page_crc


def _seconds(fn: Callable[[np.ndarray], np.ndarray], data: np.ndarray) -> float:
    start = time.perf_counter()
    fn(data)
    return time.perf_counter() - start


def _has(path: str) -> bool:
    """Whether this CPU runs `path` itself (page_crc32c would take a slower one instead)."""
    order = list(engine_crc.PAGE_CRC_PATHS)
    return order.index(path) <= order.index(engine_crc.page_crc_path())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="buffer size (MiB)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    data = np.random.default_rng(0).integers(256, size=args.mib << 20, dtype=np.uint8)
    paths = [name for name in ("sse4.2", "vpclmulqdq") if _has(name)]
    kernels = {"numba": page_crc.page_crc32c, **{f"C {p}": partial(engine_crc.page_crc32c, path=p) for p in paths}}
    reference = kernels["numba"](data)
    for name, kernel in kernels.items():
        if not np.array_equal(kernel(data), reference):
            raise SystemExit(f"{name} and numba page checksums differ")
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for r in range(args.repeats):
        for name in (kernels if r % 2 == 0 else reversed(kernels)):
            times[name].append(_seconds(kernels[name], data))
    gbps = {name: data.nbytes / statistics.median(t) / 1e9 for name, t in times.items()}
    taken = f"C {engine_crc.page_crc_path()}"
    result: dict[str, Any] = {
        "bytes": data.nbytes, "page": page_crc.PAGE, "repeats": args.repeats,
        "numba_threads": numba.get_num_threads(), "c_path": engine_crc.page_crc_path(),
        "gbps": {name: round(v, 3) for name, v in gbps.items()},
        "numba_over_c": round(gbps["numba"] / gbps[taken], 3)}
    print(f"{'kernel':14} {'GB/s':>8}   ({args.mib} MiB, {page_crc.PAGE}-byte pages, "
          f"median of {args.repeats})")
    for name in kernels:
        print(f"{name:14} {gbps[name]:8.2f}{'   (the engine takes this one)' if name == taken else ''}")
    print(f"numba/C        {result['numba_over_c']:8.3f}   (numba threads {result['numba_threads']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
