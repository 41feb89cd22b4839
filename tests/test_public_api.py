"""gnnssd's top-level names: what users build, receive and catch, imported on first use."""
from __future__ import annotations

import subprocess
import sys

import pytest

import gnnssd


@pytest.mark.parametrize("name, module", [("MiniBatch", "gnnssd.loading.backends.memory"), ("EdgeBatch", "gnnssd.loading.edge_loader"),
                                          ("ConfigError", "gnnssd.core.config"), ("StoreError", "gnnssd.storage_format"),
                                          ("ChecksumError", "gnnssd.io_engine")])
def test_the_types_users_receive_and_catch_are_exported(name: str, module: str) -> None:
    assert name in gnnssd.__all__
    assert getattr(gnnssd, name) is getattr(sys.modules[module], name)


def test_every_exported_name_resolves() -> None:
    assert all(getattr(gnnssd, name) is not None for name in gnnssd.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        gnnssd.Nope  # noqa: B018


def test_dir_lists_the_public_names() -> None:
    assert set(gnnssd.__all__) <= set(dir(gnnssd))


def test_importing_gnnssd_imports_neither_torch_nor_dgl() -> None:
    """The exports are lazy: the CLI starts without torch and DGL."""
    code = "import sys, gnnssd; print(sorted({'torch', 'dgl'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
