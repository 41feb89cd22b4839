"""Packers: planning and repacking of whole windows off the training path, on the cores
beside the trainer (`ssd.packers`).

A window is a run of consecutive mini-batches. Window k goes to packer k mod N, a process
of its own: it samples and plans the window's mini-batches (a Planner of its own: the
window's first plan carries nothing from the previous window's buffer; neighbour draws
depend on a mini-batch's position only, so the samples are those of one planner), spills
every plan to the window's folder, chooses and writes the compact blocks, and hands back
the plans as stubs. The consuming side only reads the packed bytes, verifies their
checksums and assembles x. Processes, not threads: planning's Python glue holds the GIL for
most of its time (measured: docs/BENCHMARKS.md, issue 46), so threads would not run side by side.
Inside a packer, two threads: one plans the next window while the other scans the current
one (a scan waits mostly on the drive and on room; a plan mostly computes), so a packer holds
PACKER_WINDOWS windows at once.

Windows run ahead of training: at most `ahead` windows are given out beyond the one being
read, and the packers plan them side by side; each window's blocks are within half the
block budget, whatever the number of packers (a share of 1/(N + 1) left the windows of 2
packers too few blocks to pay for their scans: docs/BENCHMARKS.md, issue 46, third round).
The disk holds the budget because a window writes its blocks only once given room: window k
once the consumer asks for window k - 1 (whose blocks, and no other window's, are on disk
then: each plan's block is deleted as it is loaded); a packer whose window chose blocks waits
for that, planning its next window meanwhile. Each packer's first window is small
(window_bounds): packed bytes come early.
A packer that dies (killed, out of memory) is an error naming it and its window, raised in
the consumer within POLL_S: nothing waits on it. Packers ignore Ctrl-C (the trainer stops
them) and are ended when the pool closes; the caller removes the scratch folder after.
"""
from __future__ import annotations

import json
import mmap
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from multiprocessing.connection import Connection
from typing import Callable, Iterator

import numpy as np

from gnnssd.pipeline.direct_io import DirectIO
from gnnssd.pipeline.repack import RepackReport, repack_window
from gnnssd.pipeline.worker import POLL_S, check_stop, numba_threads, stops_with
from gnnssd.sampler import CostModel, HotRows, MegaBatchPlan, PlanConfig, Planner, Scan, choose_window, pages_plan
from gnnssd.storage_format import Store, write_error, writable_file


#: Mini-batches of each packer's first window, and of the trainer's own window beyond the
#: point where the first packer has started (what the packer takes to pack that first window):
#: packed bytes come early. A first window sized for a block share held 12 mini-batches of
#: `large` at 12%, read at ~7 bytes per useful byte (docs/BENCHMARKS.md, issue 46, fourth round).
FIRST_WINDOW = 2
#: The trainer's own window at most, in mini-batches (its page reads cover the packers' start;
#: where a packer takes longer than that to start, the trainer waits for it). A stream of no
#: more mini-batches than this is the trainer's alone: no packer starts (its start, scan and
#: writes came after the trainer could have read them all in place: docs/BENCHMARKS.md,
#: issue 46, ninth round).
OWN_WINDOW_MOST = 4 * FIRST_WINDOW


def window_bounds(count: int, full: int, packers: int) -> list[tuple[int, int]]:
    """[lo, hi) of each packer window of `count` mini-batches, in order: each packer's first
    of FIRST_WINDOW (packed bytes arrive early), every later one `full` (the mini-batches whose
    cold rows fill a window's blocks: a window's scan reads most of the features file, so
    windows between the two paid for theirs less often: none did in the packers' tests)."""
    if full < 1 or packers < 1:
        raise ValueError(f"window_bounds: full {full}, packers {packers}; expected both at least 1")
    bounds: list[tuple[int, int]] = []
    lo = 0
    while lo < count:
        size = min(full, FIRST_WINDOW) if len(bounds) < packers else full
        bounds.append((lo, min(count, lo + size)))
        lo += size
    return bounds


