"""What the OGB layouts share (CSV and binary node property, link property): the split
folders ROOT/split/NAME and their one-number-per-line CSV files."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gnnssd.storage_format import DatasetError, contained

from .base import require_file


def resolve_split_name(root: Path, split_name: str | None) -> str:
    """`split_name`, or the only folder under ROOT/split when none is given."""
    split_root = root / "split"
    if split_name is None:
        names = sorted(p.name for p in split_root.iterdir() if p.is_dir()) if split_root.is_dir() else []
        if len(names) != 1:
            raise DatasetError(f"{split_root}: expected one split directory, found {names}; "
                               "name one with --split-name")
        split_name = names[0]
    return split_name


def read_column(path: Path, dtype: Any) -> np.ndarray:
    """A one-number-per-line (optionally gzipped) CSV file as an array."""
    try:
        frame = pd.read_csv(path, header=None, dtype=dtype)
    except (ValueError, OverflowError, OSError, EOFError, pd.errors.ParserError) as exc:
        raise DatasetError(f"{path}: cannot parse as one number per line ({exc})") from exc
    if frame.shape[1] != 1:
        raise DatasetError(f"{path}: {frame.shape[1]} columns, expected 1")
    return frame[0].to_numpy()


def read_splits(root: Path, split_name: str) -> dict[str, np.ndarray]:
    """ROOT/split/NAME/{train,valid,test}.csv.gz: node IDs, one per line."""
    folder = contained(root, "split", split_name, where="split")
    return {name: read_column(require_file(folder / f"{name}.csv.gz"), np.int64)
            for name in ("train", "valid", "test")}
