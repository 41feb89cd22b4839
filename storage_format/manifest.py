"""The store's manifest: what a complete store holds, written last and atomically."""
from __future__ import annotations

import json
import os
import shlex
import zlib
from pathlib import Path
from typing import Any

from .errors import StoreError
from .small_files import read_small_json

FORMAT_NAME = "gnnssd-store"
FORMAT_VERSION = 2  # 2: page checksums (features.crc32c) and the manifest's own checksum
MANIFEST = "manifest.json"
FEATURES = "features.bin"
PAGE_CHECKSUMS = "features.crc32c"  # CRC32C of every PAGE of features.bin, uint32 LE
ROW_SCALES = "features.scale"  # int8 stores: (scale, offset) of every row, float32 LE
PAGE = 4096
FEATURE_DTYPES = ("float32", "float16", "int8")

# The store's files other than features.bin, all NumPy .npy.
ARRAY_FILES = ("indptr", "indices", "labels", "perm", "inv", "train_idx", "valid_idx", "test_idx")
# A heterogeneous store (manifest section "schema") also holds the relation of every edge.
ETYPES = "etypes"
# A store with a link split (manifest section "link") also holds these.
LINK_FILES = ("link_train", "link_valid", "link_test", "link_valid_neg", "link_test_neg")
#: What marks a DGL GraphBolt OnDiskDataset folder (`gnnssd preprocess graphbolt` reads it).
GRAPHBOLT_METADATA = "metadata.yaml"
REQUIRED_KEYS = ("format", "format_version", "num_nodes", "num_edges", "num_classes",
                 "features", "files", "order", "checksum")


def manifest_checksum(manifest: dict[str, Any]) -> int:
    """CRC-32 of the manifest's canonical JSON without its own 'checksum' key."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def is_store_manifest(path: Path) -> bool:
    """Whether path is a gnnssd manifest (of any format version)."""
    try:
        return read_small_json(path, what="manifest").get("format") == FORMAT_NAME
    except (OSError, ValueError, AttributeError):
        return False


def read_manifest(store_dir: Path) -> dict[str, Any]:
    """Load and check the manifest; a store without one is incomplete and refused."""
    path = store_dir / MANIFEST
    if not store_dir.is_dir():
        raise StoreError(f"{store_dir}: no such store directory")
    if not os.path.lexists(path):
        if os.path.lexists(store_dir / GRAPHBOLT_METADATA):
            raise StoreError(f"{store_dir}: a DGL GraphBolt dataset ({GRAPHBOLT_METADATA}), not a gnnssd store; "
                             f"convert it with `gnnssd preprocess graphbolt --root {shlex.quote(str(store_dir))} "
                             "--out STORE` (with --typed if it has several node or edge types) and open STORE")
        partial = " (a preprocess into it did not finish)" if any(store_dir.iterdir()) else ""
        raise StoreError(f"{path}: missing; {store_dir} is not a complete store{partial}")
    try:
        manifest = read_small_json(path, what="store manifest")
    except ValueError as exc:
        raise StoreError(f"unreadable manifest: {exc}") from None
    if not isinstance(manifest, dict):
        raise StoreError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != FORMAT_NAME:
        raise StoreError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT_NAME!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise StoreError(f"{path}: format_version {manifest.get('format_version')}, this gnnssd "
                         f"reads version {FORMAT_VERSION}; rerun `gnnssd preprocess` to rewrite "
                         "the store")
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise StoreError(f"{path}: missing keys {missing}")
    expected_files = {FEATURES, PAGE_CHECKSUMS, *(f"{name}.npy" for name in ARRAY_FILES)}
    if "link" in manifest:
        expected_files |= {f"{name}.npy" for name in LINK_FILES}
    absent = sorted(expected_files - set(manifest["files"]))
    if absent:
        raise StoreError(f"{path}: 'files' lacks {absent}")
    return manifest


def foreign_entries(store_dir: Path) -> list[str]:
    """Names in `store_dir` that are not the store's: neither a file its manifest lists,
    the manifest, calibration.json nor preprocess's marker (a user's own file, which
    replacing the store would delete)."""
    try:
        listed = set(read_small_json(store_dir / MANIFEST, what="store manifest").get("files", {}))
    except (ValueError, AttributeError):
        listed = set()
    own = listed | {MANIFEST, "calibration.json", ".gnnssd-preprocess.json"}
    return sorted(entry.name for entry in store_dir.iterdir() if entry.name not in own)
