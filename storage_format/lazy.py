"""A package's public names imported from their modules on first use.

A package `__init__` that imported every module it exports would make each caller pay for
all of them: `gnnssd info` needs the store's reader, not the topology build's numba kernels,
and `gnnssd --help` neither (nor torch and DGL, which gnnssd.core's seeding imports). The
package instead maps its names to their modules and gets its `__getattr__` and `__dir__`
here:

    _EXPORTS = by_name({".store": ("Store",), ".errors": ("StoreError",)})
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
    __all__ = sorted(_EXPORTS)
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def by_name(modules: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """name -> relative module, from relative module -> the names it defines (the order the
    package's imports were written in)."""
    return {name: module for module, names in modules.items() for name in names}


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package`, whose public names are
    `exports` (name -> the relative module defining it): a name is imported from its
    module on first access and kept on the package (later accesses are plain lookups)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
