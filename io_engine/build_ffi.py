"""cffi build script (API mode, out of line) for the io_engine C library.

setup.py names this file in `cffi_modules`; the extension lands as
`gnnssd.io_engine._gnnssd_io`. liburing is used when its header compiles and links here;
otherwise (or with GNNSSD_IO_NO_URING=1 in the environment) the library is built with the
thread-pool backend only and the build says so.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")
SOURCES = ["gio_core.c", "gio_uring.c", "gio_rows.c", "gio_crc.c"]

_PROBE = """#include <liburing.h>
int main(void) { struct io_uring ring; return io_uring_queue_init(1, &ring, 0); }
"""


def _rel(path: str) -> str:
    """setuptools wants source paths relative to the project root (the build's cwd)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def have_liburing() -> bool:
    """Whether a program including liburing.h compiles and links with -luring."""
    if os.environ.get("GNNSSD_IO_NO_URING") == "1":
        return False
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(_PROBE)
        cmd = [*cc, src, "-o", os.path.join(tmp, "probe"), "-luring"]
        try:
            return subprocess.run(cmd, capture_output=True).returncode == 0
        except OSError:
            return False


def _cdef() -> str:
    """The public header without its preprocessor lines (cdef takes declarations only)."""
    with open(os.path.join(CSRC, "gio.h")) as f:
        return "".join(line for line in f if not line.lstrip().startswith("#"))


def make_ffibuilder() -> FFI:
    uring = have_liburing()
    if uring:
        print("gnnssd.io_engine: building with liburing (io_uring and thread backends)")
    else:
        print(
            "gnnssd.io_engine: liburing.h not usable: building the thread-pool backend only"
            " (install liburing-dev for io_uring)",
            file=sys.stderr,
        )
    builder = FFI()
    builder.cdef(_cdef())
    builder.set_source(
        "gnnssd.io_engine._gnnssd_io",
        '#include "gio.h"',
        sources=[_rel(os.path.join(CSRC, s)) for s in SOURCES],
        include_dirs=[_rel(CSRC)],
        define_macros=[("GIO_HAVE_LIBURING", "1")] if uring else [],
        libraries=["uring"] if uring else [],
        extra_compile_args=["-std=gnu11", "-Wall", "-pthread"],
        extra_link_args=["-pthread"],
    )
    return builder


ffibuilder = make_ffibuilder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
