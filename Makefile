# Every target installs what it needs and is safe to run again.
PYTHON ?= python3
UV := $(shell command -v uv 2>/dev/null || echo "$(PYTHON) -m uv")
VENV := .venv
STAMP := $(VENV)/.installed
PROJECT_DIRS := gnnssd sampler storage_format io_engine datasets scripts

.PHONY: setup demo test clean system-deps bench-deps

demo: setup
	$(UV) run --frozen gnnssd demo --out demo_out

test: setup
	$(UV) run --frozen pytest -q

# Bytecode is written at install, not left to the first import: where PYTHONDONTWRITEBYTECODE
# is set (as on the CI machines) every process otherwise compiled torch, DGL and numba from
# source: a packer's imports took 2.0-2.5 CPU-s instead of 0.9-1.0, those of torch and DGL (a
# rank's, a CLI test's) 11-12 instead of 6 (docs/BENCHMARKS.md, issue 46, fourteenth round).
# The project's own folders are compiled at every setup (only what changed).
setup: system-deps $(STAMP)
	@$(VENV)/bin/python -m compileall -q -j 0 $(PROJECT_DIRS)

# uv itself (from PyPI), and liburing's headers for the I/O engine when we may install them.
system-deps:
	@$(UV) --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet uv
	@if [ ! -f /usr/include/liburing.h ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing liburing-dev"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq liburing-dev >/dev/null; \
	  else echo "liburing-dev missing and not root: the I/O engine will use its thread-pool fallback"; fi; \
	fi

$(STAMP): Makefile pyproject.toml uv.lock setup.py io_engine/build_ffi.py $(wildcard io_engine/csrc/*)
	$(UV) sync --frozen --compile-bytecode --reinstall-package gnnssd
	@touch $@

# fio is only needed by the I/O benchmark.
bench-deps: setup
	@command -v fio >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null; }

clean:
	rm -rf $(VENV) demo_out build *.egg-info
