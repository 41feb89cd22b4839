#!/usr/bin/env bash
# The GPU machine's check (issue 31), run from the repository root on a lent machine with
# Python 3.12, torch 2.11 (CUDA), NumPy 2, numba, Triton and PyG, where nothing can be
# downloaded. What that machine lacks travels as files: .whl/ (DGL 2.1.0's cp312 CPU wheel,
# cffi, pycparser, pydantic and what it needs) and .deb/ (liburing2, liburing-dev).
# Steps (into the machine's own python3, which is discarded with the machine): the carried
# wheels, DGL made importable on this
# torch (scripts/device_patch_dgl.py), liburing unpacked, gnnssd built (io_uring or the
# thread fallback, said), the CUDA tests, then scripts/bench_gpu.py on a `medium` store and a typed `mag-small` store made
# there, then the device tier (bench_gpu.py's part (d): `features: device` on medium), then the
# ssd loader timed with packers 1/2/4/8/14 beside memory mode, then in-place reads with packers 1/14
# (bench_feed.py --packers; PACKERS, EXTENTS_PACKERS and FEED_BATCHES change them). Every step's output goes to $OUT (default bench_out); a failing step is reported
# and the next one still runs. With GNNSSD_PY set (a ready interpreter) the install is skipped;
# TESTS_K selects tests (pytest -k), PARTS the benchmark's parts, E2E_BATCHES its (b) length.
# Then the gather step: the ssd loader with x gathered on the host vs on the device, and with
# ssd.device_budget at 1/8 of the features (bench_gpu.py's part (e)).
# STEPS picks the steps (default all: "tests bench_gpu device gather packers"; the stores are
# made by any step that needs them). One command may run 600 s and a session has 15 minutes of
# device time in all, start included, so run it in two calls, e.g.
#   STEPS="tests bench_gpu" bash scripts/device_check.sh          (~6 min with the install)
#   STEPS="device gather packers" bash scripts/device_check.sh    (~8 min)
# CPU mode (a dry run of every step's code, no figure to keep; the CUDA tests skip):
#   GNNSSD_PY=.venv/bin/python DEVICE=cpu STORE=stores/medium PARTS=e2e E2E_BATCHES=6 bash scripts/device_check.sh
set -uo pipefail
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
SCRATCH=${TMPDIR:-/tmp}
DEVICE=${DEVICE:-cuda}
STORE=${STORE:-$SCRATCH/gnnssd-medium}
export PYTHONUNBUFFERED=1
STEPS=" ${STEPS:-tests bench_gpu device gather packers} "
step() { echo; echo "== $(date +%T) $*"; }
want() { [[ "$STEPS" == *" $1 "* ]]; }
# a step that fails or times out (124) is named at the end and the check exits 1; the others still run
FAILED=""
check() { local rc=$?; [ $rc -eq 0 ] || FAILED="$FAILED $1(rc $rc)"; }

