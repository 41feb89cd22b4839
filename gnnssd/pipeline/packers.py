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
for that, planning its next window meanwhile. So at most SCANS_AT_ONCE windows scan at once,
whatever the number of packers. The stream's first window is small (window_bounds): packed
bytes come early.
A packer that dies (killed, out of memory) is an error naming it and its window, raised in
the consumer within POLL_S: nothing waits on it. Packers ignore Ctrl-C (the trainer stops
them) and are ended when the pool closes, which removes its scratch folder.

The pool outlives a stream (an epoch; a training stream restarted after evaluation; an
evaluation's): its packers start once (~3 CPU-s each, which a pool per stream paid at every
restart: docs/BENCHMARKS.md, issue 46, ninth round) and take each stream's windows, planned
with that stream's fanouts. A stream's end stops its windows in progress; the packers say
when they have, and only then is its folder removed.
"""
from __future__ import annotations

import itertools
import json
import math
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
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from multiprocessing.connection import Connection
from typing import Callable, Iterator

import numpy as np

from gnnssd.pipeline.direct_io import DirectIO
from gnnssd.pipeline.repack import RepackReport, repack_window
from gnnssd.pipeline.worker import POLL_S, Stopped, check_stop, numba_threads, stops_with
from gnnssd.sampler import CostModel, HotRows, MegaBatchPlan, PlanConfig, Planner, Scan, choose_window, pages_plan
from gnnssd.storage_format import Store, write_error, writable_file


#: Mini-batches of each packer's first window, and of the trainer's own window beyond the
#: point where the first packer has started (what the packer takes to pack that first window):
#: packed bytes come early. A first window sized for a block share held 12 mini-batches of
#: `large` at 12%, read at ~7 bytes per useful byte (docs/BENCHMARKS.md, issue 46, fourth round).
FIRST_WINDOW = 2
#: Windows scanning (reading rows, writing blocks) at once at most, whatever the number of
#: packers: window k + 1 gets room to write when the consumer asks for window k, whose scan
#: may not have ended yet; no later window has room before k's stubs are read.
SCANS_AT_ONCE = 2
#: The trainer's own window at most, in mini-batches (its page reads cover the packers' start;
#: where a packer takes longer than that to start, the trainer waits for it). A stream of no
#: more mini-batches than this is the trainer's alone: no packer starts (its start, scan and
#: writes came after the trainer could have read them all in place: docs/BENCHMARKS.md,
#: issue 46, ninth round).
OWN_WINDOW_MOST = 4 * FIRST_WINDOW


def window_bounds(count: int, full: int) -> list[tuple[int, int]]:
    """[lo, hi) of each packer window of `count` mini-batches, in order: the first of
    FIRST_WINDOW (packed bytes arrive early), every later one `full` (the mini-batches whose
    cold rows fill a window's blocks: a window's scan reads most of the features file, so
    windows between the two paid for theirs less often: none did in the packers' tests).
    Only the first is small, whatever the number of packers: the others plan their full
    windows beside it (with a small first window each, 14 packers' scans read 2.8x one
    packer's bytes per useful byte: docs/BENCHMARKS.md, issue 46, thirteenth round)."""
    if full < 1:
        raise ValueError(f"window_bounds: full {full}; expected at least 1")
    bounds: list[tuple[int, int]] = []
    lo = 0
    while lo < count:
        size = min(full, FIRST_WINDOW) if not bounds else full
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
    """One window of a stream: the seed batches of mini-batches first .. first+len(batches)-1
    of an epoch, planned with `config` (a stream's fanouts: training's or evaluation's)."""

    stream: int
    window: int
    epoch: int
    first: int
    batches: list[np.ndarray]
    exclude: list[np.ndarray] | None
    config: PlanConfig
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
        self._graph = (store.indptr, store.indices)
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
        planner = Planner(*self._graph, work.config, spec.hot, **self._planner_options)
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


class _Inbox:
    """A packer's side of the socket, read by a thread of its own: windows queue for the
    planner, each stream's ("end", stream) marker after its windows; ("room", stream, window)
    messages are kept until that window's scan asks for them. A stream's end sets its stop
    flag (check_stop's, for its windows in progress); None (or the pool gone) sets every flag."""

    def __init__(self, conn: Connection):
        self._conn = conn
        self.works: queue.Queue[WindowWork | tuple | None] = queue.Queue()
        self._rooms: set[tuple[int, int]] = set()
        self._stops: dict[int, threading.Event] = {}
        self._changed = threading.Condition()  # an RLock's: stop_flag is called holding it
        self._gone = threading.Event()  # the pool said stop, or went: every flag is set
        threading.Thread(target=self._receive, daemon=True, name="gnnssd-packer-inbox").start()

    def _receive(self) -> None:
        try:
            while (message := self._conn.recv()) is not None:
                if isinstance(message, WindowWork):
                    self.works.put(message)
                    continue
                with self._changed:
                    if message[0] == "room":
                        self._rooms.add(message[1:])
                    else:  # ("end", stream)
                        self.stop_flag(message[1]).set()
                        self._rooms = {room for room in self._rooms if room[0] != message[1]}
                    self._changed.notify_all()
                if message[0] == "end":
                    self.works.put(message)
        except (EOFError, ConnectionError, OSError):
            pass
        with self._changed:
            self._gone.set()
            for flag in self._stops.values():
                flag.set()
            self._changed.notify_all()
        self.works.put(None)

    def stop_flag(self, stream: int) -> threading.Event:
        """Set once `stream` has ended, or the packer is told to stop."""
        with self._changed:
            if stream not in self._stops:
                self._stops[stream] = threading.Event()
                if self._gone.is_set():
                    self._stops[stream].set()
            return self._stops[stream]

    def forget(self, stream: int) -> None:
        """`stream` has ended and its end is answered: its flag is no longer asked for."""
        with self._changed:
            self._stops.pop(stream, None)

    def room(self, work: WindowWork) -> bool:
        """Wait until `work` may write its blocks: True; False once its stream has ended first."""
        stop = self.stop_flag(work.stream)
        with self._changed:
            while (work.stream, work.window) not in self._rooms and not stop.is_set():
                self._changed.wait()
            self._rooms.discard((work.stream, work.window))
            return not stop.is_set()


def _failure(stream: int | None, exc: BaseException) -> tuple[str, int | None, str, str]:
    """A window's error (or the packer's own, `stream` None), as its reply."""
    return "error", stream, f"{type(exc).__name__}: {exc}", traceback.format_exc()


#: Windows a packer holds at once: the one it scans (or whose room it waits for) and the next,
#: planned meanwhile (their rows wait in mapped files, RowsFile: ssd.memory_budget counts the
#: bitset the one being planned finds its scan rows in).
PACKER_WINDOWS = 2


def _free_slot(slots: threading.Semaphore, stop: threading.Event) -> bool:
    """Take one of `slots` once free; False if `stop` is set first."""
    while not slots.acquire(timeout=POLL_S):
        if stop.is_set():
            return False
    return True


def _plan_ahead(packer: Packer, inbox: _Inbox, planned: queue.Queue, slots: threading.Semaphore) -> None:
    """The packer's planning thread: each window's stubs and scan (or its error) in order,
    a window begun only once one of PACKER_WINDOWS `slots` is free (the scan releases it);
    a window of an ended stream is skipped (or stopped at its next check_stop); a stream's
    end marker passed on after its windows; None at the end."""
    numba_threads(packer.spec.numba_threads)
    while (work := inbox.works.get()) is not None:
        if not isinstance(work, WindowWork):  # ("end", stream)
            planned.put(work)
            continue
        stop = inbox.stop_flag(work.stream)
        if not _free_slot(slots, stop):
            continue
        try:
            with stops_with(stop):
                planned.put(("ok", work, *packer.plan(work)))
        except Stopped:
            slots.release()
        except Exception as exc:  # the window's error, raised in the consumer
            planned.put(_failure(work.stream, exc))
    planned.put(None)


def _repacked(packer: Packer, inbox: _Inbox, work: WindowWork, stubs: list[MegaBatchPlan], scan: Scan,
              rows: np.ndarray) -> tuple | None:
    """A planned window's reply once its blocks are written (after its room), or None if
    its stream ended first."""
    stop = inbox.stop_flag(work.stream)
    try:
        with stops_with(stop):
            if len(scan.rows) and not inbox.room(work):
                return None
            return "ok", work.stream, packer.repack(work, stubs, scan, rows)
    except Stopped:
        return None
    except Exception as exc:  # the window's error, raised in the consumer
        return _failure(work.stream, exc)


def serve(fd: int) -> None:
    """A packer process: its PackerSpec, then windows in and replies out over the socket `fd`
    (("ok", stream, (stubs, reports)), or ("error", stream, text, traceback)), until told to
    stop or the pool is gone; ("room", stream, window) lets a window write its blocks;
    ("end", stream) stops a stream's windows, answered ("ended", stream) once none is in
    progress (the pool then removes their folders). Once ready it says ("started", its
    process ID, the CPU seconds its start took: interpreter, imports, store).

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
        while (item := planned.get()) is not None:
            if item[0] == "end":  # every window of that stream before it is done with
                conn.send(("ended", item[1]))
                inbox.forget(item[1])
                continue
            if item[0] == "ok":
                _, work, stubs, scan, rows = item
                del item
                item = _repacked(packer, inbox, work, stubs, scan, rows)
                del stubs, scan, rows
            if item is not None and not inbox.stop_flag(item[1]).is_set():
                conn.send(item)
            slots.release()
    except (EOFError, ConnectionError):  # the pool is gone
        return
    except Exception as exc:
        conn.send(_failure(None, exc))
    finally:
        if packer is not None:
            packer.close()
        conn.close()


class PackerError(RuntimeError):
    """A packer failed or died; the message names it and its window."""


def _ended_how(code: int | None) -> str:
    """How a packer process ended, from its exit status."""
    return (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
            else f"exited with status {code}")


#: Seconds a stream's end waits for the packers to stop its windows (a started packer stops
#: at its next check: a plan, or a chunk of a scan; one still starting answers once started).
END_WAIT_S = 5.0
#: _reply's answer when a packer said nothing about the current stream in time.
_QUIET = ("quiet",)


def _send_all(outbox: queue.Queue, conn: Connection) -> None:
    """A sender thread: `outbox`'s messages to one packer, in order, until None (a message
    left unsent to a packer that is gone: waiting for its window says so)."""
    while (message := outbox.get()) is not None:
        try:
            conn.send(message[0])
        except OSError:
            pass


def _shut_down(procs: list[subprocess.Popen], outboxes: list[queue.Queue], senders: list[threading.Thread],
               conns: list[Connection], root: Path) -> None:
    """Tell every packer to stop, kill those still running after 2 POLL_S (one still
    starting, or stalled: that also ends a send to it), wait for them, remove the pool's folder."""
    for outbox in outboxes:
        outbox.put((None,))  # the packer's "stop"
        outbox.put(None)  # the sender's
    deadline = time.monotonic() + 2 * POLL_S
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for sender in senders:
        sender.join()
    for conn in conns:
        conn.close()
    shutil.rmtree(root, ignore_errors=True)


class PackerPool:
    """`count` packer processes, started at once, that live until `close()` and pack the
    windows of one stream at a time: `assign` gives a stream's windows (in window order) and
    `windows()` yields them as they are packed, `ahead` of the consumer; `end()` stops the
    stream. `ready()` says whether the first packer has started.

    The pool owns `root`: each stream's windows have folders under it, removed as the
    consumer moves on, and what an ended stream left once every packer has stopped its
    windows; `close()` (or the pool's collection, or the interpreter's exit) ends the
    packers and removes it. Messages go out through a sender thread per packer, so no
    caller waits on a packer's socket (a packer's spec, larger than a socket's buffer, is
    read only once its imports are done, ~3 s)."""

    def __init__(self, spec: PackerSpec, count: int, ahead: int, root: Path,
                 report: Callable[[RepackReport], None] | None = None,
                 started: Callable[[int, float], None] | None = None):
        """`report` hears each window's repack costs as its stubs arrive; `started` each
        packer's process ID and the CPU seconds its start took, when next waited for."""
        if count < 1:
            raise ValueError(f"ssd.packers: {count}; expected at least 1")
        self.root = root
        self.works: list[WindowWork] = []
        self.ahead, self._report, self._started = max(1, ahead), report, started
        self._numbers = itertools.count(1)  # streams' numbers, in order
        self._current: int | None = None  # the stream being packed
        self._ending: dict[int, set[int]] = {}  # streams ended, and the packers yet to say so
        self._early: dict[int, list[tuple | None]] = {}  # replies read before they were asked for
        self._up = False  # the first packer said it started
        self._procs: list[subprocess.Popen] = []
        self._conns: list[Connection] = []
        self._outboxes: list[queue.Queue] = []
        self._senders: list[threading.Thread] = []
        self._given = self._roomed = 0
        self._handing = threading.Lock()  # the counts above, between the planner's and the reader's threads
        self._close = weakref.finalize(self, _shut_down, self._procs, self._outboxes, self._senders, self._conns,
                                       root)
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
                self._outboxes.append(queue.Queue())
                self._outboxes[-1].put((spec,))
                self._senders.append(threading.Thread(target=_send_all, args=(self._outboxes[-1], self._conns[-1]),
                                                      daemon=True, name="gnnssd-packers-send"))
                self._senders[-1].start()
        except BaseException:
            self.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    @property
    def count(self) -> int:
        return len(self._procs)

    def dead(self) -> list[str]:
        """The packers that have ended (a dead one fails every stream after it), each named
        with how it ended."""
        return [f"packer {i} (process {proc.pid}) {_ended_how(proc.returncode)}"
                for i, proc in enumerate(self._procs) if proc.poll() is not None]

    def _post(self, i: int, message: object) -> None:
        self._outboxes[i].put((message,))

    def assign(self, config: PlanConfig, epoch: int,
               windows: list[tuple[int, list[np.ndarray], list[np.ndarray] | None]]) -> None:
        """A new stream: windows of (first mini-batch, seed batches, excluded edges or
        None) of `epoch`, planned with `config`; the first `ahead` + 1 are given out now, and
        room for the first two once the stream before has stopped (end) writing blocks."""
        self.end()
        self._current = next(self._numbers)
        folder = self.root / f"s{self._current}"
        self.works = [WindowWork(self._current, k, epoch, first, batches, exclude, config, folder / f"w{k}")
                      for k, (first, batches, exclude) in enumerate(windows, start=1)]
        with self._handing:
            self._given = self._roomed = 0
        self._give(1 + self.ahead)
        self._make_room(2, wait=False)

    def end(self) -> None:
        """Stop the current stream (if any): its windows in progress stop at their next
        check, and their folders are removed once every packer says so, waited for here up
        to END_WAIT_S (a packer still starting answers once started; one that does not
        answer in time has its stream's folder removed later, or with the pool)."""
        if self._current is None:
            return
        stream, self._current, self.works = self._current, None, []
        self._ending[stream] = set(range(self.count))
        for i in range(self.count):
            self._post(i, ("end", stream))
        self._settle(time.monotonic() + END_WAIT_S)

    def ready(self) -> bool:
        """Whether the first packer has started (or failed: waiting for its window says so)."""
        if not self._up and (reply := self._reply(0, 0)) is not _QUIET:
            self._early.setdefault(0, []).append(reply)
            self._up = True
        return self._up

    def _reply(self, i: int, timeout: float) -> tuple | None:
        """Packer i's next reply about the current stream (or its own failure) within
        `timeout` s: _QUIET if none came, None if the packer is gone. Its start and replies
        about ended streams are taken in here."""
        if self._early.get(i):
            return self._early[i].pop(0)
        conn = self._conns[i]
        deadline = time.monotonic() + timeout
        while True:
            try:
                if not conn.poll(max(0.0, deadline - time.monotonic())):
                    return _QUIET
                reply = conn.recv()
            except (EOFError, ConnectionError, OSError):
                return None
            if reply[0] == "started":
                self._up = self._up or i == 0
                if self._started is not None:
                    self._started(*reply[1:])
            elif reply[0] == "ended":
                self._stopped(reply[1], i)
            elif reply[1] is None or reply[1] == self._current:
                return reply
            # else: a window of an ended stream, whose folder goes with the stream's

    def _stopped(self, stream: int, i: int) -> None:
        """Packer i has stopped `stream`'s windows: once all have, its folder goes (and the
        pool's, if no other stream has one: a pool between streams leaves no scratch)."""
        waiting = self._ending.get(stream, set())
        waiting.discard(i)
        if not waiting and stream in self._ending:
            del self._ending[stream]
            shutil.rmtree(self.root / f"s{stream}", ignore_errors=True)
            try:
                self.root.rmdir()
            except OSError:  # another stream's folder is in it, or it was never made
                pass

    def _settle(self, until: float) -> None:
        """Take in the packers' answers to ended streams, waiting for them until the
        monotonic time `until` (a packer that is gone writes nothing more)."""
        for stream, waiting in list(self._ending.items()):
            for i in list(waiting):
                while stream in self._ending and i in waiting:
                    check_stop()
                    reply = self._reply(i, min(POLL_S, max(0.0, until - time.monotonic())))
                    if reply is _QUIET and self._procs[i].poll() is None:
                        if time.monotonic() >= until:
                            break
                        continue
                    if reply is not None and reply is not _QUIET:  # its own failure: said at its next window
                        self._early.setdefault(i, []).append(reply)
                    self._stopped(stream, i)  # gone, or failed: it writes nothing more

    def _give(self, upto: int) -> None:
        """Hand out the windows before `upto` not yet given."""
        with self._handing:
            while self._given < min(upto, len(self.works)):
                k = self._given
                self._post(k % self.count, self.works[k])
                self._given += 1

    def _make_room(self, upto: int, wait: bool) -> None:
        """Room to write blocks for the windows before `upto` (after they are given out),
        once no ended stream's windows may still write theirs (waiting for that with `wait`):
        the disk then holds two windows' blocks at most."""
        self._settle(math.inf if wait else 0.0)
        if self._ending:
            return
        with self._handing:
            while self._roomed < min(upto, self._given):
                k = self._roomed
                self._post(k % self.count, ("room", self._current, self.works[k].window))
                self._roomed += 1

    def _result(self, k: int) -> list[MegaBatchPlan]:
        """Window k's stubs, waiting for its packer; a dead packer or a failed window raises."""
        i = k % self.count
        proc = self._procs[i]
        where = f"packer {i} (process {proc.pid}), packing window {k} (mini-batches from {self.works[k].first})"
        while True:
            check_stop()
            reply = self._reply(i, POLL_S)
            if reply is not _QUIET or proc.poll() is not None:
                break
        if reply is None or reply is _QUIET:
            try:
                code = proc.wait(POLL_S)
            except subprocess.TimeoutExpired:
                code = None
            raise PackerError(f"{where}: the packer {_ended_how(code)}; training stopped (its window's scratch is "
                              "removed)")
        if reply[0] == "error":
            raise PackerError(f"{where}: {reply[2]}")
        stubs, reports = reply[2]
        for each in reports if self._report is not None else ():
            self._report(each)
        return stubs

    def windows(self) -> Iterator[tuple[list[MegaBatchPlan], Path]]:
        """The current stream's windows: stubs and folder of each, in order; the previous
        window's folder is removed when the next is asked for (its plans are loaded by then,
        their blocks deleted), the last one's at the end, and the window after the one asked
        for gets room for its blocks."""
        works, previous = self.works, None
        for k, work in enumerate(works):
            self._give(k + 1 + self.ahead)
            self._make_room(k + 2, wait=True)
            stubs = self._result(k)
            if previous is not None:
                shutil.rmtree(previous, ignore_errors=True)
            previous = work.directory
            yield stubs, work.directory
            del stubs
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)

    def close(self) -> None:
        """End every packer now (a window in progress is abandoned) and wait for them; the
        pool's folder is removed."""
        self._close()
