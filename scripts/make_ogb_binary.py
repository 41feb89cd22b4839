"""Write a papers100M-shaped dataset in OGB's binary node-property layout, in bounded memory.

    ROOT/raw/data.npz        edge_index (2, E) int64, node_feat (N, D) float32,
                             num_nodes_list, num_edges_list
    ROOT/raw/node-label.npz  node_label (N, 1) float32, NaN for unlabelled nodes
    ROOT/split/time/{train,valid,test}.csv.gz

The members are streamed into the zip one block at a time (stored by default, like
`np.savez`; `--deflate` for `np.savez_compressed`), so a 15 GB dataset needs ~100 MB.
Edges: uniform sources, destinations skewed towards low IDs (a heavy-tailed in-degree).
`--csv` also writes the same graph in OGB's CSV layout (edge.csv.gz, node-feat.csv.gz,
node-label.csv.gz) beside it, for comparing with readers of that layout only.

    python scripts/make_ogb_binary.py --nodes 20000000 --edges 300000000 --out DIR
"""
from __future__ import annotations

import argparse
import gzip
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

BLOCK = 1 << 21  # rows or edges generated at a time


def edge_blocks(nodes: int, edges: int, seed: int, side: int) -> Iterator[np.ndarray]:
    """Sources (side 0) or destinations (side 1), from their own reproducible streams."""
    rng = np.random.default_rng([seed, side])
    for lo in range(0, edges, BLOCK):
        n = min(BLOCK, edges - lo)
        if side == 0:
            yield rng.integers(nodes, size=n, dtype=np.int64)
        else:
            yield (nodes * rng.random(n) ** 2).astype(np.int64)


def feature_blocks(nodes: int, dim: int, seed: int) -> Iterator[np.ndarray]:
    rng = np.random.default_rng([seed, 2])
    for lo in range(0, nodes, BLOCK // 4):
        yield rng.random((min(BLOCK // 4, nodes - lo), dim), dtype=np.float32)


def write_member(archive: zipfile.ZipFile, name: str, shape: tuple[int, ...], dtype: str,
                 blocks: Iterator[np.ndarray]) -> None:
    with archive.open(f"{name}.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.dtype(dtype).str,
                                                 "fortran_order": False, "shape": shape})
        for block in blocks:
            f.write(np.ascontiguousarray(block, dtype=dtype).data)


def labels_and_splits(nodes: int, classes: int, labelled: float, seed: int):
    rng = np.random.default_rng([seed, 3])
    labels = np.full(nodes, np.nan, dtype=np.float32)
    ids = rng.choice(nodes, size=int(nodes * labelled), replace=False)
    labels[ids] = rng.integers(classes, size=ids.size)
    cut1, cut2 = int(ids.size * 0.78), int(ids.size * 0.86)  # papers100M's 78/8/14 split
    return labels, {"train": ids[:cut1], "valid": ids[cut1:cut2], "test": ids[cut2:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--edges", type=int, required=True)
    parser.add_argument("--feat-dim", type=int, default=128)
    parser.add_argument("--classes", type=int, default=172)
    parser.add_argument("--labelled", type=float, default=0.014, help="fraction of labelled nodes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deflate", action="store_true", help="compress members (savez_compressed)")
    parser.add_argument("--csv", action="store_true", help="also write OGB's CSV layout")
    parser.add_argument("--out", required=True, help="dataset root to create")
    args = parser.parse_args()
    root = Path(args.out)
    (root / "raw").mkdir(parents=True)
    (root / "split" / "time").mkdir(parents=True)
    n, e, d = args.nodes, args.edges, args.feat_dim

    method = zipfile.ZIP_DEFLATED if args.deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(root / "raw" / "data.npz", "w", compression=method, allowZip64=True) as z:
        write_member(z, "edge_index", (2, e), "<i8",
                     (b for side in (0, 1) for b in edge_blocks(n, e, args.seed, side)))
        write_member(z, "node_feat", (n, d), "<f4", feature_blocks(n, d, args.seed))
        write_member(z, "num_nodes_list", (1,), "<i8", iter([np.array([n])]))
        write_member(z, "num_edges_list", (1,), "<i8", iter([np.array([e])]))
    labels, splits = labels_and_splits(n, args.classes, args.labelled, args.seed)
    np.savez_compressed(root / "raw" / "node-label.npz", node_label=labels.reshape(-1, 1))
    for name, ids in splits.items():
        pd.DataFrame(ids).to_csv(root / "split" / "time" / f"{name}.csv.gz", index=False,
                                 header=False, compression="gzip")
    if args.csv:
        write_csv_layout(root, n, e, d, labels, args.seed)
    print(f"{root}: {n:,} nodes, {e:,} edges, {d}-dim float32 features")


def write_csv_layout(root: Path, n: int, e: int, d: int, labels: np.ndarray, seed: int) -> None:
    """The same graph as OGB's CSV files (what `gnnssd preprocess ogb` read before)."""
    with gzip.open(root / "raw" / "edge.csv.gz", "wt", compresslevel=1) as f:
        for src, dst in zip(edge_blocks(n, e, seed, 0), edge_blocks(n, e, seed, 1)):
            pd.DataFrame({"s": src, "d": dst}).to_csv(f, index=False, header=False)
    with gzip.open(root / "raw" / "node-feat.csv.gz", "wt", compresslevel=1) as f:
        for block in feature_blocks(n, d, seed):
            pd.DataFrame(block).to_csv(f, index=False, header=False, float_format="%.9g")
    pd.DataFrame(labels).to_csv(root / "raw" / "node-label.csv.gz", index=False, header=False,
                                compression="gzip")


if __name__ == "__main__":
    main()
