"""Path containment for every dataset reader: a name taken from a dataset's own files
(a node type, a relation, a metadata entry) must name a file inside the dataset folder."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import DatasetError


def contained(root: Path, *parts: str, where: str = "") -> Path:
    """`root / parts...`, refused (DatasetError naming `where` and the name) when the
    joined path, with `..` and symlinks resolved, leaves `root`: `../x` or an absolute
    name in a dataset's metadata must not pull in a file outside the dataset."""
    root = Path(root)
    path = root.joinpath(*parts)
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        named = "/".join(str(p) for p in parts)
        raise DatasetError(f"{path}: {where + ' ' if where else ''}{named!r} leads outside the dataset "
                           f"folder {root}; expected a name inside it")
    return path
