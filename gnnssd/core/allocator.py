"""How much freed memory the C allocator keeps: one fixed bound, set when features are opened.

A mini-batch allocates many arrays of a few MiB to tens of MiB (sampled hops, relabelled
IDs, aggregation outputs) in several threads. glibc's malloc serves a request above its mmap
threshold with its own mapping, returned at free, but raises that threshold to the size of
each such block freed, up to 32 MiB; from then on those arrays come from the heaps, whose
freed space stays in the process between mini-batches, split up and not returned.
Fixing the threshold (which also stops the raising) keeps them mapped: at papers scale it
lowered the peak RSS beyond the budget and the topology by ~0.5 GiB, in training and in
the evaluation (docs/BENCHMARKS.md, issue 35). A threshold the user set
(MALLOC_MMAP_THRESHOLD_) is kept.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os

log = logging.getLogger("gnnssd")

#: Requests of at least this many bytes get their own mapping, returned when freed.
MMAP_THRESHOLD = 8 << 20
#: mallopt's parameter number for the mmap threshold (malloc.h's M_MMAP_THRESHOLD).
M_MMAP_THRESHOLD = -3
#: The environment variable by which a user sets the threshold themselves (glibc's name).
USER_SETTING = "MALLOC_MMAP_THRESHOLD_"


@functools.cache
def bound_freed_memory() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD, once per process; whether this call set
    it (False: not glibc, or the user's own setting kept)."""
    if USER_SETTING in os.environ:
        log.debug("allocator: %s=%s kept (the user's setting)", USER_SETTING, os.environ[USER_SETTING])
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # the C library the process runs on
    if mallopt is None or not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        log.debug("allocator: no glibc mallopt here; its mmap threshold is left as it is")
        return False
    log.debug("allocator: glibc's mmap threshold fixed at %d MiB", MMAP_THRESHOLD >> 20)
    return True