def default_packers() -> int:
    """The cores left beside the trainer (the process's CPUs less one), at least 1."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


@dataclass(frozen=True)
class PackerSpec:
    """What every packer needs, sent once when it starts (picklable: no mapped arrays)."""

    store_path: str
    plan: PlanConfig
    hot: HotRows
    max_rows: int
    max_bytes: int
    cost_model: CostModel
    #: Blocks of one window at most (half the block budget: see the module's docstring).
    window_block_bytes: int
    staging_bytes: int
    writer_bytes: int
    queue_depth: int
    io_backend: str
    verify_checksums: bool
    numba_threads: int
    #: NeighborSampler's options beside the store's edge types (which the packer maps itself).
    sampler_options: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class WindowWork:
    """One window: the seed batches of mini-batches first .. first+len(batches)-1 of an epoch."""

    window: int
    epoch: int
    first: int
    batches: list[np.ndarray]
    exclude: list[np.ndarray] | None
    directory: Path


NO_ROWS = np.empty(0, np.int64)


class RowsFile:
    """Rows (int64) appended to a file of a window's folder, then read back as one
    read-only mapping of it: what a waiting window keeps of its rows is the kernel's page
    cache (clean once written back, dropped under pressure), not the packer's memory."""

    def __init__(self, path: Path):
        self.path, self._count = path, 0
        self._file = writable_file(path, path.parent)  # never through a planted link

    def add(self, rows: np.ndarray) -> None:
        try:
            self._file.write(memoryview(np.ascontiguousarray(rows, np.int64)).cast("B"))
        except OSError as exc:  # a full scratch disk names the file and the disk
            raise write_error(self.path, exc) from None
        self._count += len(rows)

    def mapped(self) -> np.ndarray:
        """Every row added, in order."""
        try:
            self._file.flush()
        except OSError as exc:
            raise write_error(self.path, exc) from None
        if not self._count:
            return NO_ROWS
        return np.frombuffer(mmap.mmap(self._file.fileno(), self._count * 8, access=mmap.ACCESS_READ), np.int64)

    def __enter__(self) -> RowsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()  # a mapping outlives its file's descriptor


def rows_mapped(path: Path, count: int) -> np.ndarray:
    """A new file of `count` int64 rows in a window's folder, its disk space allocated (a
    full scratch disk fails here, naming the file and the disk, not as a SIGBUS when the
    mapping is written), as a writable mapping: a window's scan rows are written into it
    (readplan.sorted_union), not into the packer's memory."""
    with writable_file(path, path.parent) as f:  # never through a planted link
        try:
            os.posix_fallocate(f.fileno(), 0, count * 8)
        except OSError as exc:
            raise write_error(path, exc) from None
        return np.frombuffer(mmap.mmap(f.fileno(), count * 8), np.int64)


class Packer:
    """Plans and repacks windows (in a packer process, or in the probe that measures one)."""

    def __init__(self, spec: PackerSpec):
        self.spec = spec
        self.store = store = Store.open(spec.store_path)
        options = {**spec.sampler_options, "etypes": store.etypes}
        self._planner_args = (store.indptr, store.indices, spec.plan, spec.hot)
        self._planner_options = {"max_rows": spec.max_rows, "max_bytes": spec.max_bytes, **options}
        self.io = DirectIO(queue_depth=spec.queue_depth, backend=spec.io_backend,
                           checksums={store.features_path: store.page_checksums()} if spec.verify_checksums else None)

    def plan(self, work: WindowWork) -> tuple[list[MegaBatchPlan], Scan, np.ndarray]:
        """The window's plans, spilled to work.directory (stubs); its scan: the best blocks
        within the window's share (the rest read as pages); and the array the stubs' read
        rows are views of. Those rows and the scan's are files of the window's folder,
        mapped (RowsFile, rows_mapped): a packer's own memory holds the bitset the scan's
        rows are found in, whatever the window's size."""
        spec, store = self.spec, self.store
        work.directory.mkdir(parents=True, exist_ok=True)
        planner = Planner(*self._planner_args, **self._planner_options)
        stubs = []
        with RowsFile(work.directory / "rows.bin") as lists:
            for plan in planner.plan_batches(work.batches, work.epoch, work.exclude, work.first):
                check_stop()
                plan.read = pages_plan(plan.read_rows, store.row_bytes, spec.cost_model)
                if not plan.ends_minibatch:
                    plan = replace(plan, minibatches=[])  # only the last piece yields the mini-batch
                lists.add(plan.read_rows)
                stub = plan.spill(work.directory / f"plan_e{plan.epoch}_m{plan.index}.spill")
                stubs.append(replace(stub, rows=NO_ROWS, carry_src=NO_ROWS))
                del plan, stub
            rows = lists.mapped()
        at = np.cumsum([0] + [stub.num_read for stub in stubs])
        stubs = [replace(stub, rows=rows[lo:hi]) for stub, lo, hi in zip(stubs, at[:-1], at[1:])]
        scan = choose_window(stubs, store.row_bytes, spec.cost_model, spec.window_block_bytes,
                             union_into=lambda count: rows_mapped(work.directory / "scan.bin", count))
        return stubs, scan, rows

    def repack(self, work: WindowWork, stubs: list[MegaBatchPlan], scan: Scan, rows: np.ndarray
               ) -> tuple[list[MegaBatchPlan], list[RepackReport]]:
        """The window's blocks written in one scan (`rows`: what the stubs' read rows are
        views of); its stubs as they cross to the consumer, and what repacking cost."""
        store = self.store
        report = repack_window(self.io, store.features_path, store.row_bytes, stubs, scan, work.directory,
                               self.spec.staging_bytes, self.spec.writer_bytes, rows)
        # the spill file has them: the stub crosses as little as it can
        return [replace(p, rows=NO_ROWS, carry_src=NO_ROWS) for p in stubs], [report]

    def close(self) -> None:
        self.io.shutdown()


