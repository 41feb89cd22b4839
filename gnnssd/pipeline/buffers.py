"""Execute mega-batch plans: fill the mega-batch buffer from disk, gather mini-batch inputs.

Memory is the hot cache plus BUFFERS mega-batch buffers (the one being trained on and the
one being filled, which also lets carried rows be copied from the previous buffer) plus a
bounded staging area for page reads. The read stage that fills them must run at most
BUFFERS plans ahead of the caller (PlanWorker depth BUFFERS), and the memory budget
(gnnssd.core.budget) counts BUFFERS buffers: the count is this one constant.
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numba as nb
import numpy as np

from gnnssd.io_engine import copy_rows, gather_rows
from gnnssd.pipeline.hot_cache import COLD, DEVICE, HOST, NO_ROWS, HotCache, RowPlaces, pinned_empty
from gnnssd.pipeline.prefault import populate_in_background
from gnnssd.pipeline.repack import block_path
from gnnssd.sampler import MegaBatchPlan, Strategy

if TYPE_CHECKING:
    import torch

BUFFERS = 2  # mega-batch buffers: the one gathered from and the one being filled


@nb.njit(cache=True, nogil=True, inline="always")
def _widened(half):
    """The float32 bits of the float16 whose bits are `half` (exact: every float16 is a
    float32), subnormals normalised, infinities and NaNs kept."""
    h = np.uint32(half)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    exponent = (h >> np.uint32(10)) & np.uint32(0x1F)
    mantissa = h & np.uint32(0x3FF)
    if exponent == 0x1F:
        return np.uint32(sign | np.uint32(0x7F800000) | (mantissa << np.uint32(13)))
    if exponent == 0:
        if mantissa == 0:
            return np.uint32(sign)
        biased = np.uint32(113)  # 127 - 14: the float32 exponent of 2^-14, less one per shift
        while mantissa & np.uint32(0x400) == 0:
            mantissa <<= np.uint32(1)
            biased -= np.uint32(1)
        return np.uint32(sign | (biased << np.uint32(23)) | ((mantissa & np.uint32(0x3FF)) << np.uint32(13)))
    return np.uint32(sign | ((exponent + np.uint32(112)) << np.uint32(23)) | (mantissa << np.uint32(13)))


@nb.njit(cache=True, nogil=True, parallel=True)
def _gather_widened(device, host, buffer, level, slot, at, out):
    """out[at[k]] = (device, host, buffer)[level[k]][slot[k]] (a RowPlaces' levels; out[k]
    when `at` is empty; other rows of out left as they are: a piece plan fills only its
    own) for float16 rows (as uint16) into float32 rows (as uint32), each value widened on
    the way: the model's float32 x in one pass, no float16 copy of it. Rows in the stored
    dtype are gathered by io_engine.gather_rows."""
    width = out.shape[1]
    in_order = at.shape[0] == 0
    for k in nb.prange(slot.shape[0]):
        p = np.int64(k) if in_order else at[k]
        s, lv = slot[k], level[k]
        row = device[s] if lv == DEVICE else host[s] if lv == HOST else buffer[s]
        for j in range(width):
            out[p, j] = _widened(row[j])


def x_dtype(dtype: np.dtype, widen: bool) -> np.dtype:
    """x as the consumer takes it: float16 rows widened to float32 by the gather unless
    `widen` is False; other dtypes as stored."""
    return np.dtype(np.float32) if dtype == np.float16 and widen else np.dtype(dtype)


def x_pool_bytes(rows: int, feat_dim: int, dtype: np.dtype, pinned: bool) -> int:
    """What the x pool (Recycler) keeps for mini-batches of `rows` input rows: what the
    ssd loader counts in its memory budget."""
    return Recycler.kept(pinned) * Recycler.array_bytes(rows * feat_dim * np.dtype(dtype).itemsize)


class Recycler:
    """Memory for the mini-batches' x, reused once its consumer is done with it: a fresh
    array's pages each fault on first touch, which costs more than the gather that fills
    them (several times more on a virtual machine whose host took the freed pages back),
    and pinning fresh memory for a GPU copy costs a copy and a page-locking call per
    mini-batch. Keeps at most `keep` arrays (by default `kept(pinned)`: the x in use, the
    one being gathered, and with a GPU the one being copied); beyond that, arrays are new
    and not kept, so an x the consumer still holds is never overwritten, however many it
    holds.

    An array is free again once (1) nothing references it but this pool (every NumPy view
    of an x, and a tensor made from one by torch.from_numpy, holds a reference to its raw
    array) and (2) the event handed to `release_after` for it, if any, has completed: an
    x copied to a GPU with non_blocking=True is released after the copy's CUDA event, since
    dropping the host tensor does not wait for the copy. With `pinned`, the arrays are
    page-locked (torch's pinned allocator; needs CUDA) so such copies are asynchronous."""

    @staticmethod
    def kept(pinned: bool) -> int:
        """Arrays kept: the x in use, the one being gathered, and pinned, the one being copied."""
        return 3 if pinned else 2

    @staticmethod
    def array_bytes(nbytes: int) -> int:
        """A new array's size for an x of `nbytes`: room for a slightly larger mini-batch."""
        return nbytes + nbytes // 8

    def __init__(self, keep: int | None = None, pinned: bool = False):
        self.keep, self.pinned = self.kept(pinned) if keep is None else keep, pinned
        self._arrays: list[np.ndarray] = []  # flat uint8; the x handed out are views of them
        self._events: list[Any] = []  # per array: the copy to wait for before reuse (or None)
        # what getrefcount says of an array that only such a list holds (interpreters differ)
        probe = [np.empty(0, np.uint8)]
        self._unused_refs = sys.getrefcount(probe[0])

    def _alloc(self, nbytes: int) -> np.ndarray:
        return pinned_empty(nbytes) if self.pinned else np.empty(nbytes, np.uint8)

    def reserve(self, nbytes: int) -> np.ndarray | None:
        """The first array, allocated now for an x of up to `nbytes`, so its pages can be
        faulted in before the first mini-batch's gather writes them (pipeline.prefault);
        None if the pool has one already. One only: a consumer that lets each x go before
        it asks for the next (the Trainer) never needs a second."""
        if self._arrays:
            return None
        self._arrays.append(self._alloc(self.array_bytes(nbytes)))
        self._events.append(None)
        return self._arrays[0]

    def _free(self, k: int) -> bool:
        if sys.getrefcount(self._arrays[k]) != self._unused_refs:
            return False
        event = self._events[k]
        if event is not None:
            if not event.query():
                return False
            self._events[k] = None
        return True

    def take(self, rows: int, feat_dim: int, dtype: np.dtype) -> np.ndarray:
        """An uninitialised (rows, feat_dim) array of `dtype`."""
        nbytes = rows * feat_dim * np.dtype(dtype).itemsize
        for k in range(len(self._arrays)):
            if self._free(k):
                # a larger mini-batch: replaced, with room; one of less than half its size
                # (training after an evaluation's larger batches): replaced by a smaller one
                if not nbytes <= len(self._arrays[k]) <= 2 * self.array_bytes(nbytes):
                    self._arrays[k] = self._alloc(self.array_bytes(nbytes))
                return self._arrays[k][:nbytes].view(dtype).reshape(rows, feat_dim)
        raw = self._alloc(self.array_bytes(nbytes))
        if len(self._arrays) < self.keep:
            self._arrays.append(raw)
            self._events.append(None)
        return raw[:nbytes].view(dtype).reshape(rows, feat_dim)

    def release_after(self, x: np.ndarray, event: Any) -> None:
        """Keep the memory of `x` (an array `take` gave, or a view of one) from reuse until
        `event` (a torch.cuda.Event recorded after the copy that reads x, or anything with
        `query()`: True once done) has completed, even once nothing references x."""
        for k, raw in enumerate(self._arrays):
            if np.shares_memory(x, raw):
                self._events[k] = event
                return


class MegaBatchBuffers:
    """Double-buffered mega-batch buffers behind the hot cache, filled from the features
    file it wraps (its fallback, a FeatureFile); the input rows of mini-batch i are
    [hot members | buffer][gather[i]], each found where HotCache.places says.

    x is gathered on the host (`device` None) into arrays from `outputs`, a Recycler
    (pinned with `pinned`, for copies to a GPU); float16 rows are widened to float32 by the
    gather unless `widen` is False: then x stays float16 (half the bytes to gather, pin and
    copy) and its consumer widens it (on the GPU). With a `device`, x is assembled there in
    the stored dtype (pipeline.device_gather): the device reads the cached rows itself and
    only the cold rows cross, gathered on the host into a contiguous array from `outputs`."""

    def __init__(self, hot: HotCache, capacity_rows: int, pinned: bool = False, widen: bool = True,
                 device: torch.device | None = None):
        self.hot = hot
        self.source = source = hot.fallback
        self.dtype, self.feat_dim, self.row_bytes = source.dtype, source.feat_dim, source.row_bytes
        self.capacity = capacity_rows
        self._bufs = [source.io.alloc(capacity_rows * self.row_bytes) for _ in range(BUFFERS)]
        self.outputs = Recycler(pinned=pinned)
        self.device = device
        #: x rows served so far from each level (RowPlaces.counts' keys)
        self.level_rows: Counter[str] = Counter()
        self.x_dtype = x_dtype(self.dtype, widen)
        self._cur = 1
        if hot.device_data is not None and device is None and hot.device_data.device.type != "cpu":
            raise ValueError(f"the hot cache's device slice is on {hot.device_data.device}: a host gather "
                             "cannot read it; gather on that device")

    def prefault(self, x_rows: int) -> None:
        """The buffers' pages, and with a host gather into unpinned memory those of the first
        x array for mini-batches of up to `x_rows` input rows, faulted in by a thread of their
        own (pipeline.prefault): not in the first mini-batch's reads and gather. A pinned x
        array is resident once allocated."""
        arrays = list(self._bufs)
        if self.device is None and not self.outputs.pinned:
            x = self.outputs.reserve(x_rows * self.feat_dim * self.x_dtype.itemsize)
            arrays += [] if x is None else [x]
        populate_in_background(arrays)

    def _rows_view(self, k: int) -> np.ndarray:
        return self._bufs[k][: self.capacity * self.row_bytes].view(np.uint8).reshape(self.capacity, self.row_bytes)

    def load(self, plan: MegaBatchPlan, block_dir: Path | None = None) -> np.ndarray:
        """Fill the next buffer for `plan` (previous plan's buffer stays intact); returns its
        rows. A block plan's file is in `block_dir`."""
        if len(plan.rows) > self.capacity:
            raise ValueError(f"mega-batch needs {len(plan.rows)} buffer rows, capacity is {self.capacity}")
        nxt = (self._cur + 1) % BUFFERS
        out, prev = self._rows_view(nxt), self._rows_view(self._cur)
        read = plan.read
        if read is not None and read.strategy is Strategy.BLOCK:
            io = self.source.io
            f = io.open(block_path(plan, block_dir))
            try:
                io.read_extents(f, read.offsets, read.lengths, self._bufs[nxt], read.offsets)
            finally:
                io.close(f)
        else:
            self.source.read_into(plan.read_rows, out, None if read is None else (read.offsets, read.lengths))
        copy_rows(prev.reshape(-1), plan.carry_src * self.row_bytes, self.row_bytes,
                  out[plan.num_read : len(plan.rows)])
        self._cur = nxt
        return out[: len(plan.rows)].view(self.dtype)

    def take_x(self, rows: int) -> np.ndarray | torch.Tensor:
        """An uninitialised x of `rows` rows: on the host from the recycled ones (x_dtype),
        or on `device` in the stored dtype."""
        if self.device is None:
            return self.outputs.take(rows, self.feat_dim, self.x_dtype)
        import torch

        return torch.empty((rows, self.feat_dim), dtype=torch.from_numpy(np.empty(0, self.dtype)).dtype,
                           device=self.device)

    def gather(self, plan: MegaBatchPlan, i: int, buffer: np.ndarray,
               out: np.ndarray | torch.Tensor | None = None) -> np.ndarray | torch.Tensor:
        """Input features of mini-batch i of `plan`, in block source order, into `out` (a
        new x of take_x by default), its rows counted by level in `level_rows`; a piece
        plan fills only its own rows (plan.positions) of `out`, the x its mini-batch's
        pieces assemble (given: piece 0's stats["input_rows"] rows).

        `buffer` is what `load(plan)` returned: explicit, because the next plan may be
        loading into the other buffer while this one is gathered from.
        """
        idx = plan.gather[i]
        if plan.num_hot != len(self.hot):
            raise ValueError(f"the plan indexes {plan.num_hot} hot rows, the hot cache holds {len(self.hot)}")
        places = self.hot.places(idx, plan.positions if plan.pieces else NO_ROWS)
        if out is None:
            if plan.pieces:
                raise ValueError("a piece plan fills part of an x: pass the x its pieces assemble as `out`")
            out = self.take_x(len(idx))
        self.level_rows.update(places.counts())
        if self.device is not None:
            return self._gather_on_device(places, buffer, out)
        device = self.hot.data[:0] if self.hot.device_data is None else self.hot.device_data.numpy()
        self._copy_rows(places, (device, self.hot.data, buffer), out, widen=self.x_dtype != self.dtype)
        return out

    @staticmethod
    def _copy_rows(places: RowPlaces, sources: tuple[np.ndarray, np.ndarray, np.ndarray], out: np.ndarray,
                   widen: bool) -> None:
        """The host gather: out's rows from the arrays of the levels `places` names (device
        slice, host cache, mega-batch buffer: a slice on the CPU is read here too), in one
        pass on this thread's numba thread count (the loader's ssd.threads); float16 widened
        to float32 with `widen`."""
        if widen:
            _gather_widened(*(a.view(np.uint16) for a in sources), places.level, places.slot, places.at,
                            out.view(np.uint32))
            return
        gather_rows(sources, places.level, places.slot, places.at, out, nb.get_num_threads())

    def _gather_on_device(self, places: RowPlaces, buffer: np.ndarray, out: torch.Tensor) -> torch.Tensor:
        """pipeline.device_gather's assembly, the cold rows gathered into one contiguous
        recycled (pinned) array first; on a GPU that array is reused once its copy is done."""
        from gnnssd.pipeline.device_gather import gather_on_device

        cold_rows = places.of(COLD)[1]
        cold = self.outputs.take(len(cold_rows), self.feat_dim, self.dtype)
        no_rows = self.hot.data[:0]  # the cold rows are all in the buffer; the slice may be in GPU memory
        self._copy_rows(RowPlaces(NO_ROWS, np.full(len(cold_rows), COLD, np.int8), cold_rows),
                        (no_rows, no_rows, buffer), cold, widen=False)
        gather_on_device(places, self.hot, cold, out)
        if out.device.type == "cuda":
            import torch

            copied = torch.cuda.Event()
            copied.record()
            self.outputs.release_after(cold, copied)
        return out
