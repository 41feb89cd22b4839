"""gnnssd.io_engine against independent references: os.pread for extents, NumPy fancy
indexing on a memmap for the row readers; both backends; the error and shutdown paths."""
from __future__ import annotations

import _thread
import errno
import logging
import os
import signal
import tempfile
import threading
from concurrent.futures import CancelledError
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnssd.io_engine import Engine
from gnnssd.io_engine.engine import alloc
from gnnssd.io_engine import engine as engine_mod
from gnnssd.io_engine._gnnssd_io import lib
from gnnssd.sampler.readplan import CostModel, per_row_requests, plan_extents
from gnnssd.storage_format.manifest import PAGE as STORE_PAGE

BACKENDS = ["io_uring", "threads"]
FILE_SIZE = (8 << 20) + 777  # not a multiple of any block size: exercises the tail block
HYPO = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _direct_ok(directory: Path) -> bool:
    probe = directory / "odirect-probe"
    probe.write_bytes(b"\0" * 4096)
    try:
        os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory on a filesystem that accepts O_DIRECT (pytest's tmp dir, else one under
    the home directory); O_DIRECT tests are skipped only when neither does."""
    first = tmp_path_factory.mktemp("io")
    if _direct_ok(first):
        return first
    other = Path(tempfile.mkdtemp(prefix="gnnssd-io-test-", dir=Path.home()))
    if _direct_ok(other):
        return other
    pytest.skip("no directory here accepts O_DIRECT (tmpfs?)")


class Data(tuple):
    """(path, bytes) of the test file, with a short repr for failure reports."""

    def __repr__(self) -> str:
        return f"Data({self[0].name}, {len(self[1])} bytes)"


@pytest.fixture(scope="module")
def data(data_dir: Path) -> Data:
    path = data_dir / "data.bin"
    payload = np.random.default_rng(42).integers(0, 256, FILE_SIZE, dtype=np.uint8).tobytes()
    path.write_bytes(payload)
    return Data((path, payload))


def _make_engine(backend: str, **kw: object) -> Engine:
    try:
        return Engine(backend=backend, **kw)
    except OSError as e:
        if backend == "io_uring":
            pytest.skip(f"io_uring cannot be set up here: {e}")
        raise


@pytest.fixture(scope="module", params=BACKENDS)
def engine(request: pytest.FixtureRequest):
    eng = _make_engine(request.param, queue_depth=32, chunk_bytes=64 << 10)
    yield eng
    eng.close()


@pytest.fixture()
def f(engine: Engine, data: tuple[Path, bytes]):
    with engine.open(data[0]) as fh:
        yield fh


def _pages(data: Data) -> np.ndarray:
    """The test file's whole 4 KiB pages, one per row."""
    return np.frombuffer(data[1], np.uint8)[: FILE_SIZE // 4096 * 4096].reshape(-1, 4096)


def _pread_all(path: Path, offsets, lengths) -> list[bytes]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return [os.pread(fd, int(n), int(o)) for o, n in zip(offsets, lengths)]
    finally:
        os.close(fd)


# ---- extents --------------------------------------------------------------------------

extent_lists = st.lists(st.tuples(st.integers(0, FILE_SIZE // 512), st.integers(0, 40)),
                        max_size=300)


@HYPO
@given(reqs=extent_lists)
def test_random_extents_equal_pread(engine, f, data, reqs):
    bs = f.block_size
    limit = -(-FILE_SIZE // bs) * bs
    offsets = np.array([min(b * 512 // bs * bs, limit - bs) for b, _ in reqs], np.int64)
    lengths = np.array([min(k * bs, limit - o) for (_, k), o in zip(reqs, offsets)], np.int64)
    dests = np.cumsum(lengths) - lengths
    buf = alloc(int(lengths.sum()))
    engine.read_extents(f, offsets, lengths, buf, dests)
    for o, n, d, ref in zip(offsets, lengths, dests, _pread_all(data[0], offsets, lengths)):
        got = bytes(buf[d : d + n])
        assert got[: len(ref)] == ref
        assert got[len(ref) :] == bytes(n - len(ref))  # past EOF in the last block: zeros


@HYPO
@given(reqs=st.lists(st.tuples(st.integers(0, FILE_SIZE - 1), st.integers(0, 9000)),
                     max_size=200))
def test_unaligned_extents_buffered(engine, data, reqs):
    """Without O_DIRECT any offset, length and destination is allowed."""
    offsets = np.array([o for o, _ in reqs], np.int64)
    lengths = np.array([min(n, FILE_SIZE - o) for o, n in reqs], np.int64)
    dests = 3 + np.cumsum(lengths) - lengths
    buf = np.zeros(int(lengths.sum()) + 3, np.uint8)
    with engine.open(data[0], direct=False) as fb:
        assert fb.block_size == 1
        engine.read_extents(fb, offsets, lengths, buf, dests)
    for n, d, ref in zip(lengths, dests, _pread_all(data[0], offsets, lengths)):
        assert bytes(buf[d : d + n]) == ref


def test_million_request_batch(engine, data):
    n = 1_000_000
    rng = np.random.default_rng(1)
    offsets = rng.integers(0, FILE_SIZE - 64, n)
    lengths = rng.integers(0, 65, n)
    dests = np.arange(n, dtype=np.int64) * 64
    buf = np.zeros(n * 64, np.uint8)
    with engine.open(data[0], direct=False) as fb:  # page cache: a million reads in ~1 s
        engine.read_extents(fb, offsets, lengths, buf, dests)
    ref = np.frombuffer(data[1], np.uint8)
    cols = np.arange(64)
    at = np.minimum(offsets[:, None] + cols, FILE_SIZE - 1)
    want = np.where(cols < lengths[:, None], ref[at], 0)
    assert np.array_equal(buf.reshape(n, 64), want)


def test_zero_length_batch(engine, f):
    empty = np.array([], np.int64)
    h = engine.submit(f, empty, empty, alloc(0), empty)
    assert h.done()
    h.wait()
    assert engine.read_rows(f, empty, 512, empty, empty).shape == (0, 512)


def test_concurrent_threads_share_an_engine(engine, f, data):
    """Internal locking: several Python threads submit to one engine at once."""
    pages = _pages(data)
    failures: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            rows = rng.integers(0, FILE_SIZE // 4096, 500)
            buf = alloc(500 * 4096)
            engine.read_extents(f, rows * 4096, np.full(500, 4096), buf, np.arange(500) * 4096)
            assert np.array_equal(buf.reshape(500, 4096), pages[rows])
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


# ---- row readers ----------------------------------------------------------------------

def _extents(rows: np.ndarray, row_bytes: int, how: str) -> tuple[np.ndarray, np.ndarray]:
    """The read planner's extents for rows: one request per row, page runs, or runs merged
    across gaps (a small request limit, so that rows straddle extent ends)."""
    ordered = np.sort(rows)
    if how == "per-row":
        return per_row_requests(ordered, row_bytes)
    model = CostModel(request_s=1e-5, read_bw=1e9, write_bw=1e9, max_request=64 << 10)
    return plan_extents(ordered, row_bytes, model, merge=how == "merged")[:2]


@HYPO
@given(row_bytes=st.sampled_from([1, 100, 512, 4096, 5000, 12295]),
       picks=st.lists(st.floats(0, 1, exclude_max=True), max_size=400),
       how=st.sampled_from(["per-row", "page runs", "merged"]))
def test_row_reader_equals_memmap(engine, f, data, row_bytes, picks, how):
    n_rows = FILE_SIZE // row_bytes
    rows = np.array([int(p * n_rows) for p in picks], np.int64)  # unsorted, with repeats
    ref = np.memmap(data[0], np.uint8, mode="r", shape=(n_rows, row_bytes))[rows]
    out = np.full((len(rows), row_bytes), 7, np.uint8)
    offsets, lengths = _extents(rows, row_bytes, how)
    # halves that hold the longest extent: many chunks, the next one read during copies
    staging = alloc(2 * max(-(-int(lengths.max(initial=1)) // 4096) * 4096, 8192))
    got = engine.read_rows(f, rows, row_bytes, offsets, lengths, out=out, staging=staging)
    assert got is out
    assert np.array_equal(out, ref)


def test_per_row_extents_read_one_request_per_row(engine, f, data):
    """The per-row baseline's reads: as many requests as rows, rows sharing a page too."""
    rows = np.array([9, 3, 4, 4000, 8], np.int64)
    offsets, lengths = _extents(rows, 512, "per-row")
    assert len(offsets) == len(rows) and set(lengths) == {4096}
    ref = np.memmap(data[0], np.uint8, mode="r", shape=(FILE_SIZE // 512, 512))[rows]
    assert np.array_equal(engine.read_rows(f, rows, 512, offsets, lengths), ref)


def test_rows_past_eof_uncovered_and_bad_out_rejected(engine, f):
    last = FILE_SIZE // 512
    offsets, lengths = _extents(np.array([0, 1]), 512, "per-row")
    with pytest.raises(ValueError, match=f"row {last} ends at byte"):
        engine.read_rows(f, [0, last], 512, offsets, lengths)
    with pytest.raises(ValueError, match="out must be"):
        engine.read_rows(f, [0, 1], 512, offsets, lengths, out=np.empty((2, 511), np.uint8))
    with pytest.raises(ValueError, match="row 100 of .* lies outside the extents"):
        engine.read_rows(f, [0, 100], 512, offsets, lengths)
    with pytest.raises(ValueError, match="row 0 of .* lies outside the extents"):
        engine.read_rows(f, [0, 9], 512, [4096], [4096])


def test_one_page_per_fact():
    """The engine checks page checksums in the store's page; its buffers suit O_DIRECT
    at the alignment it assumes where the kernel reports none."""
    assert lib.GIO_CRC_PAGE == STORE_PAGE
    assert engine_mod.ALIGNMENT == lib.GIO_DIO_ALIGN and engine_mod.alloc(1).ctypes.data % lib.GIO_DIO_ALIGN == 0


# ---- errors ---------------------------------------------------------------------------

def test_read_past_eof_rejected(engine, f):
    buf = alloc(8192)
    limit = -(-FILE_SIZE // f.block_size) * f.block_size
    with pytest.raises(ValueError, match=f"request 1 reads past the end of .*offset {limit}"):
        engine.submit(f, [0, limit], [4096, f.block_size], buf, [0, 4096])


def test_misaligned_rejected_naming_value_and_alignment(engine, f):
    bs = f.block_size
    buf = alloc(3 * 4096)
    with pytest.raises(ValueError, match=f"offset 100 is not a multiple of {bs}"):
        engine.submit(f, [0, 100], [4096, 4096], buf, [0, 4096])
    with pytest.raises(ValueError, match=f"length {bs + 1} is not a multiple of {bs}"):
        engine.submit(f, [0], [bs + 1], buf, [0])
    if f.mem_align > 1:
        with pytest.raises(ValueError, match=f"not a multiple of {f.mem_align}"):
            engine.submit(f, [0], [bs], buf, [1])
    with pytest.raises(ValueError, match="overflows the buffer"):
        engine.submit(f, [0], [4096], buf, [2 * 4096 + 512])


def test_the_quick_check_of_requests_passes_exactly_what_the_full_check_passes(engine, f, monkeypatch):
    """engine._requests_fine (a few reductions) says True only for requests the checks one by
    one pass, and for those it is asked about most (aligned, inside file and buffer)."""
    bs, page = f.block_size, 4096
    unit = max(bs, page)
    buf = alloc(64 * unit)
    addr = buf.ctypes.data
    limit = -(-FILE_SIZE // bs) * bs
    fine = ([0, unit, 5 * unit], [unit, 2 * unit, unit], [0, unit, 3 * unit])
    cases = {"fine": fine, "one request": ([limit - unit], [unit], [63 * unit]),
             "negative offset": ([0, -unit], [unit, unit], [0, unit]),
             "negative length": ([0, unit], [unit, -unit], [0, unit]),
             "negative dest": ([0, unit], [unit, unit], [0, -unit]),
             "an empty request": ([0, unit], [unit, 0], [0, unit]),
             "past the end": ([0, limit], [unit, unit], [0, unit]),
             "over the buffer": ([0], [unit], [64 * unit]),
             "offset off the unit": ([0, unit + bs // 2 or 1], [unit, unit], [0, unit]),
             "length off the unit": ([0], [unit + 1], [0]),
             "dest off the alignment": ([0], [unit], [max(f.mem_align, 2) // 2])}

    def full_check_passes(offsets, lengths, dests) -> bool:
        with monkeypatch.context() as m:  # the check by check way alone
            m.setattr(engine_mod, "_requests_fine", lambda *args: False)
            try:
                engine_mod._check_requests(f, offsets, lengths, dests, len(buf), addr)
            except ValueError:
                return False
            return True

    for name, request in cases.items():
        offsets, lengths, dests = (np.array(a, np.int64) for a in request)
        quick = engine_mod._requests_fine(f, offsets, lengths, dests, len(buf), addr)
        full = full_check_passes(offsets, lengths, dests)
        assert quick <= full, name
        if name in ("fine", "one request"):
            assert quick and full, name


def test_closed_file_rejected(engine, data):
    fh = engine.open(data[0])
    fh.close()
    with pytest.raises(ValueError, match="is closed"):
        engine.submit(fh, [0], [4096], alloc(4096), [0])


@pytest.mark.parametrize("swap, code", [("write-only", errno.EBADF), ("directory", errno.EISDIR)])
def test_read_error_names_file_offset_length_errno(engine, data, data_dir, swap, code):
    fh = engine.open(data[0])
    if swap == "write-only":
        other = os.open(os.devnull, os.O_WRONLY)
    else:
        other = os.open(data_dir, os.O_RDONLY)
    os.dup2(other, fh.fileno())  # the engine's fd now names something unreadable
    os.close(other)
    try:
        with pytest.raises(OSError) as exc:
            engine.read_extents(fh, [0, 8192], [4096, 4096], alloc(8192), [0, 4096])
        assert exc.value.errno == code
        assert exc.value.filename == str(data[0])
        assert "at offset 0, length 4096" in str(exc.value)
    finally:
        fh.close()


def test_open_errors(engine, data_dir):
    with pytest.raises(FileNotFoundError):
        engine.open(data_dir / "missing.bin")


def _endless_batch(engine: Engine, f, n: int = 3_000_000):
    """More reads than any disk finishes during a test: n block reads into one block."""
    bs = f.block_size
    offsets = (np.arange(n, dtype=np.int64) * 7919 % (FILE_SIZE // bs)) * bs
    return engine.submit(f, offsets, np.full(n, bs), alloc(4096), np.zeros(n, np.int64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_interrupted_wait_cancels_and_drains(backend, data):
    # A process started in the background by a non-interactive shell inherits SIGINT as
    # ignored, and interrupt_main() then does nothing: install Python's handler here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    with _make_engine(backend, queue_depth=4) as eng, eng.open(data[0]) as fh:
        h = _endless_batch(eng, fh)
        timer = threading.Timer(0.2, _thread.interrupt_main)
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                h.wait()
        finally:
            timer.cancel()
            signal.signal(signal.SIGINT, previous)
        assert h.done()
        with pytest.raises(CancelledError):
            h.wait()
        buf = alloc(4096)
        eng.read_extents(fh, [0], [4096], buf, [0])  # the engine is still usable
        assert bytes(buf) == data[1][:4096]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_with_reads_in_flight(backend, data):
    fds, threads = _open_fds(), _threads()
    eng = _make_engine(backend, queue_depth=64)
    fh = eng.open(data[0])
    handles = [_endless_batch(eng, fh, 200_000) for _ in range(3)]
    eng.close()
    for h in handles:
        assert h.done()
        with pytest.raises(CancelledError):
            h.wait()
    with pytest.raises(ValueError, match="engine is closed"):
        eng.submit(fh, [0], [4096], alloc(4096), [0])
    fh.close()
    assert _open_fds() == fds  # ring fds closed
    assert _threads() == threads  # ring drivers / pool threads joined


def test_wait_timeout_leaves_reads_running(engine, f):
    h = _endless_batch(engine, f, 500_000)
    with pytest.raises(TimeoutError):
        h.wait(timeout=0)
    assert not h.done()
    h.cancel()
    with pytest.raises(CancelledError):
        h.wait()


def test_file_close_cancels_its_reads(engine, data):
    fh = engine.open(data[0])
    h = _endless_batch(engine, fh, 500_000)
    fh.close()
    assert h.done()
    with pytest.raises(CancelledError):
        h.wait()


@pytest.mark.parametrize("backend", BACKENDS)
def test_wait_releases_the_gil(backend, data):
    """One C wait of up to 60 s on reads that only end when another Python thread cancels
    them: it returns done only if that thread ran while the C call was waiting."""
    with _make_engine(backend, queue_depth=1) as eng, eng.open(data[0]) as fh:
        h = _endless_batch(eng, fh)
        counted = []

        def count_then_cancel() -> None:
            i = 0
            while i < 200_000:
                i += 1
            counted.append(i)
            h.cancel()

        t = threading.Thread(target=count_then_cancel)
        t.start()
        done = lib.gio_batch_wait(h._batch, 60_000)
        t.join()
        assert done == 1 and counted == [200_000]
        with pytest.raises(CancelledError):
            h.wait()


# ---- engine set-up and buffers -----------------------------------------------------------

def test_backend_choice_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(engine_mod, "_logged_choices", set())
    with caplog.at_level(logging.INFO, logger="gnnssd.io_engine.engine"):
        engines = [Engine() for _ in range(3)]
    assert engines[0].backend in ("io_uring", "threads")
    assert len([r for r in caplog.records if "backend" in r.getMessage()]) == 1
    for e in engines:
        e.close()


def test_bad_arguments():
    with pytest.raises(ValueError, match="backend must be one of"):
        Engine(backend="spdk")
    with pytest.raises(OSError, match="cannot start"):
        Engine(backend="threads", queue_depth=0)


def test_alloc_is_aligned_and_zero_copy_into_torch():
    torch = pytest.importorskip("torch")
    buf = alloc(10_000)
    assert buf.dtype == np.uint8 and buf.shape == (10_000,)
    assert buf.ctypes.data % 4096 == 0
    t = torch.from_numpy(buf)
    buf[123] = 45
    assert int(t[123]) == 45 and t.data_ptr() == buf.ctypes.data
    assert alloc(0).shape == (0,)


@pytest.mark.parametrize("knobs", [{"sqpoll": True}, {"rings": 2}, {"iopoll": True}])
def test_io_uring_knobs(knobs, data):
    """SQPOLL and several rings read the same bytes; IOPOLL needs a polled device queue, so
    where the device has none the read fails with a named OSError instead of hanging."""
    eng = _make_engine("io_uring", queue_depth=16, **knobs)
    rng = np.random.default_rng(3)
    offsets = rng.integers(0, FILE_SIZE // 4096, 2000) * 4096
    buf = alloc(2000 * 4096)
    with eng, eng.open(data[0]) as fh:
        try:
            eng.read_extents(fh, offsets, np.full(2000, 4096), buf, np.arange(2000) * 4096)
        except OSError as e:
            assert knobs == {"iopoll": True} and str(data[0]) in str(e)
            return
    assert np.array_equal(buf.reshape(2000, 4096), _pages(data)[offsets // 4096])
