"""What each way of learning that a PyTorch block died costs, on a model of 4,096 tensors:

- hook:      the caching allocator's trace hook (_torch_blocks.cpp, what uvm's pools use): every
             block handed out or taken back is reported to uvm_block_allocated / uvm_block_freed.
             Timed as 4,096 allocations and frees in a pool on uvm_malloc before the hook is
             attached (the baseline) and after, in one process; and with every tensor freed while
             its segment is offloaded and every new one handed a block of that memory (the slow
             path: the moves lock, staged copies dropped).
- storages:  a weakref.finalize on each tensor's storage (the Python alternative): registering 4,096
             and the frees that run them.
- snapshot:  pool.snapshot(), which a move by pool would need at every onload (and which cannot
             tell a block freed and handed out again at the same address).
- C calls:   uvm_block_allocated + uvm_block_freed through ctypes for each block (a runtime that
             reports its own blocks from Python).

Each figure is the median of several rounds, beside the plain allocations it adds to, in one run:

    python bench/lifetime_bench.py [--tensors 4096] [--rounds 7] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHIM = Path(__file__).resolve().parents[1] / "python_shim"

CHILD = r"""
import ctypes, gc, json, statistics, sys, time, weakref
import torch
sys.path.insert(0, SHIM)
import uvm
from uvm import _lib, _state
sizes = [(i * 7919) % (3 << 20) + 1 for i in range(TENSORS)]  # 1 B to 3 MiB, a model's spread
# A pool on uvm_malloc without the hook first: the hook, once attached, reports for the process.
lib = _lib.load(_lib.build_library())
pool = torch.cuda.MemPool(torch.cuda.memory.CUDAPluggableAllocator(_lib._so_path, "uvm_malloc", "uvm_free").allocator())

def allocate(into=None):
    with torch.cuda.use_mem_pool(into or pool):
        return [torch.empty(size, dtype=torch.uint8, device="cuda") for size in sizes]

def timed(body, rounds=ROUNDS):
    body()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        body()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3

def alloc_free(into=None):
    tensors = allocate(into)
    del tensors

result = {"alloc_free_ms": timed(alloc_free)}

def storages():
    tensors = allocate()
    fired = []
    for t in tensors:
        weakref.finalize(t.untyped_storage(), fired.append, 1)
    del tensors
    gc.collect()
result["storages_ms"] = timed(storages)
tensors = allocate()
result["snapshot_ms"] = timed(pool.snapshot)
blocks = [(t.data_ptr(), -(-t.nbytes // 512) * 512) for t in tensors]
def c_calls():
    for ptr, size in blocks:
        lib.uvm_block_allocated(ptr, size)
    for ptr, size in blocks:
        lib.uvm_block_freed(ptr, size)
result["c_calls_ms"] = timed(c_calls)
del tensors

uvm_pool = uvm.create_unified_mempool()  # attaches the hook
result["hook_ms"] = timed(alloc_free)  # the same pool as the baseline, its blocks now reported
result["hook_uvm_pool_ms"] = timed(lambda: alloc_free(uvm_pool))
# The slow path: every tensor freed while its segment is offloaded (its staged copy dropped), and
# every new one handed a block of that moved memory.
tensors, times = allocate(uvm_pool), []
for _ in range(ROUNDS + 1):
    uvm.offload(uvm_pool)
    torch.cuda.synchronize()
    start = time.perf_counter()
    del tensors[:]
    tensors = allocate(uvm_pool)
    times.append(time.perf_counter() - start)
    uvm.onload(uvm_pool)
result["hook_offloaded_ms"] = statistics.median(times[1:]) * 1e3
print("RESULT " + json.dumps(result))
"""


def child(tensors: int, rounds: int) -> dict:
    code = CHILD.replace("TENSORS", str(tensors)).replace("ROUNDS", str(rounds)).replace("SHIM", repr(str(SHIM)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"the bench failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(line[len("RESULT "):])


def environment() -> dict:
    import torch
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return {"gpu_and_driver": smi, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": sys.version.split()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    got = child(args.tensors, args.rounds)
    base = got["alloc_free_ms"]
    rows = [
        ("allocate + free, no hook (the baseline)", base, "—"),
        ("allocate + free, hook attached (same pool)", got["hook_ms"], f"+{got['hook_ms'] - base:.2f} ms"),
        ("allocate + free, hook, a pool made by uvm", got["hook_uvm_pool_ms"], f"+{got['hook_uvm_pool_ms'] - base:.2f} ms"),
        ("free + allocate, hook, every segment offloaded", got["hook_offloaded_ms"],
         f"+{got['hook_offloaded_ms'] - base:.2f} ms"),
        ("storages: weakref.finalize each + frees", got["storages_ms"], f"+{got['storages_ms'] - base:.2f} ms"),
        ("snapshot: pool.snapshot() once", got["snapshot_ms"], "per move"),
        ("C calls: uvm_block_allocated + _freed each (ctypes)", got["c_calls_ms"], "on top of the frees"),
    ]
    print(f"{args.tensors} tensors, median of {args.rounds} rounds; {environment()}")
    print("| what | ms | beside the baseline |\n| --- | --- | --- |")
    for name, ms, extra in rows:
        print(f"| {name} | {ms:.2f} | {extra} |")
    if args.json:
        args.json.write_text(json.dumps({"environment": environment(), "tensors": args.tensors, "ms": got}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
