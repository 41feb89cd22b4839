"""`sampler.reuse_epochs`: K epochs trained on one epoch's samples; in ssd mode the group's
later epochs replay the kept plans and compact blocks instead of sampling and repacking."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import gnnssd
from gnnssd.core.config import ConfigError, config_from_dict
from gnnssd.datasets import synthetic_source
from gnnssd.sampler import node_order
from gnnssd.storage_format import Store, write_store
from gnnssd.training.tasks import Trainer


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """20k nodes x 64 float32 = 5 MiB of features, far more than the 24 MiB budget's buffers
    take in one mega-batch: blocks are repacked."""
    source = synthetic_source(num_nodes=20_000, feat_dim=64, num_classes=8, avg_degree=10, train_fraction=0.3)
    path = write_store(tmp_path_factory.mktemp("reuse") / "store", source, order=node_order("degree"))
    return Store.open(path)


def _loader(store: Store, features: str, scratch: Path | None = None, batch_size: int = 200,
            **options) -> gnnssd.NodeLoader:
    options = {"memory_budget": "24MiB", "block_budget": "8MiB", "mega_batch": 4, "hot_fraction": 0.3,
               **options} if features == "ssd" else options
    return gnnssd.NodeLoader(store, store.train_idx, fanouts=[5, 5], batch_size=batch_size, features=features,
                             shuffle=True, seed=3, scratch_dir=scratch, eval_batch_size=batch_size, **options)


def _epoch(loader: gnnssd.NodeLoader, epoch: int) -> tuple[list[tuple[np.ndarray, ...]], dict[str, int]]:
    """Each mini-batch's seeds, input nodes, first block's edges and x; the epoch's disk counters."""
    loader.set_epoch(epoch)
    loader.io_stats()
    batches = []
    for mb in loader:
        src, dst = mb.blocks[0].edges()
        batches.append((mb.output_nodes.numpy(), mb.input_nodes.numpy(), src.numpy(), dst.numpy(),
                        mb.x.numpy().copy()))
    return batches, loader.io_stats()


def _same(a: list[tuple[np.ndarray, ...]], b: list[tuple[np.ndarray, ...]]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for p, q in zip(a, b) for x, y in zip(p, q))


def test_ssd_epochs_of_a_group_replay_the_first_ones_samples_from_disk(store: Store, tmp_path: Path) -> None:
    features = store.features_memmap()
    with _loader(store, "ssd", tmp_path / "scratch", reuse_epochs=2) as loader:
        first, io0 = _epoch(loader, 0)
        kept = loader.backend.kept_dir
        assert kept.exists() and any(kept.glob("block_*")) and any(kept.glob("plan_*"))
        assert not loader.backend.block_dir.exists()
        replayed, io1 = _epoch(loader, 1)
        assert _same(first, replayed)
        for _, inputs, *_, x in replayed:  # the rows on disk, by a plain memmap read
            np.testing.assert_array_equal(x, features[np.asarray(store.inv)[inputs]])
        # epoch 0 sampled, repacked (read features.bin, wrote blocks) and read the blocks;
        # epoch 1 read only the kept blocks (whole files) and the kept plans' page reads
        plans = loader.backend._kept.plans
        blocks = sum((kept / p.read.block).stat().st_size for p in plans if p.read.strategy == "block")
        pages = sum(p.read.nbytes for p in plans if p.read.strategy == "pages")
        assert blocks > 0 and io1["bytes_read"] == blocks + pages < io0["bytes_read"]
        assert io0["bytes_written"] > 0 and io1["bytes_written"] == 0
        assert io1["useful_bytes"] == io0["useful_bytes"]
        # the next group draws new samples and drops the kept ones
        fresh, _ = _epoch(loader, 2)
        assert not _same(first, fresh)
        assert sorted(np.concatenate([b[0] for b in fresh])) == sorted(store.train_idx)
    assert not kept.exists()


def test_a_group_matches_an_unreused_loaders_first_epoch(store: Store, tmp_path: Path) -> None:
    """Reuse changes which samples later epochs see, never the samples themselves."""
    with _loader(store, "ssd", tmp_path / "a", reuse_epochs=3) as reused, _loader(store, "ssd", tmp_path / "b") as plain:
        expected, _ = _epoch(plain, 3)
        assert _same(_epoch(reused, 4)[0], expected)  # epoch 4 trains on epoch 3's samples
        assert _same(_epoch(reused, 5)[0], expected)


def test_evaluation_between_epochs_leaves_the_kept_epoch(store: Store, tmp_path: Path) -> None:
    with _loader(store, "ssd", tmp_path / "scratch", reuse_epochs=2) as loader:
        first, _ = _epoch(loader, 0)
        view = loader.with_seeds(np.asarray(store.valid_idx), fanouts=[5, 5], batch_size=200)
        assert sum(len(mb.output_nodes) for mb in view) == len(store.valid_idx)
        replayed, io = _epoch(loader, 1)
        assert _same(first, replayed) and io["bytes_written"] == 0