#: The packer process's program: the parent's import path, then `serve` on the inherited socket.
_PROGRAM = ("import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
            "from gnnssd.pipeline.packers import serve; serve(int(sys.argv[1]))")


class _Told(Exception):
    """The pool told the packer to stop (or is gone)."""


class _Inbox:
    """A packer's side of the socket, read by a thread of its own: windows queue for the
    planner, ("room", window) messages are kept until a window's scan asks for them, and
    None (or the pool gone) tells every wait to stop."""

    def __init__(self, conn: Connection):
        self._conn = conn
        self.works: queue.Queue[WindowWork | None] = queue.Queue()
        self._rooms: set[int] = set()
        self._changed = threading.Condition()
        self.told = threading.Event()  # check_stop's flag in the planning thread
        threading.Thread(target=self._receive, daemon=True, name="gnnssd-packer-inbox").start()

    def _receive(self) -> None:
        try:
            while (message := self._conn.recv()) is not None:
                if isinstance(message, tuple):
                    with self._changed:
                        self._rooms.add(message[1])
                        self._changed.notify_all()
                else:
                    self.works.put(message)
        except (EOFError, ConnectionError, OSError):
            pass
        with self._changed:
            self.told.set()
            self._changed.notify_all()
        self.works.put(None)

    def room(self, window: int) -> None:
        """Return once `window` may write its blocks; _Told if told to stop first."""
        with self._changed:
            while window not in self._rooms and not self.told.is_set():
                self._changed.wait()
            if window not in self._rooms:
                raise _Told
            self._rooms.discard(window)


def _failure(exc: BaseException) -> tuple[str, str, str]:
    return "error", f"{type(exc).__name__}: {exc}", traceback.format_exc()


#: Windows a packer holds at once: the one it scans (or whose room it waits for) and the next,
#: planned meanwhile (their rows wait in mapped files, RowsFile: ssd.memory_budget counts the
#: bitset the one being planned finds its scan rows in).
PACKER_WINDOWS = 2


def _free_slot(slots: threading.Semaphore, told: threading.Event) -> bool:
    """Take one of `slots` once free; False if told to stop first."""
    while not slots.acquire(timeout=POLL_S):
        if told.is_set():
            return False
    return True


def _plan_ahead(packer: Packer, inbox: _Inbox, planned: queue.Queue, slots: threading.Semaphore) -> None:
    """The packer's planning thread: each window's stubs and scan (or its error) in order,
    a window begun only once one of PACKER_WINDOWS `slots` is free (the scan releases it);
    None at the end, or once told to stop."""
    numba_threads(packer.spec.numba_threads)
    with stops_with(inbox.told):  # a plan in progress stops at its next check_stop once told
        while (work := inbox.works.get()) is not None and _free_slot(slots, inbox.told):
            try:
                planned.put(("ok", work, *packer.plan(work)))
            except Exception as exc:  # the window's error, raised in the consumer
                planned.put(_failure(exc))
    planned.put(None)


