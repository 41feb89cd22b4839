"""The steps of preprocess: each timed (wall and CPU seconds, peak RSS, bytes written) for
the manifest's `preprocess_steps`, and the memory a step may still take under --memory-limit."""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

import psutil

log = logging.getLogger(__name__)

#: Memory preprocess needs besides its arrays (interpreter, libraries, edge chunks in flight).
RUNTIME_BYTES = 512 << 20
#: The default --memory-limit: this fraction of the memory available when preprocess starts.
DEFAULT_MEMORY_FRACTION = 0.5


@contextmanager
def _step(steps: dict[str, dict[str, float]], name: str) -> Iterator[None]:
    """Time one step of preprocess: wall and CPU seconds, peak RSS (the kernel's high-water
    mark, reset at the step's start where /proc allows), bytes written to storage."""
    _reset_peak_rss()
    wall, cpu, written = time.perf_counter(), time.process_time(), _bytes_written()
    yield
    steps[name] = {"wall_s": round(time.perf_counter() - wall, 2),
                   "cpu_s": round(time.process_time() - cpu, 2),
                   "peak_rss_bytes": _peak_rss(), "written_bytes": _bytes_written() - written}
    log.info("step %s: %.1f s wall, %.1f s CPU, %.2f GiB peak RSS", name, steps[name]["wall_s"],
             steps[name]["cpu_s"], steps[name]["peak_rss_bytes"] / 2**30)


def _reset_peak_rss() -> None:
    with suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_rss() -> int:
    with suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _bytes_written() -> int:
    with suppress(OSError):
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def default_memory_limit() -> int:
    return int(psutil.virtual_memory().available * DEFAULT_MEMORY_FRACTION)


def spare_memory(limit: int) -> int:
    """What `limit` leaves beside this process's resident memory now (its arrays, the
    source's tables, the interpreter): what a step may still take."""
    return max(limit - psutil.Process().memory_info().rss, 0)
