"""Builds the io_engine C extension (cffi); all other metadata is in pyproject.toml."""
from setuptools import setup

setup(cffi_modules=["io_engine/build_ffi.py:ffibuilder"])
