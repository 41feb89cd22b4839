"""Packages (discovered, so no subpackage is left out of a wheel) and the io_engine C
extension (cffi); all other metadata is in pyproject.toml.

The component folders install under the gnnssd namespace (a top-level `datasets` or
`sampler` would clash with well-known packages): folder -> package below.
"""
from setuptools import find_packages, setup

PACKAGE_DIR = {"gnnssd": "gnnssd", "gnnssd.storage_format": "storage_format",
               "gnnssd.sampler": "sampler", "gnnssd.io_engine": "io_engine", "gnnssd.datasets": "datasets"}
PACKAGES = [f"{name}.{sub}" if sub else name
            for name, folder in PACKAGE_DIR.items() for sub in ["", *find_packages(folder)]]

setup(package_dir=PACKAGE_DIR, packages=PACKAGES, cffi_modules=["io_engine/build_ffi.py:ffibuilder"])
