"""The ssd loader's packer processes under faults: kill -9 of a packer, Ctrl-C, a full scratch
disk. Each gives a clear error (or a clean stop), leaves no scratch and no packer behind, and
never hangs: every run is a child process under a timeout."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gnnssd.datasets import synthetic_source
from gnnssd.sampler import node_order
from gnnssd.storage_format import write_store
from tests.conftest import REPO

#: A child that opens an ssd loader with one packer and compact blocks (the packers' path)
#: on the store argv[1], scratch under argv[2], and takes the first mini-batch.
_OPEN = """
import os, signal, sys, time
import numpy as np, psutil
from gnnssd import NodeLoader
from gnnssd.pipeline.packers import PackerError
from gnnssd.storage_format import Store
store = Store.open(sys.argv[1])
scratch = sys.argv[2]
loader = NodeLoader(store, store.original_ids(np.asarray(store.train_store_ids)), fanouts=[5, 5], batch_size=200,
                    features="ssd", memory_budget="24MiB", block_budget="8MiB", packers=1, mega_batch=4,
                    hot_fraction=0.3, seed=3, shuffle=True, device="cpu", scratch_dir=scratch)
batches = iter(loader)
next(batches)
packers = psutil.Process().children()
print("packers", len(packers), flush=True)
"""
_AFTER = """
loader.close()
alive = [p.pid for p in packers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
print("left", sorted(os.listdir(scratch)), "packers alive", alive, flush=True)
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """20k nodes x 64 float32 (5 MiB): several packer windows at the budgets above."""
    source = synthetic_source(num_nodes=20_000, feat_dim=64, num_classes=8, avg_degree=10, train_fraction=0.3)
    path = write_store(tmp_path_factory.mktemp("packers") / "store", source, order=node_order("degree"))
    try:
        os.close(os.open(Path(path) / "features.bin", os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("the test directory refuses O_DIRECT (tmpfs?)")
    return Path(path)


def _child(body: str, store: Path, scratch: Path, **options) -> subprocess.Popen:
    scratch.mkdir()
    return subprocess.Popen([sys.executable, "-c", _OPEN + body + _AFTER, str(store), str(scratch)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options)


#: The child's loop over the mini-batches: the packer's error printed, or that none came.
_DRAIN = """
try:
    for _ in batches:
        pass
    print("no error")
except PackerError as exc:
    print("error:", exc, flush=True)
"""


def test_a_killed_packer_stops_training_with_an_error_naming_it(store, tmp_path):
    """kill -9 of the packer: the next window it owed is an error naming the packer, its
    process and the signal, raised within seconds (not a hang); no scratch is left."""
    body = ("packers[0].kill()\nstart = time.monotonic()\n" + _DRAIN
            + 'print("seconds", round(time.monotonic() - start, 1), flush=True)\n')
    proc = _child(body, store, tmp_path / "scratch")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "packers 1" in out, out
    assert "error: packer 0 (process " in out and "was killed by SIGKILL" in out, out
    assert "left [] packers alive []" in out, out


def test_a_packer_killed_between_epochs_is_replaced_by_the_next(store, tmp_path, caplog):
    """kill -9 of the packer while it waits for the next epoch (packers outlive a stream):
    the next epoch starts a new one, with a warning naming the dead one and how it died, and
    gives the store's rows; closing the loader leaves no scratch and no packer."""
    import numpy as np
    import psutil

    from gnnssd import NodeLoader
    from gnnssd.storage_format import Store

    opened = Store.open(store)
    features = opened.features_memmap()
    with NodeLoader(opened, opened.original_ids(np.asarray(opened.train_store_ids)), fanouts=[5, 5],
                    batch_size=200, features="ssd", memory_budget="24MiB", block_budget="8MiB", packers=1,
                    mega_batch=4, hot_fraction=0.3, seed=3, shuffle=True, device="cpu",
                    scratch_dir=tmp_path / "scratch") as loader:
        starts = loader.backend.packer_start_cpu_s
        for epoch in (1, 2):
            if epoch == 2:
                (killed,) = starts
                os.kill(killed, signal.SIGKILL)
                # dead (its leader a zombie, its other threads gone: only then can it be
                # waited for) and not reaped: the pool reads how it ended
                deadline = time.monotonic() + 30
                while (psutil.Process(killed).status() != psutil.STATUS_ZOMBIE
                       or len(os.listdir(f"/proc/{killed}/task")) > 1) and time.monotonic() < deadline:
                    time.sleep(0.05)
            loader.set_epoch(epoch)
            seen = 0
            for batch in loader:
                np.testing.assert_array_equal(batch.x.numpy(), features[opened.store_ids(batch.input_nodes.numpy())])
                seen += 1
            assert seen == len(loader)
        assert len(starts) == 2 and killed in starts  # a new packer for epoch 2
        packers = psutil.Process().children()
    assert f"packer 0 (process {killed}) was killed by SIGKILL since the last stream; starting new" in caplog.text
    assert not [p for p in packers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert os.listdir(tmp_path / "scratch") == []


def test_ctrl_c_with_packers_stops_cleanly(store, tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it): the packers ignore
    it and keep their windows; the trainer gets KeyboardInterrupt, and closing the loader
    ends the packers and removes the scratch."""
    body = """
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's Python, whatever its parent ignored
print("ready", flush=True)
try:
    for _ in batches:
        time.sleep(0.2)
    print("no interrupt")
except KeyboardInterrupt:
    print("interrupted; packers alive", [p.pid for p in packers if p.status() != psutil.STATUS_ZOMBIE], flush=True)
"""
    proc = _child(body, store, tmp_path / "scratch", start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith("ready"):
                break
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "interrupted; packers alive [" in out and "packers alive []\n" not in out.split("left")[0], out
    assert "left [] packers alive []" in out, out


def test_a_full_scratch_disk_names_the_block_file_and_its_disk(store, tmp_path):
    """The packer's compact block meets a full disk (the file-size limit's EFBIG, inherited
    by the packer process): an error naming the packer, the block file, its disk and
    ssd.block_budget: 0; no scratch left."""
    body = _DRAIN
    limit = ("import resource, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 18, 1 << 18))\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.run([sys.executable, "-c", limit + _OPEN + body + _AFTER, str(store), str(scratch)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "error: packer 0 (process " in out, out
    assert f"{scratch / 'blocks'}" in out and ".bin: cannot write (File too large) on the file system of " in out, out
    assert "ssd.block_budget: 0" in out, out
    assert "left [] packers alive []" in out, out


def test_a_packer_stalled_at_its_start_holds_up_neither_the_first_minibatch_nor_the_close(tmp_path):
    """A packer's interpreter that never gets to read its spec (a stalled start: here an
    interpreter that only sleeps): the trainer hands out the first mini-batch (its own
    window) and closing the loader kills the packer, leaving no scratch. The spec (the hot
    rows) is larger than the socket's buffer, so sending it waits for the packer to read it:
    the trainer's thread did that wait, before the first mini-batch, and here never ended."""
    source = synthetic_source(num_nodes=80_000, feat_dim=16, num_classes=8, avg_degree=10, train_fraction=0.3)
    store = write_store(tmp_path / "store", source, order=node_order("degree"))
    stalled = tmp_path / "stalled-python"
    stalled.write_text("#!/bin/sh\nexec sleep 600\n")
    stalled.chmod(0o755)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    program = f"""
import os, pickle, socket, sys
import numpy as np, psutil
from gnnssd import NodeLoader
from gnnssd.storage_format import Store
store = Store.open(sys.argv[1])
loader = NodeLoader(store, store.original_ids(np.asarray(store.train_store_ids)), fanouts=[5, 5], batch_size=200,
                    eval_fanouts=[5, 5], eval_batch_size=200, features="ssd", memory_budget="32MiB",
                    block_budget="256KiB", packers=1, mega_batch=4, hot_fraction=0.3, seed=3, shuffle=True,
                    device="cpu", scratch_dir=sys.argv[2])
spec = len(pickle.dumps(loader.backend._packer_spec()))
print("spec over the socket buffer", spec > socket.socketpair()[0].getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
sys.executable = {str(stalled)!r}
batches = iter(loader)
next(batches)
packers = psutil.Process().children()
print("first mini-batch; packers", len(packers), flush=True)
loader.close()
print("left", sorted(os.listdir(sys.argv[2])), "packers alive", [p.pid for p in packers if p.is_running()
      and p.status() != psutil.STATUS_ZOMBIE], flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", program, str(store), str(scratch)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the trainer hung with a stalled packer: {out}")
    assert proc.returncode == 0, err[-3000:]
    assert "spec over the socket buffer True" in out, out
    assert "first mini-batch; packers 1" in out, out
    assert "left [] packers alive []" in out, out