if [ -z "${GNNSSD_PY:-}" ]; then
  step "install"
  PY=python3
  $PY -m pip install -q --no-index --no-deps .whl/*.whl
  $PY scripts/device_patch_dgl.py "$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p $SCRATCH/uring
  for deb in .deb/*.deb; do dpkg -x "$deb" $SCRATCH/uring; done
  export CPATH=$SCRATCH/uring/usr/include LIBRARY_PATH=$SCRATCH/uring/usr/lib/x86_64-linux-gnu
  export LD_LIBRARY_PATH=$SCRATCH/uring/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  $PY -m pip install -q --no-index --no-deps --no-build-isolation --ignore-requires-python -e . 2>&1 | tail -5
else
  PY=$GNNSSD_PY
fi

step "stack"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/card.txt"
$PY - <<'PY' 2>&1 | tee "$OUT/stack.txt"
import sys, numpy, torch, numba, dgl
from gnnssd.io_engine import Engine
print("python", sys.version.split()[0], "numpy", numpy.__version__, "torch", torch.__version__,
      "numba", numba.__version__, "dgl", dgl.__version__, "cuda", torch.cuda.is_available())
try:
    import triton; print("triton", triton.__version__)
except ImportError as err:
    print("triton missing:", err)
from gnnssd.core import dgl_has_cuda
print("dgl has cuda:", dgl_has_cuda())
engine = Engine()
print("io_engine backend:", engine.backend)
engine.close()
PY

if want tests; then
step "tests: the CUDA ones (marked cuda) and the compiler's CPU lowering ones on this stack"
timeout ${TESTS_TIMEOUT:-150} $PY -m pytest -q -p no:cacheprovider tests/compiler/test_cuda.py tests/compiler/test_compiler_csc.py \
  tests/compiler/test_compiler_hetero.py tests/loading/test_tensor_sampling.py tests/loading/test_device_mode.py tests/pipeline/test_row_places.py -k "${TESTS_K:-not cora and not interpreter and not trains}" -W ignore::DeprecationWarning 2>&1 | tee "$OUT/pytest_cuda.txt" | tail -25; check tests
fi

step "store: synthetic medium"
[ -f "$STORE/manifest.json" ] || $PY -m gnnssd preprocess synthetic --preset medium --out "$STORE" --order degree 2>&1 | tail -3

TYPED=${TYPED:-$SCRATCH/gnnssd-mag-small}
if want bench_gpu; then
step "store: hetero-synthetic mag-small (rgcn and rgat layers)"
[ -f "$TYPED/manifest.json" ] || $PY -m gnnssd preprocess hetero-synthetic --preset mag-small --out "$TYPED" 2>&1 | tail -3
fi

if want bench_gpu; then
step "bench_gpu"
timeout ${BENCH_TIMEOUT:-200} $PY scripts/bench_gpu.py --store "$STORE" --typed-store "$TYPED" --quick --e2e-batches ${E2E_BATCHES:-40} --parts ${PARTS:-layers,e2e,threads} --device $DEVICE --json "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.txt"; check bench_gpu
fi
if want device; then
step "device tier: medium with features: device (the store on the GPU) against compute-only"
timeout ${DEVICE_TIMEOUT:-120} $PY scripts/bench_gpu.py --store "$STORE" --quick --e2e-batches ${E2E_BATCHES:-40} --parts device --device $DEVICE --json "$OUT/bench_gpu_device.json" 2>&1 | tee "$OUT/bench_gpu_device.txt"; check device
fi
if want gather; then
step "gather where x is consumed: host vs device gather, and ssd.device_budget at 1/8 of the features (medium)"
timeout ${GATHER_TIMEOUT:-120} $PY scripts/bench_gpu.py --store "$STORE" --quick --e2e-batches ${E2E_BATCHES:-40} --parts gather --device $DEVICE --json "$OUT/bench_gpu_gather.json" 2>&1 | tee "$OUT/bench_gpu_gather.txt"; check gather
fi
if want packers; then
step "ssd loader with packers (issue 46): loader-only on medium at 1/8 of the features beside memory mode and in-place reads"
# one row per packer count; then in-place reads (ssd-extents: no repack, the packers plan page reads) with
# EXTENTS_PACKERS: which moves fewer bytes there; on the CPU the same commands run with PACKERS="1 2" (no GPU needed)
# feed NAME TIMEOUT "PACKERS" SYSTEMS...: one bench_feed run into $OUT/bench_feed_NAME.{json,txt}
feed() {
  local name=$1 limit=$2 packers=$3; shift 3
  timeout "$limit" $PY scripts/bench_feed.py --store "$STORE" --quick --beside-x --batches ${FEED_BATCHES:-12} \
    --threads $(nproc) --packers $packers --systems "$@" --no-warmup --json "$OUT/bench_feed_$name.json" \
    2>&1 | tee "$OUT/bench_feed_$name.txt"; check "$name"
}
feed packers ${PACKERS_TIMEOUT:-240} "${PACKERS:-1 2 4 8 14}" memory ssd
feed extents ${EXTENTS_TIMEOUT:-150} "${EXTENTS_PACKERS:-1 14}" ssd-extents
fi
if [ -n "$FAILED" ]; then step "failed:$FAILED"; exit 1; fi
step "done"
