"""A package's public names imported from their modules on first use.

A package `__init__` that imported every module it exports would make each caller pay for
all of them: `gnnssd info` needs the store's reader, not the topology build's numba kernels,
and `gnnssd --help` neither (nor torch and DGL, which gnnssd.core's seeding imports). The
package instead lists its names by module and gets its `__getattr__` and `__dir__` here:

    __getattr__, __dir__ = lazy_exports(__name__, {".store": ("Store",), ...})
    __all__ = exported_names(...)
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package`, whose public names are
    `exports` (relative module -> the names it defines): a name is imported from its
    module on first access and kept on the package (later accesses are plain lookups)."""
    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *module_of})

    return __getattr__, __dir__


def exported_names(exports: dict[str, tuple[str, ...]]) -> list[str]:
    """The names of `exports` (module -> names), sorted: the package's `__all__`."""
    return sorted(name for names in exports.values() for name in names)