def serve(fd: int) -> None:
    """A packer process: its PackerSpec, then windows in and (stubs, reports) or the error's
    text out over the socket `fd`, until told to stop or the pool is gone; ("room", window)
    lets a window write its blocks. Once ready it says ("started", its process ID, the CPU
    seconds its start took: interpreter, imports, store).

    A thread plans the next window while this one scans the current (a window's scan is
    mostly waiting on the drive and the pool's room; planning is mostly CPU: one packer
    serially did both, and the trainer waited on it: docs/BENCHMARKS.md, issue 46)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer's Ctrl-C is the trainer's to handle
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    conn = Connection(fd)
    packer = None
    try:
        spec = conn.recv()
        if spec is None:  # closed before its first window
            return
        numba_threads(spec.numba_threads)
        packer = Packer(spec)
        conn.send(("started", os.getpid(), time.process_time()))
        inbox = _Inbox(conn)
        planned: queue.Queue = queue.Queue()
        slots = threading.Semaphore(PACKER_WINDOWS)
        threading.Thread(target=_plan_ahead, args=(packer, inbox, planned, slots), daemon=True,
                         name="gnnssd-packer-plan").start()
        while (item := planned.get()) is not None and not inbox.told.is_set():
            if item[0] == "ok":
                _, work, stubs, scan, rows = item
                del item
                try:
                    if len(scan.rows):
                        inbox.room(work.window)
                    item = ("ok", packer.repack(work, stubs, scan, rows))
                except _Told:
                    raise
                except Exception as exc:  # the window's error, raised in the consumer
                    item = _failure(exc)
                del stubs, scan, rows
            conn.send(item)
            slots.release()
    except (EOFError, ConnectionError, _Told):  # the pool is gone, or told to stop
        return
    except Exception as exc:
        conn.send(_failure(exc))
    finally:
        if packer is not None:
            packer.close()
        conn.close()


class PackerError(RuntimeError):
    """A packer failed or died; the message names it and its window."""


class PackerPool:
    """`count` packer processes, started at once, packing the windows `assign` gives them (in
    window order) ahead of the consumer; `ready()` says whether the first has started.

    Iterate `windows()` for (stubs, folder) of each window in order; `close()` ends the
    packers (whatever they are doing) and removes nothing: the caller owns the folders."""

    def __init__(self, spec: PackerSpec, count: int, ahead: int,
                 report: Callable[[RepackReport], None] | None = None,
                 started: Callable[[int, float], None] | None = None):
        """`report` hears each window's repack costs as its stubs arrive; `started` each
        packer's process ID and the CPU seconds its start took, when next waited for."""
        if count < 1:
            raise ValueError(f"ssd.packers: {count}; expected at least 1")
        self.works: list[WindowWork] = []
        self.ahead, self._report, self._started = max(1, ahead), report, started
        self._assigned = threading.Event()  # the works are known (or the pool is closing)
        self._closing = False
        self._early: dict[int, tuple | None] = {}  # a reply ready() read that was not "started"
        self._procs: list[subprocess.Popen] = []
        self._conns: list[Connection] = []
        self._spec, self._given, self._roomed = spec, 0, 0
        self._sending = threading.Lock()  # one sender at a time on the packers' sockets
        self._starter: threading.Thread | None = None
        # A fresh interpreter each (fork is unsafe beside OpenMP and the engine's threads;
        # multiprocessing's spawn would run the user's main script again). SIGINT blocked
        # while they start (the mask crosses exec): a Ctrl-C during a packer's imports is the
        # trainer's; the packer ignores it once running.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for _ in range(count):
                ours, theirs = socket.socketpair()
                try:
                    proc = subprocess.Popen([sys.executable, "-c", _PROGRAM, str(theirs.fileno()), json.dumps(sys.path)],
                                            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
                finally:
                    theirs.close()
                self._procs.append(proc)
                self._conns.append(Connection(ours.detach()))
        except BaseException:
            self.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        # The specs and the first windows go out from a thread of their own: the spec is larger
        # than a socket's buffer (the hot rows' bitset), so its send waits for the packer's
        # imports (~3 s), which the caller (handing out the first mini-batch) waited for
        self._starter = threading.Thread(target=self._start, daemon=True, name="gnnssd-packers-start")
        self._starter.start()

    @property
    def count(self) -> int:
        return len(self._procs)

    def _start(self) -> None:
        """Every packer's spec; once assigned, the first windows and room for the first two
        (no packer's blocks are on disk yet)."""
        with self._sending:
            for conn in self._conns:
                try:
                    conn.send(self._spec)
                except OSError:  # the packer is gone: waiting for its window says so (_result)
                    pass
        self._assigned.wait()
        if self._closing:
            return
        self._give(1 + self.ahead)
        self._make_room(2)

    def assign(self, works: list[WindowWork]) -> None:
        """The windows to pack, in order (once; the starter hands out the first ones)."""
        self.works = works
        self._assigned.set()

    def ready(self) -> bool:
        """Whether the first packer has started (or failed: waiting for its window says so)."""
        if 0 in self._early:
            return True
        try:
            if not self._conns[0].poll(0):
                return False
            reply = self._conns[0].recv()
        except (EOFError, ConnectionError, OSError):
            reply = None
        if reply is not None and reply[0] == "started":
            if self._started is not None:
                self._started(*reply[1:])
            return True
        self._early[0] = reply
        return True

    def _give(self, upto: int) -> None:
        """Hand out the windows before `upto` not yet given."""
        with self._sending:
            while self._given < min(upto, len(self.works)):
                k = self._given
                try:
                    self._conns[k % self.count].send(self.works[k])
                except OSError:  # the packer is gone: waiting for this window says so (_result)
                    pass
                self._given += 1

    def _make_room(self, upto: int) -> None:
        """Room to write blocks for the windows before `upto` (after they are given out)."""
        with self._sending:
            while self._roomed < min(upto, self._given):
                k = self._roomed
                try:
                    self._conns[k % self.count].send(("room", self.works[k].window))
                except OSError:  # the packer is gone: waiting for this window says so (_result)
                    pass
                self._roomed += 1

    def _result(self, k: int) -> list[MegaBatchPlan]:
        """Window k's stubs, waiting for its packer; a dead packer or a failed window raises."""
        i = k % self.count
        proc, conn = self._procs[i], self._conns[i]
        where = f"packer {i} (process {proc.pid}), packing window {k} (mini-batches from {self.works[k].first})"
        while True:
            check_stop()
            if i in self._early:
                reply = self._early.pop(i)
                break
            try:
                if conn.poll(POLL_S):
                    reply = conn.recv()
                    if reply[0] != "started":
                        break
                    if self._started is not None:
                        self._started(*reply[1:])
                    continue
            except (EOFError, ConnectionError):
                reply = None
                break
            if proc.poll() is not None:
                reply = None
                break
        if reply is None:
            try:
                code = proc.wait(POLL_S)
            except subprocess.TimeoutExpired:
                code = None
            how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
                   else f"exited with status {code}")
            raise PackerError(f"{where}: the packer {how}; training stopped (its window's scratch is removed)")
        if reply[0] == "error":
            raise PackerError(f"{where}: {reply[1]}")
        stubs, reports = reply[1]
        for each in reports if self._report is not None else ():
            self._report(each)
        return stubs

    def windows(self) -> Iterator[tuple[list[MegaBatchPlan], Path]]:
        """Each window's stubs and folder, in order; the previous window's folder is removed
        when the next is asked for (its plans are loaded by then, their blocks deleted), and
        the window after the one asked for gets room for its blocks."""
        previous: Path | None = None
        for k, work in enumerate(self.works):
            self._give(k + 1 + self.ahead)
            self._make_room(k + 2)
            stubs = self._result(k)
            if previous is not None:
                shutil.rmtree(previous, ignore_errors=True)
            previous = work.directory
            yield stubs, work.directory
            del stubs

    def close(self) -> None:
        """End every packer now (a window in progress is abandoned: the caller removes the
        scratch) and wait for them."""
        self._closing = True
        self._assigned.set()  # the starter, if still waiting for the works, gives none
        # told to stop after the starter's sends, unless a packer has not read them by now (one
        # still starting, or stalled): that one is killed below, which ends the send
        if self._sending.acquire(timeout=POLL_S):
            try:
                for conn in self._conns:
                    try:
                        conn.send(None)
                    except OSError:
                        pass
            finally:
                self._sending.release()
        deadline = time.monotonic() + 2 * POLL_S
        for proc in self._procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._starter is not None:
            self._starter.join()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
