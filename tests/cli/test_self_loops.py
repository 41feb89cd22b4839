"""`gnnssd preprocess --self-loops`: every node gets exactly one edge to itself."""
from __future__ import annotations

import numpy as np

from gnnssd.cli.commands import main
from gnnssd.storage_format import Store


def _loops(store: Store) -> np.ndarray:
    """How many times each node is its own in-neighbour."""
    indptr, indices = np.asarray(store.indptr), np.asarray(store.indices)
    dst = np.repeat(np.arange(store.num_nodes), np.diff(indptr))
    return np.bincount(dst[indices == dst], minlength=store.num_nodes)


def test_preprocess_adds_one_self_loop_per_node(tmp_path) -> None:
    common = ["preprocess", "synthetic", "--preset", "tiny", "--order", "degree"]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert main([*common, "--self-loops", "--out", str(tmp_path / "loops")]) == 0
    plain, loops = Store.open(tmp_path / "plain"), Store.open(tmp_path / "loops")
    assert (_loops(loops) == 1).all()
    assert loops.num_edges == plain.num_edges + int((_loops(plain) == 0).sum())
    assert loops.manifest["preprocess"]["source"]["self_loops"] is True
    np.testing.assert_array_equal(loops.train_idx, plain.train_idx)
