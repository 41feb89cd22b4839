"""Opening an ssd loader in a fresh process samples nothing with numba on a homogeneous
store (x sizing samples with torch ops, a small mapped array is indexed at once, an empty
hot set calls no kernel): numba's first call in a process (its target's start-up, ~1 s)
is left to the first mini-batch, whose planning needs the kernels anyway, unless the hot
cache holds rows: its bitset and its read's extents are numba kernels run at open."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import tiny_degree_store

PROBE = r"""
import json, sys
from numba.core.dispatcher import Dispatcher
from gnnssd import NodeLoader, Store

def called():
    '''The numba kernels of gnnssd's modules that have run (compiled or loaded) so far.'''
    return sorted(f"{name}.{attr}" for name, module in list(sys.modules.items()) if name.startswith("gnnssd")
                  for attr, value in list(vars(module).items()) if isinstance(value, Dispatcher) and value.overloads)

store = Store.open(sys.argv[1])
loader = NodeLoader(store, store.train_idx, fanouts=[5, 5], batch_size=32, features="ssd", memory_budget="16MiB",
                    device="cpu", seed=0)
at_open = called()
batch = next(iter(loader))
print(json.dumps({"at_open": at_open, "after_first": called(), "seeds": len(batch.output_nodes)}))
loader.close()
"""


def test_an_ssd_loader_opens_without_numba_and_its_first_minibatch_samples(tmp_path):
    store = tiny_degree_store(tmp_path)
    done = subprocess.run([sys.executable, "-c", PROBE, str(store.path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    hot_cache_kernels = {"gnnssd.sampler.bitset.set_rows", "gnnssd.sampler.readplan._extents"}
    assert [kernel for kernel in result["at_open"] if kernel not in hot_cache_kernels] == []
    assert "gnnssd.sampler.sampling._sample_hop" in result["after_first"] and result["seeds"] == 32