def test_an_epoch_left_early_keeps_nothing(store: Store, tmp_path: Path) -> None:
    with _loader(store, "ssd", tmp_path / "scratch", reuse_epochs=2) as loader:
        loader.set_epoch(0)
        batches = iter(loader)
        next(batches)
        batches.close()
        assert not loader.backend.kept_dir.exists()
        # the next epoch of the group samples the same mini-batches again, the usual way
        again, io = _epoch(loader, 1)
        assert io["bytes_written"] > 0
        with _loader(store, "ssd", tmp_path / "plain") as plain:
            assert _same(again, _epoch(plain, 0)[0])


def test_past_the_disk_share_nothing_is_kept(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """A disk too full to keep an epoch: a warning, the files deleted as usual, and the next
    epoch reads the same samples again."""
    monkeypatch.setattr("gnnssd.core.budget.AUTO_DISK_SHARE", 1e-12)
    with _loader(store, "ssd", tmp_path / "scratch", reuse_epochs=2) as loader:
        with caplog.at_level(logging.WARNING, logger="gnnssd.ssd"):
            first, _ = _epoch(loader, 0)
        assert "sampler.reuse_epochs" in caplog.text and "share of the free disk" in caplog.text
        assert not loader.backend.kept_dir.exists()
        again, io = _epoch(loader, 1)
        assert _same(first, again) and io["bytes_written"] > 0


def test_extents_only_plans_are_kept_and_replayed(store: Store, tmp_path: Path) -> None:
    with _loader(store, "ssd", tmp_path / "scratch", reuse_epochs=2, block_budget=0) as loader:
        first, io0 = _epoch(loader, 0)
        assert not any(loader.backend.kept_dir.glob("block_*")) and any(loader.backend.kept_dir.glob("plan_*"))
        replayed, io1 = _epoch(loader, 1)
        assert _same(first, replayed) and io1["bytes_read"] == io0["bytes_read"]


def test_minibatches_read_in_pieces_are_replayed_whole(store: Store, tmp_path: Path) -> None:
    """A budget whose buffers hold less than a mini-batch's cold rows: its pieces are kept
    and replayed, and x is assembled from them again."""
    features = store.features_memmap()
    with _loader(store, "ssd", tmp_path / "scratch", batch_size=1000, memory_budget="14.5MiB",
                 block_budget=0, reuse_epochs=2) as loader:
        first, _ = _epoch(loader, 0)
        assert max(p.pieces for p in loader.backend._kept.plans) > 1
        replayed, io = _epoch(loader, 1)
        assert _same(first, replayed) and io["bytes_read"] > 0
        for _, inputs, *_, x in replayed:
            np.testing.assert_array_equal(x, features[np.asarray(store.inv)[inputs]])


def test_memory_mode_reuses_the_seed_order_and_draws(store: Store) -> None:
    with _loader(store, "memory", reuse_epochs=2) as loader:
        loader.set_epoch(0)
        order0 = loader.seed_batches()
        loader.set_epoch(1)
        assert loader.sample_epoch == 0 and all(np.array_equal(a, b) for a, b in zip(order0, loader.seed_batches()))
        loader.set_epoch(2)
        assert loader.sample_epoch == 2 and not np.array_equal(order0[0], loader.seed_batches()[0])
    with _loader(store, "memory", reuse_epochs=3, first_epoch=1) as loader:  # the Trainer's numbering
        assert [(loader.set_epoch(e), loader.sample_epoch)[1] for e in range(8)] == [0, 1, 1, 1, 4, 4, 4, 7]
    with pytest.raises(ValueError, match="reuse_epochs: 0"):
        _loader(store, "memory", reuse_epochs=0)


def test_trainer_with_reuse_epochs_learns_in_ssd_mode(store: Store, tmp_path: Path) -> None:
    cfg = config_from_dict({
        "store": str(store.path), "run_dir": str(tmp_path / "run"), "features": "ssd", "seed": 3,
        "model": {"name": "sage", "hidden": 32},
        "sampler": {"fanouts": [5, 5], "batch_size": 200, "eval_fanouts": [5, 5], "eval_batch_size": 200,
                    "reuse_epochs": 2},
        "train": {"epochs": 4, "lr": 0.01, "progress": False},
        "ssd": {"memory_budget": "24MiB", "block_budget": "8MiB", "mega_batch": 4, "hot_fraction": 0.3}})
    trainer = Trainer(cfg)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    written = [h["io"]["bytes_written"] for h in history]
    assert written[0] > 0 and written[1] == 0 and written[2] > 0 and written[3] == 0
    assert history[-1]["train_acc"] > 0.5


@pytest.mark.parametrize(("overrides", "message"), [
    ({"sampler": {"reuse_epochs": 0}}, "sampler.reuse_epochs"),
    ({"task": "link", "sampler": {"reuse_epochs": 2}}, "sampler.reuse_epochs: 2 with task: link"),
])
def test_bad_reuse_settings_name_the_key(tmp_path: Path, overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"store": "s", "run_dir": str(tmp_path), **overrides}).validate()
