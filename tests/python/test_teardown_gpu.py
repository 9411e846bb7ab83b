"""GPU: teardown never aborts. Pools and processes are torn down in every state — offloaded, staged,
released, paused, mid-onload on another thread, kept alive by an exception's traceback and collected
later, collected by the garbage collector while another pool is in use — and each child process must exit 0 with no abort, leave no CUDA error pending (a kernel runs
after the pools go), and hold no pinned memory once release_staging ran. Needs torch with CUDA and
GPU 0 (skipped with the reason otherwise); each child's managed memory stays under 200 MiB."""
import sys

import pytest
from conftest import UVM_PATH, python

sys.path.insert(0, str(UVM_PATH))

torch = pytest.importorskip("torch", reason="torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

SETUP = """
import gc, sys, threading, time, torch, uvm
from uvm.memory_saver import torch_memory_saver
def make(kind):
    pool = uvm.create_unified_mempool() if kind == "managed" else uvm.create_releasable_mempool()
    with torch.cuda.use_mem_pool(pool):
        tensors = [torch.randn(1 << 20, device="cuda") for _ in range(16)]
    return pool, tensors
def clean():
    gc.collect()
    torch.ones(8, device="cuda").sum().item()  # a pending CUDA error would be raised here
    uvm.release_staging()
    held = uvm.staging()["capacity_bytes"]
    assert held == 0, f"{held} bytes of pinned memory left"
    print("clean")
"""

STATES = {
    "offloaded, pool freed": "pool, ts = make(KIND); uvm.offload(ts); torch.cuda.synchronize(); del pool, ts; clean()",
    "staged then partly onloaded, pool freed": "pool, ts = make(KIND); uvm.offload(pool, strategy='staged' if KIND == 'managed' else 'auto');"
                                               " uvm.onload(ts[:5]); torch.cuda.synchronize(); del pool, ts; clean()",
    "discarded (released), pool freed": "pool, ts = make(KIND); uvm.discard(pool); torch.cuda.synchronize(); del pool, ts; clean()",
    "paused with a backup, exits": "with torch_memory_saver.region('t', enable_cpu_backup=True):\n"
                                   "    ts = [torch.randn(1 << 20, device='cuda') for _ in range(8)]\n"
                                   "torch_memory_saver.pause('t'); print('clean')",
    "paused without a backup, exits": "with torch_memory_saver.region('t'):\n"
                                      "    ts = [torch.randn(1 << 20, device='cuda') for _ in range(8)]\n"
                                      "torch_memory_saver.pause('t'); print('clean')",
    "in a reference cycle, collected inside another pool's context": (
        "class Holder: pass\nh = Holder(); h.me = h; h.pool, h.ts = make(KIND); uvm.offload(h.ts); del h\n"
        "other = uvm.create_unified_mempool()\n"
        "with torch.cuda.use_mem_pool(other):\n    gc.collect()\n    x = torch.ones(4, device='cuda')\n"
        "del x; clean()"),
    "released, then dropped: its memory goes back": (
        "before = uvm.stats()['live_bytes']\npool, ts = make(KIND); uvm.offload(ts); torch.cuda.synchronize()\n"
        "del ts; uvm.release_pool(pool); del pool; gc.collect()\n"
        "assert uvm.stats()['live_bytes'] == before, uvm.stats()['live_bytes']; clean()"),
    "kept alive by a traceback, collected later": (
        "def fail():\n    pool, ts = make(KIND); uvm.offload(ts); raise RuntimeError('a failing client')\n"
        "try:\n    fail()\nexcept RuntimeError as e:\n    kept = e\n"
        "torch.cuda.synchronize(); del kept; clean()"),
}


@pytest.mark.parametrize("kind", ["managed", "releasable"])
@pytest.mark.parametrize("state", list(STATES))
def test_a_pool_torn_down_in_any_state_leaves_nothing_behind(state, kind):
    result = python(SETUP + f"KIND = {kind!r}\n" + STATES[state], check=False, timeout=300)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout}\n{result.stderr[-3000:]}"
    assert "clean" in result.stdout
    assert "terminate called" not in result.stderr


DAEMON = """
pool, ts = make(KIND)
with torch_memory_saver.region("daemon", enable_cpu_backup=True):
    paused = [torch.randn(1 << 20, device="cuda") for _ in range(8)]
def moves():
    while True:
        if LOOP == "memory_saver":
            torch_memory_saver.pause("daemon"); torch_memory_saver.resume("daemon")
        else:
            uvm.offload(ts); uvm.onload(ts)
threading.Thread(target=moves, daemon=True).start()
time.sleep(DELAY)
print("clean")
"""


@pytest.mark.parametrize("loop", ["offload-onload", "memory_saver"])
@pytest.mark.parametrize("kind", ["managed", "releasable"])
def test_a_process_that_exits_while_a_daemon_thread_moves_memory_exits_cleanly(kind, loop):
    for delay in (0.2, 0.5, 0.9):
        code = SETUP + f"KIND = {kind!r}\nLOOP = {loop!r}\nDELAY = {delay}\n" + DAEMON
        result = python(code, check=False, timeout=300)
        assert result.returncode == 0, f"delay {delay}: exit {result.returncode}:\n{result.stderr[-3000:]}"
        assert "terminate called" not in result.stderr
