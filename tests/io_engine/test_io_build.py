"""The io_engine builds without liburing (thread backend only) and then picks that backend
by itself: the build script is run with GNNSSD_IO_NO_URING=1 into a temporary directory."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "io_engine" / "build_ffi.py"

CHECK = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("build_ffi", sys.argv[1])
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)
so = build.ffibuilder.compile(tmpdir=".")
spec = importlib.util.spec_from_file_location("_gnnssd_io", so)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
lib, ffi = mod.lib, mod.ffi
err, uring_err = ffi.new("int *"), ffi.new("int *")
eng = lib.gio_engine_new(lib.GIO_BACKEND_AUTO, 8, 1, 2, 0, err, uring_err)
print(lib.gio_have_uring(), lib.gio_engine_backend(eng) == lib.GIO_BACKEND_THREADS,
      uring_err[0])
lib.gio_engine_free(eng)
"""


def test_build_without_liburing_falls_back_to_threads(tmp_path):
    env = dict(os.environ, GNNSSD_IO_NO_URING="1")
    run = subprocess.run([sys.executable, "-c", CHECK, str(BUILD_SCRIPT)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "building the thread-pool backend only" in run.stderr
    have_uring, threads, uring_err = run.stdout.split()
    assert (have_uring, threads, int(uring_err)) == ("0", "True", errno.ENOSYS)
