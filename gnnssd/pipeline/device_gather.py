"""x assembled on the device that consumes it (issue 46 item 2, issue 47 item 3).

HotCache.places says where each row of a mini-batch's x is; here the device reads each
level itself: the device slice by index_select in its own memory, the host cache by
index_select over the pinned host array in place (on a GPU a CUDA tensor over the same
pages: with unified virtual addressing a page-locked host page has one address on host and
device, so the GPU reads it across the bus and no CPU copies a cached byte), and only the
cold rows cross, gathered on the host into one contiguous pinned buffer, copied once and
scattered on the device. The same code runs with CPU tensors standing in for the device,
which is how its logic is tested without a GPU. Torch is imported here, not by the
pipeline's package (the CLI's store commands start without it).
"""
from __future__ import annotations

import numpy as np
import torch

from gnnssd.pipeline.hot_cache import COLD, DEVICE, HOST, HotCache, RowPlaces


class _PinnedArray:
    """A pinned host array announced as CUDA memory (__cuda_array_interface__), so that
    torch.as_tensor makes a CUDA tensor over its pages without a copy; it holds the array
    alive for as long as that tensor lives."""

    def __init__(self, array: np.ndarray):
        self.array = array
        self.__cuda_array_interface__ = {"shape": array.shape, "typestr": array.dtype.str,
                                         "data": (array.ctypes.data, False), "strides": None, "version": 2}


def host_rows_on(hot: HotCache, device: torch.device) -> torch.Tensor:
    """The host cache's rows as a tensor `device` can index_select: on a GPU a CUDA tensor
    over the pinned host pages (read over the bus, nothing copied), on the CPU the host
    array itself. Made once per device and kept."""
    views = hot.__dict__.setdefault("_device_views", {})
    if device not in views:
        if device.type == "cuda":
            if not torch.from_numpy(hot.data).is_pinned():
                raise ValueError("the host cache is not pinned: a GPU cannot read it in place")
            with torch.cuda.device(device):
                views[device] = torch.as_tensor(_PinnedArray(hot.data), device=device)
        else:
            views[device] = torch.from_numpy(hot.data)
    return views[device]


def gather_on_device(places: RowPlaces, hot: HotCache, cold: np.ndarray, out: torch.Tensor) -> torch.Tensor:
    """x's rows into `out` (a tensor on the consuming device, in the stored dtype), read
    where `places` says: the device slice's rows there, the host cache's read in place,
    the cold rows from `cold`: the mega-batch buffer's rows of places.of(COLD), which the
    caller gathered on the host into one contiguous array (pinned for a GPU) that crosses
    here once. Copies are asynchronous on a GPU: `cold` is reusable once they are done."""
    device = out.device

    def on_device(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(device, non_blocking=True)

    rows_of = {DEVICE: lambda slots: hot.device_data.index_select(0, on_device(slots)),
               HOST: lambda slots: host_rows_on(hot, device).index_select(0, on_device(slots)),
               COLD: lambda slots: on_device(cold)}
    for level, read in rows_of.items():
        at, slots = places.of(level)
        if len(at):
            out.index_copy_(0, on_device(at), read(slots))
    return out
