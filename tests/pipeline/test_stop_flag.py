"""Stopping the background stages: a closing PlanWorker stops the item in progress at its
next check (repack: between staging chunks, not at the window's end), and an ssd loader
closed in the middle of an epoch joins its threads and removes its scratch."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from gnnssd.datasets import synthetic_source
from gnnssd.pipeline.direct_io import DirectIO
from gnnssd.pipeline.repack import repack
from gnnssd.pipeline.worker import PlanWorker, Stopped, check_stop, stops_with
from gnnssd.sampler import node_order
from gnnssd.sampler.graphs import random_csc
from gnnssd.sampler.plan import PlanConfig, Planner
from gnnssd.sampler.readplan import CostModel, windows
from gnnssd.sampler.seed_order import Shuffled, seed_batches
from gnnssd.storage_format import write_store

#: A bound no healthy close comes near (it returns within a poll or a chunk), generous for a
#: loaded machine: a close that waits for an endless item never meets it.
GENEROUS_S = 60


def _closed_within(worker: PlanWorker, seconds: float) -> bool:
    closing = threading.Thread(target=worker.close, daemon=True)
    closing.start()
    closing.join(seconds)
    return not closing.is_alive()


def test_close_stops_an_endless_item_at_its_next_check():
    """An item that never ends unless stopped (a stage checking between its chunks): close
    returns, and the item stopped at a check, after close was asked."""
    started, checks_after_close = threading.Event(), []
    closing = threading.Event()

    def endless():
        yield "first"
        started.set()
        while True:
            if closing.is_set():
                checks_after_close.append(1)
            check_stop()
            time.sleep(0.001)

    worker = PlanWorker(endless(), depth=3)
    assert next(iter(worker)) == "first"
    assert started.wait(GENEROUS_S)
    closing.set()
    assert _closed_within(worker, GENEROUS_S)
    assert len(checks_after_close) >= 1


def test_check_stop_outside_a_worker_does_nothing():
    check_stop()
    flag = threading.Event()
    with stops_with(flag):
        check_stop()
        flag.set()
        with pytest.raises(Stopped):
            check_stop()
    check_stop()  # the flag is this thread's only inside stops_with


class CountingIO(DirectIO):
    """The real engine; counts the staging chunks of each scan and sets `flag` as the first
    arrives (a close asked while the scan runs)."""

    def __init__(self, flag: threading.Event | None = None, **kwargs):
        super().__init__(**kwargs)
        self.flag, self.chunks = flag, 0

    def iter_rows(self, *args):
        for chunk in super().iter_rows(*args):
            self.chunks += 1
            if self.flag is not None:
                self.flag.set()
            yield chunk


@pytest.fixture(scope="module")
def window(tmp_path_factory):
    """A window of block plans over a 6000 x 24 float32 features file, and its scan."""
    folder = tmp_path_factory.mktemp("repack")
    indptr, indices = random_csc(6000, 8, seed=7, communities=20)
    train = np.random.default_rng(3).choice(6000, 2000, replace=False)
    feats = np.random.default_rng(4).standard_normal((6000, 24)).astype(np.float32)
    path = folder / "features.bin"
    path.write_bytes(feats.tobytes() + bytes(-feats.nbytes % 4096))
    planner = Planner(indptr, indices, PlanConfig(fanouts=(5, 4), mega_batch=3, seed=21))
    plans = list(planner.plan_batches(seed_batches(train, 128, Shuffled(), 21, 0), 0))
    model = CostModel(request_s=1e-3, read_bw=1e9, write_bw=1e9, max_request=64 << 10)
    for plans_of_window, scan in windows(plans, 24 * 4, model, 1 << 30):
        if any(p.read.strategy == "block" for p in plans_of_window):
            return path, plans_of_window, scan
    pytest.fail("no window with a compact block")


def test_repack_stops_between_staging_chunks(window, tmp_path):
    """With the stop flag raised while the first staging chunk is read, the scan stops
    there: one chunk read of the many the window's scan takes."""
    path, plans, scan = window
    whole = CountingIO(queue_depth=8)
    assert repack(whole, path, 96, plans, scan, tmp_path / "whole", staging_bytes=8192) > 0
    assert whole.chunks > 2
    flag = threading.Event()
    stopped = CountingIO(flag, queue_depth=8)
    with stops_with(flag), pytest.raises(Stopped):
        repack(stopped, path, 96, plans, scan, tmp_path / "stopped", staging_bytes=8192)
    assert stopped.chunks == 1
    whole.shutdown()
    stopped.shutdown()


def test_ssd_loader_closed_in_the_middle_of_an_epoch_leaves_no_scratch(tmp_path):
    from gnnssd.core.config import config_from_dict
    from gnnssd.training.tasks import Trainer

    source = synthetic_source(num_nodes=20_000, feat_dim=64, num_classes=8, avg_degree=10, train_fraction=0.3)
    store = write_store(tmp_path / "store", source, order=node_order("degree"))
    trainer = Trainer(config_from_dict({
        "store": str(store), "run_dir": str(tmp_path / "run"), "features": "ssd", "seed": 3,
        "model": {"name": "sage", "hidden": 32}, "sampler": {"fanouts": [5, 5], "batch_size": 200},
        "train": {"epochs": 1, "progress": False},
        "ssd": {"memory_budget": "24MiB", "mega_batch": 2, "hot_fraction": 0.3, "block_budget": "8MiB"}}))
    loader = trainer.loader
    loader.set_epoch(1)
    batches = iter(loader)
    for _ in batches:  # until the packers' windows are under way
        if loader.backend.block_dir.exists():  # the epoch's scratch, blocks being repacked
            break
    assert loader.backend.block_dir.exists()
    batches.close()  # what a Ctrl-C in the training loop does to the loader
    assert not loader.backend.block_dir.exists()
    # the packers wait for the loader's next epoch: only the threads that send them windows are left
    assert not [t.name for t in threading.enumerate() if t.name.startswith("gnnssd-") and t.is_alive()
                and t.name != "gnnssd-packers-send"]
    trainer.close()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("gnnssd-") and t.is_alive()]
