"""Fault cases of issue 48 on the folders and files gnnssd writes: names that become paths
(storage_format.schema.check_name), the working files of a resumed preprocess and the lock
beside --out (storage_format.atomic: writable_file, exclusive_lock), and the one output-folder
policy of preprocess, export and demo (storage_format.preprocess.partial_dir: never inside a store,
never over files the command did not make, built in .NAME.partial and renamed, locked).

Each test is named after the fault it covers; stores are tiny and made here.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gnnssd.cli.commands import main
from gnnssd.datasets import ArraySource
from gnnssd.storage_format import (DatasetError, GraphSchema, NodeType, Store, StoreError, UnsafeOutputError,
                                   write_store)
from tests.conftest import REPO, random_graph_arrays
from tests.hetero_graph import ToyHeteroSource

HOSTILE_NAMES = ["../../escape", "/tmp/escape", "a/b", ".hidden", "..", "a\0b", "x" * 256, ""]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return write_store(tmp_path_factory.mktemp("out") / "store", ArraySource(**random_graph_arrays(seed=7)))


# --- fault 1: a node type or relation name that is a path -------------------------------------

@pytest.mark.parametrize("name", HOSTILE_NAMES)
@pytest.mark.parametrize("what", ["node type", "relation"])
def test_a_name_that_is_not_one_file_name_is_refused_where_the_schema_is_made(name, what):
    node, relation = (name, "cites") if what == "node type" else ("paper", name)
    with pytest.raises(DatasetError, match=f"graph schema: {what} .* expected a plain name"):
        GraphSchema((NodeType(node, 3, True),), ((node, relation, node),), node)


def test_preprocess_of_a_type_named_like_a_path_is_refused(tmp_path, capsys):
    """The issue's case: a typed GraphBolt dataset with node type ../../escape preprocessed
    (rc 0) and its export wrote escape-label.npy two folders above OUT. Now the schema made
    from the dataset refuses the name, before anything is written."""
    store = write_store(tmp_path / "toy", ToyHeteroSource())
    dataset = tmp_path / "a" / "b" / "gb"
    assert main(["export", "graphbolt", str(store), str(dataset)]) == 0
    metadata = dataset / "metadata.yaml"
    metadata.write_text(metadata.read_text().replace("type: author", "type: ../../escape")
                        .replace("author:", "../../escape:").replace(":author", ":../../escape"))
    assert "../../escape" in metadata.read_text()
    capsys.readouterr()
    out = tmp_path / "a" / "b" / "store"
    assert main(["preprocess", "graphbolt", "--typed", "--root", str(dataset), "--out", str(out)]) == 2
    assert "node type '../../escape' contains '/'" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.rglob("*escape*"))


def test_a_store_whose_manifest_names_a_path_is_refused_at_open(tmp_path):
    """A hand-edited manifest is the other way a name reaches export: the schema made from it refuses it."""
    import json

    from gnnssd.storage_format.manifest import manifest_checksum

    path = write_store(tmp_path / "store", ToyHeteroSource())
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["schema"]["node_types"][1]["name"] = "/tmp/escape"
    manifest["schema"]["relations"] = [[p if p != "author" else "/tmp/escape" for p in r]
                                       for r in manifest["schema"]["relations"]]
    manifest["checksum"] = manifest_checksum({k: v for k, v in manifest.items() if k != "checksum"})
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=r"manifest.json: schema: graph schema: node type '/tmp/escape' contains '/'"):
        Store.open(path).schema


# --- fault 2: links planted in .NAME.partial before a resumed preprocess ------------------------

class Interrupted(Exception):
    pass


def _stop_at(stage: str):
    def notify(at: str, done: int, total: int) -> None:
        if at == stage:
            raise Interrupted(at)
    return notify


SORTED = ["features.bin", "features.crc32c", "indptr.npy", "perm.npy", "labels.npy", "train_idx.npy"]


@pytest.mark.parametrize("order, memory_limit, stage, planted", [
    ("original", None, "features", SORTED), ("degree", None, "features", SORTED),
    ("original", 1, "merge buckets", ["csc.indices.npy", "edge-buckets/merged-degrees.bin", *SORTED])])
def test_a_resumed_preprocess_never_writes_through_a_link_planted_in_its_partial_folder(
        tmp_path, order, memory_limit, stage, planted):
    """After an interrupted run (in its features, or in the merge of the out-of-core sort),
    links (and a hard link) named after the files the rerun writes make it refuse, naming
    the link, each victim untouched; once they are gone the rerun resumes and finishes."""
    from gnnssd.sampler import node_order

    source = ArraySource(**random_graph_arrays(seed=8))
    out = tmp_path / "store"
    order_arg = "original" if order == "original" else node_order(order)
    with pytest.raises(Interrupted):
        write_store(out, source, order=order_arg, progress=_stop_at(stage), memory_limit=memory_limit)
    partial = tmp_path / ".store.partial"
    victims = tmp_path / "victims"
    victims.mkdir()
    kept = tmp_path / "kept"  # the partial folder's own files the links replace, put back once refused
    kept.mkdir()
    planted = [*planted, "inv.npy"]
    for name in planted:
        victim = victims / name.replace("/", "-")
        victim.write_bytes(b"the user's own file\n")
        if (partial / name).exists():
            (partial / name).rename(kept / name.replace("/", "-"))
        os.link(victim, partial / name) if name == "inv.npy" else (partial / name).symlink_to(victim)
    refused = []
    for _ in range(len(planted) + 1):
        try:
            write_store(out, source, order=order_arg, memory_limit=memory_limit)
            break
        except UnsafeOutputError as exc:
            name = next(n for n in planted if f"{partial / n}:" in str(exc))
            assert ("symbolic link" if name != "inv.npy" else "2 links") in str(exc)
            refused.append(name)
            (partial / name).unlink()
            if (kept / name.replace("/", "-")).exists():
                (kept / name.replace("/", "-")).rename(partial / name)
    assert sorted(refused) == sorted(planted)
    assert all(p.read_bytes() == b"the user's own file\n" for p in victims.iterdir())
    Store.open(out, verify=True)


# --- fault 3: the lock file beside --out is a link ---------------------------------------------

@pytest.mark.parametrize("command", ["preprocess", "export"])
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(store, tmp_path, command):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    (tmp_path / ".out.lock").symlink_to(victim)
    with pytest.raises(UnsafeOutputError, match=r"\.out\.lock: the lock file is a symbolic link"):
        if command == "preprocess":
            write_store(out, ArraySource(**random_graph_arrays(seed=9)))
        else:
            from gnnssd.cli.export import export_graphbolt
            export_graphbolt(Store.open(store), out)
    assert victim.read_text() == "keep me\n"
    assert not out.exists()


# --- fault 4: export over a user's folder, or inside a store -----------------------------------

def test_export_into_a_folder_with_the_users_files_is_refused_and_keeps_them(store, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "node-label.npy").write_bytes(b"my own array")
    (out / "notes.txt").write_text("mine")
    assert main(["export", "graphbolt", str(store), str(out)]) == 2
    assert "a folder holding files gnnssd export did not make (node-label.npy, notes.txt)" in capsys.readouterr().err
    assert _files(out) == {"node-label.npy": b"my own array", "notes.txt": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


@pytest.mark.parametrize("depth", [1, 3])
def test_export_inside_the_store_is_refused_at_any_depth(store, tmp_path, capsys, depth):
    before = _files(store)
    out = store.joinpath(*["sub"] * (depth - 1), "gb")
    assert main(["export", "graphbolt", str(store), str(out)]) == 2
    assert f"inside the store {store}" in capsys.readouterr().err
    assert _files(store) == before and sorted(p.name for p in store.iterdir()) == sorted(before)


def test_preprocess_inside_another_store_is_refused(store, tmp_path):
    before = _files(store)
    with pytest.raises(StoreError, match=f"inside the store {store}"):
        write_store(store / "sub" / "store", ArraySource(**random_graph_arrays(seed=9)))
    assert _files(store) == before and sorted(p.name for p in store.iterdir()) == sorted(before)


# --- fault 11: two exports into one folder ------------------------------------------------------

@pytest.mark.parametrize("command", ["export", "demo"])
def test_a_second_writer_of_one_output_folder_is_refused(store, tmp_path, capsys, command):
    """One export (or demo) holds OUT's lock while it writes: a second one is refused,
    naming the first, and writes nothing."""
    from gnnssd.storage_format import output_lock

    out = tmp_path / "gb"
    argv = ["export", "graphbolt", str(store), str(out)] if command == "export" else ["demo", "--out", str(out)]
    with output_lock(out, f"gnnssd {command}"):
        assert main(argv) == 2
    assert f"another gnnssd {command} (pid {os.getpid()}) is writing this folder" in capsys.readouterr().err
    assert not out.exists()


# --- partial: a half export left on a full disk -------------------------------------------------

def test_an_export_that_fills_the_disk_leaves_nothing(store, tmp_path):
    """The file-size limit (EFBIG, as ENOSPC on a full disk) stops the export at its feature
    file, after the labels were written: the error names the file, no half dataset remains
    in the user's empty folder; with space, the export then fills it."""
    out = tmp_path / "gb"
    out.mkdir()
    script = ("import resource, signal, sys\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
              "from gnnssd.cli.commands import main\n"
              "sys.exit(main(['export', 'graphbolt', sys.argv[1], sys.argv[2]]))\n")
    done = subprocess.run([sys.executable, "-c", script, str(store), str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "node-feat.npy: cannot write (File too large)" in done.stderr
    assert list(tmp_path.iterdir()) == [out] and list(out.iterdir()) == []
    assert main(["export", "graphbolt", str(store), str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gb"] and (out / "metadata.yaml").is_file()
    assert not any(p.name.startswith(".") for p in out.iterdir())
