"""Reading a store: the manifest, the topology and metadata arrays, and the feature file."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .atomic import CHUNK_BYTES, crc32_of_file
from .content import (check_distinct, check_finite, check_indptr_ends, check_indptr_monotone,
                      check_integer_array, check_inverse, check_range, check_typed_edges,
                      check_within_types, max_of)
from .errors import DatasetError, StoreError
from .manifest import (ETYPES, FEATURE_DTYPES, FEATURES, MANIFEST, PAGE, PAGE_CHECKSUMS, ROW_SCALES,
                       manifest_checksum, read_manifest)
from .mapping import mapped_take
from .page_crc import first_bad_page, page_checksum_error
from .quantize import dequantize_rows
from .schema import ONE_RELATION, GraphSchema, NodeType
from .small_files import read_small
from .verified import VerifiedStamps


def load_stored_array(path: Path) -> np.ndarray:
    """A store's .npy file memory-mapped; a header that does not fit the file (a lying
    shape or dtype) is a StoreError naming the file, not NumPy's bare ValueError."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise StoreError(f"{path}: not a readable .npy array ({exc}); the store is damaged, "
                         "preprocess it again") from None


def _array_file(name: str, doc: str) -> cached_property:
    def load(self: "Store") -> np.ndarray:
        return load_stored_array(self.path / f"{name}.npy")

    load.__doc__ = doc
    return cached_property(load)


