"""Reading a store: the manifest, the topology and metadata arrays, and the feature file."""
from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import crc32_of_file
from .errors import StoreError
from .manifest import FEATURES, MANIFEST, read_manifest


def _array_file(name: str, doc: str) -> cached_property:
    def load(self: "Store") -> np.ndarray:
        return np.load(self.path / f"{name}.npy", mmap_mode="r")

    load.__doc__ = doc
    return cached_property(load)


class Store:
    """A complete store directory, opened read-only.

    Opening checks the manifest, every file's size, and the checksums of all files
    except features.bin (cheap next to loading them); `verify()` also checks
    features.bin, which may be far larger than memory.
    """

    def __init__(self, path: Path, manifest: dict[str, Any]):
        self.path = path
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path, verify: bool = False) -> "Store":
        path = Path(path)
        store = cls(path, read_manifest(path))
        store._check_sizes()
        for name in store.manifest["files"]:
            if name != FEATURES:
                store._check_crc(name)
        if verify:
            store._check_crc(FEATURES)
        return store

    def verify(self) -> list[str]:
        """Check every file's checksum; returns the names checked, raises on the first bad one."""
        self._check_sizes()
        for name in self.manifest["files"]:
            self._check_crc(name)
        return sorted(self.manifest["files"])

    def _check_sizes(self) -> None:
        for name, meta in self.manifest["files"].items():
            file = self.path / name
            if not file.is_file():
                raise StoreError(f"{file}: missing from the store")
            size = file.stat().st_size
            if size != meta["size"]:
                raise StoreError(f"{file}: size {size} bytes, manifest says {meta['size']} "
                                 "(truncated or overwritten)")

    def _check_crc(self, name: str) -> None:
        file = self.path / name
        crc = crc32_of_file(file)
        if crc != self.manifest["files"][name]["crc32"]:
            raise StoreError(f"{file}: checksum mismatch (crc32 {crc:#010x}, manifest "
                             f"{self.manifest['files'][name]['crc32']:#010x}); the file is corrupt")

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of manifest.json's bytes: the manifest holds every file's size and
        checksum, so two stores with the same fingerprint hold the same data."""
        return hashlib.sha256((self.path / MANIFEST).read_bytes()).hexdigest()

    # Topology and metadata: memory-mapped .npy files, opened on first use.
    indptr = _array_file("indptr", "CSC offsets: node v's sources are indices[indptr[v]:indptr[v+1]].")
    indices = _array_file("indices", "CSC sources (in-neighbours), sorted within each node.")
    labels = _array_file("labels", "Class per store node (-1: unlabelled).")
    perm = _array_file("perm", "perm[store_id] = original node ID.")
    inv = _array_file("inv", "inv[original_id] = store node ID.")
    train_idx = _array_file("train_idx", "Training nodes (store IDs, sorted).")
    valid_idx = _array_file("valid_idx", "Validation nodes (store IDs, sorted).")
    test_idx = _array_file("test_idx", "Test nodes (store IDs, sorted).")

    def split(self, name: str) -> np.ndarray:
        if name not in ("train", "valid", "test"):
            raise ValueError(f"split {name!r}: expected 'train', 'valid' or 'test'")
        return getattr(self, f"{name}_idx")

    # Scalars.
    @property
    def num_nodes(self) -> int:
        return int(self.manifest["num_nodes"])

    @property
    def num_edges(self) -> int:
        return int(self.manifest["num_edges"])

    @property
    def num_classes(self) -> int:
        return int(self.manifest["num_classes"])

    @property
    def feat_dim(self) -> int:
        return int(self.manifest["features"]["dim"])

    @property
    def feat_dtype(self) -> np.dtype:
        return np.dtype(self.manifest["features"]["dtype"])

    @property
    def row_bytes(self) -> int:
        return int(self.manifest["features"]["row_bytes"])

    @property
    def features_path(self) -> Path:
        return self.path / FEATURES

    @property
    def feature_bytes(self) -> int:
        """Bytes of feature rows (without the page padding at the end of the file)."""
        return self.num_nodes * self.row_bytes

    def features_memmap(self) -> np.memmap:
        """The feature matrix (num_nodes, dim), memory-mapped: pages load on access."""
        return np.memmap(self.features_path, dtype=self.feat_dtype, mode="r",
                         shape=(self.num_nodes, self.feat_dim))

    def summary(self) -> str:
        m = self.manifest
        lines = [
            f"store        {self.path}",
            f"name         {m.get('name', '?')}",
            f"nodes        {self.num_nodes:,}",
            f"edges        {self.num_edges:,} (in-edges, CSC; indices {self.indices.dtype})",
            f"features     {self.feat_dim} x {self.feat_dtype} = {self.row_bytes} B/row, "
            f"{self.feature_bytes / 2**20:,.1f} MiB",
            f"classes      {self.num_classes}",
            f"splits       train {len(self.train_idx):,} / valid {len(self.valid_idx):,} / "
            f"test {len(self.test_idx):,}",
            f"node order   {m['order']}",
            f"created      {m.get('created', '?')} by gnnssd {m.get('gnnssd_version', '?')}",
        ]
        return "\n".join(lines)
