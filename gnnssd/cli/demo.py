"""`gnnssd demo`: the whole job on a tiny synthetic graph, in under a minute."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import yaml

from gnnssd.datasets import synthetic_source
from gnnssd.sampler import node_order
from gnnssd.storage_format import (SmallFileError, Store, atomic_file, atomic_write_bytes, output_lock,
                                   read_small_text, write_store)
from gnnssd.training import Trainer

DEMO_CONFIG = {
    "store": "store",
    "run_dir": "run",
    "seed": 0,
    "model": {"name": "sage", "hidden": 64, "layers": 2, "dropout": 0.5},
    "sampler": {"fanouts": [10, 10], "batch_size": 256},
    "train": {"epochs": 10, "lr": 0.01},
}


#: What a demo folder holds: its marker and the entries a run makes (all a rerun removes).
DEMO_MARKER = ".gnnssd-demo"
DEMO_ENTRIES = ("store", "run", "config.yaml", "predictions.npy")


def prepare_out(out: Path) -> None:
    """Make `out` ready for a demo: a new or empty folder, or an earlier demo's, whose own
    entries are removed (anything else in it is kept). A folder the demo did not make is
    refused rather than emptied."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"--out {out}: exists and is not a folder; choose a folder path for the demo")
    if out.exists() and any(out.iterdir()) and not (out / DEMO_MARKER).is_file() and not _earlier_demo(out):
        raise ValueError(f"--out {out}: a folder with files that the demo did not make (it has no "
                         f"{DEMO_MARKER}); the demo replaces only its own folder: choose another --out")
    for name in DEMO_ENTRIES:
        entry = out / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / DEMO_MARKER, b"made by gnnssd demo: a rerun replaces its entries\n")


def _earlier_demo(out: Path) -> bool:
    """A demo folder made before the marker existed: only the demo's entries, and its
    config.yaml the demo's own."""
    config = out / "config.yaml"
    if not set(p.name for p in out.iterdir()) <= set(DEMO_ENTRIES) or config.is_symlink() or not config.is_file():
        return False
    try:
        return read_small_text(config, 1 << 16, "the demo's config.yaml") == _demo_config_text()
    except SmallFileError:
        return False


def _demo_config_text() -> str:
    return yaml.safe_dump(DEMO_CONFIG, sort_keys=False)


def run_demo(out: Path, epochs: int = DEMO_CONFIG["train"]["epochs"]) -> None:
    """Generate -> preprocess -> train (`epochs`) -> evaluate -> predict, printing where
    things are; `out` locked (.NAME.lock beside it) so that a second demo into it is refused."""
    with output_lock(Path(out), "gnnssd demo"):
        _demo(Path(out), epochs)


def _demo(out: Path, epochs: int) -> None:
    prepare_out(out)
    print(f"[1/4] generating and preprocessing the 'tiny' synthetic graph into {out / 'store'}")
    write_store(out / "store", synthetic_source("tiny"), order=node_order("degree"))
    print(Store.open(out / "store").summary())
    config_path = out / "config.yaml"
    atomic_write_bytes(config_path, _demo_config_text().encode())
    print(f"[2/4] training GraphSAGE with {config_path}")
    trainer = Trainer(config_path, {"train.progress": False, "train.epochs": epochs})
    trainer.fit()
    print("[3/4] evaluating the best checkpoint")
    scores = {split: trainer.evaluate(split)["accuracy"] for split in ("train", "valid", "test")}
    print("      " + "  ".join(f"{k} accuracy {v:.4f}" for k, v in scores.items()))
    predictions = trainer.predict()
    with atomic_file(out / "predictions.npy") as f:
        np.save(f, predictions)
    print(f"[4/4] outputs: store {out / 'store'}, run {trainer.run_dir} (metrics.jsonl, "
          f"checkpoint.pt), predictions {out / 'predictions.npy'}")
    print(f"demo test accuracy: {scores['test']:.4f}")