class Store:
    """A complete store directory, opened read-only.

    Opening checks the manifest (its own checksum, and its keys against each other and
    against the files), every file's size, the checksums of all files except
    features.bin (cheap next to loading them) and the arrays' content as far as one
    min/max pass goes (dtypes, ends of indptr, node IDs of perm, inv, splits and labels in
    range), and what would make results silently wrong (`_check_order_content`: perm and
    inv inverse, indptr monotone, typed edges within their relations); `verify()` also
    checks features.bin, which may be far larger than memory, page by page against its
    checksum file, and the content in full (see `storage_format.content`).

    A file a passing check found unchanged since (storage_format.verified: its inode,
    size and times, kept in the user's cache folder) is not hashed again, and when every
    file and the manifest are, neither are the content checks made again (they read
    nothing else); `verify()` and `open(verify=True)` check everything regardless.
    """

    def __init__(self, path: Path, manifest: dict[str, Any]):
        self.path = path
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path, verify: bool = False) -> "Store":
        path = Path(path)
        store = cls(path, read_manifest(path))
        store._check_feature_keys()
        stamps = VerifiedStamps(path, store.fingerprint, trusted=not verify)
        store._check_files(stamps)
        store._check_own_checksum()
        if not stamps.all_unchanged:
            store._check_order_content()
        if verify:
            store._check_pages()
        stamps.save()
        return store

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of manifest.json's bytes: which store, as preprocessed, this is."""
        return self.fingerprint_on_disk()

    def fingerprint_on_disk(self) -> str:
        """The fingerprint of the manifest now in the store's folder: another than
        `fingerprint` once the folder was preprocessed again or replaced."""
        return hashlib.sha256(read_small(self.path / MANIFEST, what="store manifest")).hexdigest()

    def verify(self) -> list[str]:
        """Check every file's checksum, features.bin page by page against its page
        checksums (which name the bad page); returns the names checked, raises on the
        first bad one. Every file is hashed, whatever an earlier check stamped."""
        stamps = VerifiedStamps(self.path, self.fingerprint, trusted=False)
        self._check_files(stamps)
        self._check_order_content()
        self._check_content()
        self._check_pages()
        stamps.save()
        return sorted(self.manifest["files"])

    def _check_files(self, stamps: VerifiedStamps) -> None:
        """Every file's size, the checksum of each but features.bin (its pages have their
        own) unless `stamps` finds it unchanged since a passing check, the arrays' shapes
        and ranges unless it finds every file so."""
        self._check_sizes()
        for name in self.manifest["files"]:
            if name != FEATURES and not stamps.unchanged(self.path / name, self.manifest["files"][name]["crc32"]):
                self._check_crc(name)
        if not stamps.all_unchanged:
            self._check_arrays()

    def _manifest_error(self, what: str) -> StoreError:
        return StoreError(f"{self.path / MANIFEST}: {what}; the manifest was edited or is "
                          "corrupt: rerun `gnnssd preprocess`")

    def _check_feature_keys(self) -> None:
        """The feature keys agree with each other and with features.bin's size."""
        feats = self.manifest["features"]
        dtype, dim, row_bytes = feats.get("dtype"), feats.get("dim"), feats.get("row_bytes")
        if dtype not in FEATURE_DTYPES:
            raise self._manifest_error(f"features.dtype {dtype!r}, expected one of "
                                       f"{FEATURE_DTYPES}")
        if not isinstance(dim, int) or dim < 1:
            raise self._manifest_error(f"features.dim {dim!r}, expected a positive integer")
        if dim * np.dtype(dtype).itemsize != row_bytes:
            raise self._manifest_error(
                f"features.dim {dim} x features.dtype {dtype} ({np.dtype(dtype).itemsize} B) = "
                f"{dim * np.dtype(dtype).itemsize} B per row, but features.row_bytes is "
                f"{row_bytes!r}")
        rows = self.schema.feature_rows
        counted = "num_nodes" if rows == self.num_nodes else "the featured node types' count"
        padded = -(-rows * row_bytes // PAGE) * PAGE
        sizes = [(FEATURES, padded), (PAGE_CHECKSUMS, padded // PAGE * 4)]
        if dtype == "int8":
            if ROW_SCALES not in self.manifest["files"]:
                raise self._manifest_error(f"features.dtype int8 without files.{ROW_SCALES} (the row scales)")
            sizes.append((ROW_SCALES, rows * 8))
        for name, size in sizes:
            if self.manifest["files"][name]["size"] != size:
                raise self._manifest_error(
                    f"files.{name}.size is {self.manifest['files'][name]['size']}, but "
                    f"{counted} {rows} x row_bytes {row_bytes} (padded to {PAGE}) "
                    f"needs {size}")
        if feats.get("rows", rows) != rows:
            raise self._manifest_error(f"features.rows {feats['rows']!r}, but the node types with "
                                       f"features hold {rows} nodes")

    def _check_arrays(self) -> None:
        """Array lengths match num_nodes/num_edges, and labels fit num_classes."""
        n, m = self.num_nodes, self.num_edges
        for name in ("indptr", "indices", "labels", "perm", "inv", "train_idx", "valid_idx", "test_idx"):
            check_integer_array(self.path / f"{name}.npy", self._stored(name), 1)
        expected = {"indptr": n + 1, "indices": m, "labels": n, "perm": n, "inv": n}
        for name, length in expected.items():
            actual = len(getattr(self, name))
            if actual != length:
                key = "num_edges" if name == "indices" else "num_nodes"
                raise self._manifest_error(f"{name}.npy holds {actual} entries, but "
                                           f"{key} {self.manifest[key]} needs {length}")
        top = max_of(self.labels)
        if top >= self.num_classes:
            raise self._manifest_error(f"num_classes {self.num_classes}, but labels.npy holds "
                                       f"label {top} (classes are 0..num_classes-1)")
        check_indptr_ends(self.path / "indptr.npy", self.indptr, m)
        check_range(self.path / "labels.npy", self.labels, -1, self.num_classes, "a label (-1: none)")
        for name in ("perm", "inv", "train_idx", "valid_idx", "test_idx"):
            check_range(self.path / f"{name}.npy", self._stored(name), 0, n, "a node ID")
        if self.has_link_split:
            self._check_link_arrays()

    @cached_property
    def schema(self) -> GraphSchema:
        """Node types and relations (one of each for a homogeneous store)."""
        if "schema" not in self.manifest:
            return GraphSchema.homogeneous(self.num_nodes)
        try:
            schema = GraphSchema.from_manifest(self.manifest["schema"], "schema")
        except DatasetError as exc:
            raise self._manifest_error(str(exc)) from None
        if schema.num_nodes != self.num_nodes:
            raise self._manifest_error(f"the schema's node types hold {schema.num_nodes} nodes, "
                                       f"num_nodes is {self.num_nodes}")
        widest = schema.widest_dim()
        if widest is not None and widest != self.feat_dim:
            raise self._manifest_error(f"the schema's widest node type dim is {widest}, its rows "
                                       f"are padded to feat_dim {self.feat_dim}: the two must agree")
        return schema

    @cached_property
    def _kind(self) -> _Kind:
        """What a store of its kind reads and checks differently (see _Kind): the store's
        one question of the graph's kind, asked of the manifest's schema."""
        return _ONE_TYPE if self.schema.is_homogeneous else _TYPED

    @cached_property
    def etypes(self) -> np.ndarray:
        """The relation (index into schema.relations) of every edge, aligned with indices;
        empty (`ONE_RELATION`: every edge is relation 0) on a store of one relation."""
        return self._kind.etypes(self)

    def _stored_etypes(self) -> np.ndarray:
        return load_stored_array(self.path / f"{ETYPES}.npy")

    def _check_relations(self) -> None:
        """A typed store's own checks (a homogeneous store has one type and one relation,
        whose IDs and edges the other checks cover): etypes.npy listed and as long as
        indices, its values relations; the target type the labelled one; perm keeping each
        node in its type and every edge within its relation's types (a wrong relation
        samples another type's rows silently)."""
        path = self.path / f"{ETYPES}.npy"
        if f"{ETYPES}.npy" not in self.manifest["files"]:
            raise self._manifest_error(f"a schema without files.{ETYPES}.npy")
        if self.etypes.dtype not in (np.int8, np.int16) or self.etypes.ndim != 1:
            raise StoreError(f"{path}: dtype {self.etypes.dtype} shape {self.etypes.shape}, "
                             "expected a 1-D int8 or int16 array")
        if len(self.etypes) != self.num_edges:
            raise self._manifest_error(f"{ETYPES}.npy holds {len(self.etypes)} entries, but "
                                       f"num_edges {self.num_edges} needs {self.num_edges}")
        check_range(path, self.etypes, 0, len(self.schema.relations), "a relation")
        self._check_target()
        check_within_types(self.path / "perm.npy", self.perm, self.schema)
        check_typed_edges(path, self.indptr, self.indices, self.etypes, self.schema)

    def _check_target(self) -> None:
        """The manifest's target type is the one the labels and splits are of: a target
        naming another type (featureless, unlabelled) would train on nothing it can learn.
        A store with a link split may have no labels at all."""
        t = self.schema.type_id(self.schema.target)
        lo, hi = (int(x) for x in self.schema.offsets[t:t + 2])
        for name in ("train_idx", "valid_idx", "test_idx"):
            ids = self._stored(name)
            if len(ids) and not lo <= int(ids.min()) <= int(ids.max()) < hi:
                raise self._manifest_error(f"schema target {self.schema.target!r} (store IDs {lo}..{hi - 1}), "
                                           f"but {name}.npy holds IDs from {int(ids.min())} to {int(ids.max())}")
        if not self.has_link_split and hi > lo and max_of(self.labels[lo:hi]) < 0:
            raise self._manifest_error(f"schema target {self.schema.target!r} has no labelled node "
                                       "(labels.npy is -1 over its whole range): the target names another "
                                       "type than the labelled one")

    def _stored(self, name: str) -> np.ndarray:
        """The array of `{name}.npy` as stored (the splits in store IDs)."""
        return getattr(self, name.replace("_idx", "_store_ids"))

    def _check_link_arrays(self) -> None:
        """The link split's arrays have the manifest's edge counts and negatives per edge,
        and hold node IDs 0..num_nodes-1."""
        link, n = self.manifest["link"], self.num_nodes
        self.link_relation  # a heterogeneous store's names one of its relations
        for split in ("train", "valid", "test"):
            shapes = {f"link_{split}.npy": (link["edges"][split], 2)}
            if split != "train":
                shapes[f"link_{split}_neg.npy"] = (link["edges"][split], link["eval_negatives"])
            for name, shape in shapes.items():
                array = load_stored_array(self.path / name)
                check_integer_array(self.path / name, array, 2)
                if array.shape != shape:
                    raise self._manifest_error(f"{name} has shape {array.shape}, but the link "
                                               f"section needs {shape}")
                if array.size and (int(array.min()) < 0 or int(array.max()) >= n):
                    raise self._manifest_error(f"{name} holds node IDs outside 0..{n - 1}")

    def _check_order_content(self) -> None:
        """At open (their checksums can be valid and the content still wrong, and every
        result would then be silently wrong): perm and inv inverse permutations (which row
        is which node), indptr monotone, and a typed store's own checks (_check_relations:
        its etypes file, target type, perm keeping each node in its type and every edge
        within its relation's types). One pass over the node arrays, which open has just
        read for their checksums, and on a typed store one over the edges."""
        check_indptr_monotone(self.path / "indptr.npy", self.indptr)
        check_inverse(self.path / "perm.npy", self.perm, self.inv)
        self._kind.check_relations(self)

    def _check_content(self) -> None:
        """What open leaves out: every index in range, split IDs distinct, int8 row scales
        finite."""
        check_range(self.path / "indices.npy", self.indices, 0, self.num_nodes, "a node ID")
        for name in ("train_idx", "valid_idx", "test_idx"):
            check_distinct(self.path / f"{name}.npy", self._stored(name))
        if self.row_scales is not None:
            check_finite(self.path / ROW_SCALES, self.row_scales)

    def _check_own_checksum(self) -> None:
        stored, actual = self.manifest["checksum"], manifest_checksum(self.manifest)
        if stored != actual:
            raise self._manifest_error(f"checksum {stored!r} does not match its content "
                                       f"({actual})")

    def _check_pages(self) -> None:
        """Every page of features.bin against features.crc32c (names the first bad page)."""
        self._read_pages(None, verify=True)

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

    # Topology and metadata: memory-mapped .npy files, opened on first use.
    indptr = _array_file("indptr", "CSC offsets: node v's sources are indices[indptr[v]:indptr[v+1]].")
    indices = _array_file("indices", "CSC sources (in-neighbours), sorted within each node.")
    labels = _array_file("labels", "Class per store node (-1: unlabelled).")
    perm = _array_file("perm", "perm[store_id] = original node ID.")
    inv = _array_file("inv", "inv[original_id] = store node ID.")
    train_store_ids = _array_file("train_idx", "Training nodes (store IDs, sorted).")
    valid_store_ids = _array_file("valid_idx", "Validation nodes (store IDs, sorted).")
    test_store_ids = _array_file("test_idx", "Test nodes (store IDs, sorted).")

    # The public surface speaks the dataset's own node IDs; store order is internal.
    @cached_property
    def train_idx(self) -> np.ndarray:
        """Training nodes, the dataset's original IDs (in store order)."""
        return self.original_ids(self.train_store_ids)

    @cached_property
    def valid_idx(self) -> np.ndarray:
        """Validation nodes, the dataset's original IDs (in store order)."""
        return self.original_ids(self.valid_store_ids)

    @cached_property
    def test_idx(self) -> np.ndarray:
        """Test nodes, the dataset's original IDs (in store order)."""
        return self.original_ids(self.test_store_ids)

    def original_ids(self, store_ids: np.ndarray, node_type: str | None = None) -> np.ndarray:
        """The dataset's IDs of store rows `store_ids` (perm[store_id]); on a heterogeneous
        store IDs within their node type (default the target type, the splits'), as DGL
        numbers a heterograph's nodes. A row outside the type's is refused naming it."""
        offset, count, name = self._type_range(node_type)
        rows = self._in_range(store_ids, offset, count, f"store rows of {name}")
        return mapped_take(self.perm, rows) - offset

    def store_ids(self, ids: np.ndarray, node_type: str | None = None) -> np.ndarray:
        """Store rows of the dataset's node IDs `ids` (inv[id]); on a heterogeneous store
        IDs within `node_type` (default the target type), range-checked per type."""
        offset, count, name = self._type_range(node_type)
        return mapped_take(self.inv, self._in_range(ids, 0, count, f"IDs of {name}") + offset)

    def node_features(self, ids: np.ndarray, node_type: str | None = None) -> np.ndarray:
        """float32 features (len(ids), the type's own width) of the dataset's node IDs
        `ids` of `node_type` (default the target type), as the loaders give them."""
        rows = self.store_ids(ids, node_type)
        t = self.schema.node_types[self.schema.type_id(node_type or self.schema.target)]
        if not t.features:
            raise ValueError(f"node type {t.name!r} has no features in {self.path} (types with "
                             f"features: {[n.name for n in self.schema.node_types if n.features]})")
        width = t.dim or self.feat_dim
        return self.as_float32(self.features_memmap()[rows], rows)[:, :width]

    def node_labels(self, ids: np.ndarray, node_type: str | None = None) -> np.ndarray:
        """int64 labels (-1: unlabelled) of the dataset's node IDs `ids` of `node_type`
        (default the target type, the labelled one)."""
        return mapped_take(self.labels, self.store_ids(ids, node_type)).astype(np.int64)

    def _type_range(self, node_type: str | None) -> tuple[int, int, str]:
        """(first store row, node count, a name for errors) of `node_type` (default the
        target type: a homogeneous store's one type)."""
        name = node_type or self.schema.target
        if name not in self.schema.type_names:
            raise ValueError(f"node_type {name!r}: expected one of {self.schema.type_names}")
        t = self.schema.type_id(name)
        return int(self.schema.offsets[t]), self.schema.node_types[t].count, f"node type {name!r}"

    @staticmethod
    def _in_range(ids: Any, first: int, count: int, what: str) -> np.ndarray:
        """`ids` as int64, all in first..first+count-1, or a ValueError naming one outside."""
        array = np.asarray(ids)
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"{what}: dtype {array.dtype}; expected integer IDs")
        array = array.astype(np.int64, copy=False)
        bad = array[(array < first) | (array >= first + count)]
        if bad.size:
            raise ValueError(f"{what}: {int(bad[0])} outside {first}..{first + count - 1}")
        return array

    @property
    def has_link_split(self) -> bool:
        return "link" in self.manifest

    @property
    def link_relation(self) -> tuple[str, str, str] | None:
        """The relation (source type, name, destination type) a heterogeneous store's link
        split is on; None on a homogeneous store."""
        return self._kind.link_relation(self)

    def _stored_link_relation(self) -> tuple[str, str, str]:
        """The link section's relation, refused unless one of the schema's."""
        relation = tuple(self.manifest["link"].get("relation", ()))
        if relation not in self.schema.relations:
            raise self._manifest_error(f"link.relation {list(relation)} is not one of the schema's "
                                       f"relations {[list(r) for r in self.schema.relations]}")
        return relation  # type: ignore[return-value]

    def link_edges(self, split: str) -> np.ndarray:
        """(E, 2) int64 (source, destination) original IDs of a link split (on a
        heterogeneous store: of `link_relation`, each end within its node type): 'train'
        edges are in the graph; 'valid' and 'test' edges are held out of it in both
        directions (in every relation)."""
        edges = self._link_array(split, "")
        if self.link_relation is None:
            return self.original_ids(edges)
        src_type, _, dst_type = self.link_relation
        return np.stack([self.original_ids(edges[:, 0], src_type),
                         self.original_ids(edges[:, 1], dst_type)], axis=1)

    def link_negatives(self, split: str) -> np.ndarray:
        """(E, K) int64 fixed negative destinations (original IDs; on a heterogeneous
        store within the destination type) of each 'valid' or 'test' edge."""
        if split not in ("valid", "test"):
            raise ValueError(f"link negatives of split {split!r}: expected 'valid' or 'test'")
        relation = self.link_relation
        return self.original_ids(self._link_array(split, "_neg"), relation and relation[2])

    def _link_array(self, split: str, suffix: str) -> np.ndarray:
        if not self.has_link_split:
            raise StoreError(f"{self.path}: no link split; preprocess with --edge-split "
                             "or from an OGB link layout")
        if split not in ("train", "valid", "test"):
            raise ValueError(f"link split {split!r}: expected 'train', 'valid' or 'test'")
        return load_stored_array(self.path / f"link_{split}{suffix}.npy")

    def split(self, name: str) -> np.ndarray:
        """The nodes of split `name`, original IDs (see train_idx)."""
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
        return self.feature_rows * self.row_bytes

    @property
    def feature_rows(self) -> int:
        """Rows of features.bin: the nodes of the types with features, IDs 0..rows-1."""
        return self.schema.feature_rows

    @cached_property
    def _page_checksums(self) -> np.ndarray:
        sums = np.fromfile(self.path / PAGE_CHECKSUMS, dtype="<u4").astype(np.uint32, copy=False)
        sums.flags.writeable = False
        return sums

    def page_checksums(self) -> np.ndarray:
        """CRC32C of every 4 KiB page of features.bin (uint32, read-only): what the I/O
        engine verifies each page it reads against (Engine.open(..., checksums=))."""
        return self._page_checksums

    @cached_property
    def row_scales(self) -> np.ndarray | None:
        """int8 stores: (scale, offset) float32 of every row, from features.scale checked
        against its CRC-32 as it loads; None for float stores."""
        if self.feat_dtype != np.int8:
            return None
        self._check_crc(ROW_SCALES)
        scales = np.fromfile(self.path / ROW_SCALES, dtype="<f4").astype(np.float32, copy=False)
        return scales.reshape(self.feature_rows, 2)

    def as_float32(self, raw: np.ndarray, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Feature rows of store nodes `rows` as stored (`raw`, in the store's dtype) as
        float32: int8 rows dequantized with their row scales, float rows converted. Every
        loader goes through here, so all modes see the same values."""
        if self.row_scales is None:
            return raw.astype(np.float32, copy=False)
        return dequantize_rows(raw, self.row_scales[rows])

    def read_features(self, verify: bool = True) -> np.ndarray:
        """The feature matrix (num_nodes, dim) read into memory, each page checked
        against its checksum as it arrives (unless verify=False)."""
        data = np.empty(self.manifest["files"][FEATURES]["size"], dtype=np.uint8)
        self._read_pages(data, verify)
        return data[:self.feature_bytes].view(self.feat_dtype).reshape(self.feature_rows, self.feat_dim)

    def _read_pages(self, out: np.ndarray | None, verify: bool) -> None:
        """Read features.bin in chunks into `out` (the whole file), or with out=None into
        one reused chunk (to check it in bounded memory); with verify, a page that does
        not match features.crc32c raises PageChecksumError naming it."""
        size = self.manifest["files"][FEATURES]["size"]
        scratch = np.empty(min(size, CHUNK_BYTES), dtype=np.uint8) if out is None else None
        sums = self.page_checksums() if verify else None
        with open(self.features_path, "rb", buffering=0) as f:
            for lo in range(0, size, CHUNK_BYTES):
                n = min(CHUNK_BYTES, size - lo)
                chunk = scratch[:n] if out is None else out[lo:lo + n]
                if f.readinto(memoryview(chunk)) != n:
                    raise StoreError(f"{self.features_path}: shorter than its {size} bytes")
                bad = None if sums is None else first_bad_page(chunk, lo, sums)
                if bad is not None:
                    raise page_checksum_error(str(self.features_path), bad[0], bad[1],
                                              int(sums[bad[0]]))

    def graph(self, store_ids: bool = False) -> Any:
        """The topology as a DGLGraph in the dataset's node IDs (int64 IDs; no features:
        they stay on disk); a heterogeneous store's as a DGLHeteroGraph in per-type IDs.
        `store_ids`: in the store's own IDs instead (what the loaders sample on). Needs
        DGL, which the store itself does not."""
        return self._kind.graph(self, store_ids)

    def _plain_graph(self, store_ids: bool) -> Any:
        """DGL's homogeneous graph of a store of one type and one relation."""
        import dgl
        import torch

        perm = np.arange(self.num_nodes) if store_ids else np.asarray(self.perm)
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(np.asarray(self.indptr)))
        src = perm[np.asarray(self.indices, dtype=np.int64)]
        return dgl.graph((torch.from_numpy(src), torch.from_numpy(perm[dst])), num_nodes=self.num_nodes)

    def _typed_graph(self, store_ids: bool) -> Any:
        """One canonical edge type per relation, built from the CSC and its edge types (a
        node order keeps each type's range, so perm maps per-type IDs within the type)."""
        import dgl
        import torch

        schema, offsets = self.schema, self.schema.offsets
        indptr = np.asarray(self.indptr)
        dst = np.repeat(np.arange(schema.num_nodes, dtype=np.int64), np.diff(indptr))
        src = np.asarray(self.indices, dtype=np.int64)
        if not store_ids:
            perm = np.asarray(self.perm)
            src, dst = perm[src], perm[dst]
        etypes = np.asarray(self.etypes)
        data = {}
        for r, (s, name, d) in enumerate(schema.relations):
            mine = etypes == r
            data[(s, name, d)] = (torch.from_numpy(src[mine] - offsets[schema.type_id(s)]),
                                  torch.from_numpy(dst[mine] - offsets[schema.type_id(d)]))
        return dgl.heterograph(data, num_nodes_dict={t.name: t.count for t in schema.node_types})

    def features_memmap(self) -> np.memmap:
        """The feature matrix (num_nodes, dim), memory-mapped: pages load on access."""
        return np.memmap(self.features_path, dtype=self.feat_dtype, mode="r",
                         shape=(self.feature_rows, self.feat_dim))

    def summary(self) -> str:
        m = self.manifest
        lines = [
            f"store        {self.path}",
            f"name         {m.get('name', '?')}",
            f"nodes        {self.num_nodes:,}",
            f"edges        {self.num_edges:,} (in-edges, CSC; indices {self.indices.dtype})",
            f"features     {self.feat_dim} x {self.feat_dtype} = {self.row_bytes} B/row, "
            f"{self.feature_bytes / 2**20:,.1f} MiB",
            *self._kind.type_lines(self),
            f"classes      {self.num_classes}",
            f"splits       train {len(self.train_store_ids):,} / valid {len(self.valid_store_ids):,} / "
            f"test {len(self.test_store_ids):,}",
            f"node order   {m['order']}",
            *(["link split   " + " / ".join(f"{k} {m['link']['edges'][k]:,}" for k in ("train", "valid", "test"))
               + " edges" + (f" of {'-'.join(self.link_relation)}" if self.link_relation else "")
               + f", {m['link']['eval_negatives']} negatives per eval edge"]
              if self.has_link_split else []),
            f"created      {m.get('created', '?')} by gnnssd {m.get('gnnssd_version', '?')}",
        ]
        return "\n".join(lines)


    def _type_lines(self) -> list[str]:
        """`gnnssd info`'s lines of a typed store's node types, relations and target."""
        types = ", ".join(f"{t.name} {t.count:,}" + _type_features(t) for t in self.schema.node_types)
        return ["node types   " + types,
                "relations    " + ", ".join("-".join(r) for r in self.schema.relations),
                f"target type  {self.schema.target}"]


@dataclass(frozen=True)
class _Kind:
    """What a store reads and checks by the graph's kind: a typed store has an etypes file
    and its own checks (_check_relations), a link split of one of its relations, DGL's
    heterograph and its types in `gnnssd info`; a homogeneous store (one type, one relation)
    none of these. `Store._kind` chooses once; the rest of Store receives the shape."""
    etypes: Callable[[Store], np.ndarray]
    check_relations: Callable[[Store], None]
    link_relation: Callable[[Store], tuple[str, str, str] | None]
    graph: Callable[[Store, bool], Any]
    type_lines: Callable[[Store], list[str]]


_ONE_TYPE = _Kind(lambda store: ONE_RELATION, lambda store: None, lambda store: None, Store._plain_graph,
                  lambda store: [])
_TYPED = _Kind(Store._stored_etypes, Store._check_relations, Store._stored_link_relation, Store._typed_graph,
               Store._type_lines)


def _type_features(t: NodeType) -> str:
    """How `gnnssd info` shows a node type's features: none, or its own dim when it has one."""
    if not t.features:
        return " (no features)"
    return "" if t.dim is None else f" (dim {t.dim})"
