"""The allocator bound (gnnssd.core.allocator): a freed 16 MiB array leaves the process
when the bound is set, and stays in glibc's heap when it is not; a user's own setting wins.
Each case runs in a fresh interpreter (the setting is process-wide, once per process)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from gnnssd.datasets import synthetic_source
from gnnssd.storage_format import write_store

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc, /proc/self/statm")

# Allocates, touches and frees a 16 MiB array three times, then prints what `bound_freed_memory`
# returned and how many MiB the process's RSS kept: glibc serves the first from a mapping and
# then raises its threshold, so by default the later ones come from the heap and stay there.
PROBE = textwrap.dedent("""
    import sys
    import numpy as np
    from gnnssd.core import bound_freed_memory
    chosen = bound_freed_memory() if sys.argv[1] == "bound" else None
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    before = rss()
    for _ in range(3):
        array = np.ones(16 << 20, np.uint8)
        del array
    print(chosen, (rss() - before) >> 20)
""")


def probe(mode: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"} | env
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=environ, check=True)
    chosen, kept = out.stdout.split()
    return chosen, int(kept)


def test_without_the_bound_glibc_keeps_a_freed_16_mib_array_in_the_heap():
    chosen, kept = probe("default")
    assert chosen == "None"
    assert kept >= 15


def test_the_bound_returns_freed_arrays_above_it_to_the_system():
    chosen, kept = probe("bound")
    assert chosen == "True"
    assert kept <= 1


def test_a_threshold_the_user_set_is_kept():
    # above the array, and no trimming: the heap keeps it (the bound would have mapped it)
    chosen, kept = probe("bound", MALLOC_MMAP_THRESHOLD_=str(64 << 20), MALLOC_TRIM_THRESHOLD_=str(128 << 20))
    assert chosen == "False"
    assert kept >= 15


def test_opening_features_sets_the_bound(tmp_path):
    store = write_store(tmp_path / "tiny", synthetic_source("tiny"))
    code = ("import sys; from gnnssd.loading import FeatureSource; from gnnssd.core import bound_freed_memory;"
            "FeatureSource(sys.argv[1], 'memory', device='cpu').close(); print(bound_freed_memory.cache_info().currsize)")
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True,
                         env=environ, check=True)
    assert out.stdout.split()[-1] == "1"
