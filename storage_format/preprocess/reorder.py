"""Feature rows laid out in store order, out of core, in two sequential passes.

Rows arrive in the source's order; the store wants row perm[u] at position u. Random
reads of a staged copy would cost one request per row (10^8 of them on a large graph), so
the store order is cut into windows of `window_rows` positions instead:

1. distribute: stream the source once; each row goes to the file of the window holding
   its new position, in source order (so the file needs no positions: window w's file
   holds the rows of the nodes {i : inv[i] in w}, ascending);
2. assemble: per window, read its file, place its rows at inv[i] within the window, append
   the window to features.bin, delete the file.

Memory: one window plus inv. Disk: the window files, shrinking while features.bin grows.
Both passes record their progress chunk by chunk (progress.py), so a killed run resumes.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..atomic import ChecksummedWriter, writable_file
from ..manifest import PAGE
from .progress import record, state_of

Notify = Callable[[str, int, int], None]
DISTRIBUTE = "reorder.distribute"
ASSEMBLE = "reorder.assemble"
#: Rows of a window file read at once while assembling.
READ_ROWS = 1 << 16
#: Bytes distributed between two records of progress (each record fsyncs every window file).
SYNC_BYTES = 256 << 20


def window_path(partial: Path, w: int) -> Path:
    return partial / f"features.window-{w}.bin"


def reordered_features(partial: Path, out_name: str, rows_from: Callable[[int], Iterator[np.ndarray]],
                       inv: np.ndarray, row_bytes: int, window_rows: int,
                       notify: Notify) -> dict[str, int]:
    """Write `out_name` in `partial`: the rows `rows_from(first_row)` streams (source
    order, raw bytes reshaped (rows, row_bytes) by the caller's dtype), in store order;
    returns its size and CRC-32. A resumed run keeps the window size it started with."""
    n = inv.shape[0]
    window_rows = state_of(partial, DISTRIBUTE).get("window_rows", window_rows)
    windows = -(-n // window_rows)
    _distribute(partial, rows_from, inv, row_bytes, window_rows, windows, notify)
    return _assemble(partial, out_name, inv, row_bytes, window_rows, windows, notify)


def _distribute(partial: Path, rows_from: Callable[[int], Iterator[np.ndarray]], inv: np.ndarray,
                row_bytes: int, window_rows: int, windows: int, notify: Notify) -> None:
    state = state_of(partial, DISTRIBUTE)
    if state["done"]:
        return
    n = inv.shape[0]
    sizes = state.get("sizes", [0] * windows)
    files = []
    try:
        for w in range(windows):
            files.append(writable_file(window_path(partial, w), partial, sizes[w]))
        row = state["rows"]
        unsynced = 0
        for chunk in rows_from(row):
            raw = np.ascontiguousarray(chunk).view(np.uint8).reshape(len(chunk), row_bytes)
            target = inv[row:row + len(raw)] // window_rows
            order = np.argsort(target, kind="stable")
            bounds = np.searchsorted(target[order], np.arange(windows + 1))
            for w in np.flatnonzero(np.diff(bounds)).tolist():
                files[w].write(raw[order[bounds[w]:bounds[w + 1]]].data)
            row += len(raw)
            unsynced += raw.nbytes
            if unsynced >= SYNC_BYTES or row == n:
                _sync_all(files)
                record(partial, DISTRIBUTE, {"rows": row, "sizes": [f.tell() for f in files],
                                             "window_rows": window_rows, "done": int(row == n)})
                unsynced = 0
            notify("features", row, n)
    finally:
        for f in files:
            f.close()


def _sync_all(files: list) -> None:
    for f in files:
        f.flush()
        os.fsync(f.fileno())


def _assemble(partial: Path, out_name: str, inv: np.ndarray, row_bytes: int, window_rows: int,
              windows: int, notify: Notify) -> dict[str, int]:
    state = state_of(partial, ASSEMBLE)
    if state["done"]:
        return {"size": state["size"], "crc32": state["crc32"]}
    n = inv.shape[0]
    done_windows = state.get("windows", 0)
    for w in range(done_windows):  # assembled, but the run stopped before deleting its file
        window_path(partial, w).unlink(missing_ok=True)
    with writable_file(partial / out_name, partial, state["size"]) as f:
        writer = ChecksummedWriter(f, state["crc32"], state["size"])
        for w in range(done_windows, windows):
            lo = w * window_rows
            hi = min(lo + window_rows, n)
            sources = np.flatnonzero((inv >= lo) & (inv < hi))  # ascending: the file's order
            window = np.empty((hi - lo, row_bytes), dtype=np.uint8)
            with open(window_path(partial, w), "rb") as src:
                for first in range(0, len(sources), READ_ROWS):
                    ids = sources[first:first + READ_ROWS]
                    block = np.frombuffer(src.read(len(ids) * row_bytes), dtype=np.uint8)
                    window[inv[ids] - lo] = block.reshape(len(ids), row_bytes)
            writer.write(window.data)
            last = w + 1 == windows
            if last:
                writer.write(bytes(-writer.size % PAGE))
            writer.sync()
            record(partial, ASSEMBLE, {"windows": w + 1, "rows": hi, "size": writer.size,
                                       "crc32": writer.crc, "done": int(last)})
            window_path(partial, w).unlink()
            notify("reorder", hi, n)
    return {"size": writer.size, "crc32": writer.crc}
