#!/usr/bin/env python3
"""The arithmetic of gnnssd's read amplification at one memory budget: per mini-batch, its
input rows, its cold rows (NumPy unique of the input rows minus the loader's hot rows), the
4 KiB pages those lie on, and what the loader read (its io_stats), over the first mini-batches
of epoch 1 (fanouts 15,10,5, batch 1024, as scripts/bench_train.py).

    python scripts/read_arithmetic.py STORE [--budget 153MiB] [--block-budget 0] [--batches 12]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from gnnssd import NodeLoader
from gnnssd.storage_format import Store

PAGE = 4096


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", type=Path)
    p.add_argument("--budget", default="153MiB")
    p.add_argument("--block-budget", default="0")
    p.add_argument("--batches", type=int, default=12)
    args = p.parse_args()
    store = Store.open(args.store)
    with NodeLoader(store, store.train_idx, fanouts=[15, 10, 5], batch_size=1024, features="ssd",
                    memory_budget=args.budget, block_budget=args.block_budget, shuffle=True, seed=0,
                    device="cpu", eval_fanouts=[15, 10, 5], eval_batch_size=1024) as loader:
        backend = loader.backend
        print(backend.budget.describe())
        loader.set_epoch(1)
        loader.io_stats()  # from here on
        inputs, cold, pages = [], [], []
        for batch in loader:
            rows = np.asarray(store.inv)[batch.input_nodes.numpy()]  # store rows
            outside = np.setdiff1d(rows, backend.hot.members.rows)
            inputs.append(len(rows))
            cold.append(len(outside))
            pages.append(len(np.unique(outside * store.row_bytes // PAGE)))
            if len(inputs) == args.batches:
                break
        io = loader.io_stats()
    n, file_pages = len(inputs), -(-store.feature_bytes // PAGE)
    share = np.mean(cold) / store.num_nodes
    touched = np.mean(pages) / file_pages
    print(f"per mini-batch over {n}: input rows {np.mean(inputs):,.0f}, cold rows {np.mean(cold):,.0f} "
          f"({share:.1%} of the rows), pages touched {np.mean(pages):,.0f} of {file_pages:,} "
          f"({touched:.1%}; uniform rows would touch {1 - (1 - share) ** (PAGE // store.row_bytes):.1%})")
    print(f"pages / useful bytes {touched / share:.2f}; the loader read {io['bytes_read'] / io['useful_bytes']:.2f}x "
          f"its useful bytes ({io['bytes_read']:,} / {io['useful_bytes']:,}, with up to two plans read ahead)")


if __name__ == "__main__":
    main()
