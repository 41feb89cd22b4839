#!/usr/bin/env python3
"""Page CRC32C throughput: the store's numba code (storage_format/page_crc.py, slice-by-8,
pages in parallel) against the I/O engine's C code (SSE4.2 where the CPU has it), on the
same random buffer, interleaved (numba, C, C, numba, ...; medians), in GB/s.

    python scripts/bench_crc.py [--mib 256] [--repeats 5] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import numba
import numpy as np

from gnnssd.io_engine import crc as engine_crc
from gnnssd.storage_format import page_crc


def _seconds(fn: Callable[[np.ndarray], np.ndarray], data: np.ndarray) -> float:
    start = time.perf_counter()
    fn(data)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="buffer size (MiB)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    data = np.random.default_rng(0).integers(256, size=args.mib << 20, dtype=np.uint8)
    kernels = {"numba": page_crc.page_crc32c, "C": engine_crc.page_crc32c}
    if not np.array_equal(kernels["numba"](data), kernels["C"](data)):
        raise SystemExit("numba and C page checksums differ")
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for r in range(args.repeats):
        for name in (kernels if r % 2 == 0 else reversed(kernels)):
            times[name].append(_seconds(kernels[name], data))
    gbps = {name: data.nbytes / statistics.median(t) / 1e9 for name, t in times.items()}
    result: dict[str, Any] = {
        "bytes": data.nbytes, "page": page_crc.PAGE, "repeats": args.repeats,
        "numba_threads": numba.get_num_threads(), "c_hardware_crc": engine_crc.hardware_crc32c(),
        "numba_gbps": round(gbps["numba"], 3), "c_gbps": round(gbps["C"], 3),
        "numba_over_c": round(gbps["numba"] / gbps["C"], 3)}
    print(f"{'kernel':8} {'GB/s':>8}   ({args.mib} MiB, {page_crc.PAGE}-byte pages, "
          f"median of {args.repeats})")
    for name in kernels:
        print(f"{name:8} {gbps[name]:8.2f}")
    print(f"numba/C  {result['numba_over_c']:8.3f}   (numba threads {result['numba_threads']}, "
          f"C hardware crc32 {result['c_hardware_crc']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
