"""Shared fixtures: the real datasets beside the repository and small generated stores."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from dgl.utils import set_num_threads

from gnnssd.storage_format.verified import CACHE_ENV

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "datasets"


def shared_dataset(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared dataset {'/'.join(parts)} not present beside the repository")
    return path


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """gnnssd's cache (the stores' verified stamps) in a folder of the session's, for every
    test and the processes tests start: never the user's ~/.cache."""
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("gnnssd-cache"))


@pytest.fixture(autouse=True)
def restore_threads():
    """`deterministic: true` pins torch and DGL to one thread; give later tests theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    set_num_threads(threads)


@pytest.fixture(scope="session")
def planetoid_root() -> Path:
    return shared_dataset("planetoid")


def random_graph_arrays(num_nodes: int = 300, num_edges: int = 2000, dim: int = 8,
                        classes: int = 4, seed: int = 0) -> dict:
    """A random labelled graph as plain arrays (input for ArraySource)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(num_nodes)
    return {
        "features": rng.standard_normal((num_nodes, dim)).astype(np.float32),
        "edges": (rng.integers(num_nodes, size=num_edges), rng.integers(num_nodes, size=num_edges)),
        "labels": rng.integers(classes, size=num_nodes),
        "splits": {"train": order[:100], "valid": order[100:150], "test": order[150:200]},
    }


def tiny_degree_store(folder: Path):
    """The `tiny` synthetic store in degree order, written into `folder` and opened; the test
    is skipped where the folder refuses O_DIRECT (tmpfs), which ssd mode needs."""
    from gnnssd.datasets import synthetic_source
    from gnnssd.sampler import node_order
    from gnnssd.storage_format import Store, write_store

    path = write_store(folder / "tiny", synthetic_source("tiny"), order=node_order("degree"))
    try:
        os.close(os.open(Path(path) / "features.bin", os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("the test directory refuses O_DIRECT (tmpfs?)")
    return Store.open(path)
