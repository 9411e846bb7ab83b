"""What makes the first release of a sleep wait (measurements.md, "The drop-in at the native calls'
speed"). The RL bench's big pattern (bench/rl_bench.py: a decoder's weights and KV cache through
uvm.memory_saver, a claim of all free memory freed before the wake) run with one thing changed at a
time, each variant in a process of its own; for each, the steady cycles' (third on) first release:

  as the bench             pause("kv_cache") (one 1 GiB release, nothing to copy) is the first
  raw 2 MiB before sleep   a 2 MiB allocation of the probe's own (cuMemCreate, cuMemMap) is unmapped
                           and released before the sleep, each driver call timed apart
  raw 2 MiB after wake     the same between the wake and the decode, at once or after the GPU was
  (0.05 s, 0.3 s after)    idle that long: is the wait set by time or by the decode's kernels?
  raw 2 MiB mid-decode     the same once half the decode's steps have run (on the decoding thread, or
  (on a thread)            on a thread of its own while the next step runs): can the wait be paid
                           while the model runs, and what does the model pay for it?
  polls after wake         a thread of its own makes and gives back 2 MiB every 50 ms from the wake
                           until the sleep (with or without mapping it): the driver's deferred work
                           paid in small steps beside the model
  no decode                no kernel runs between the wake and the sleep
  1 s idle before sleep    the GPU idle after the decode
  0.5 s idle before wake   the GPU idle between the claim's free and the wake
  uvm settles after wake   uvm's own polls after the wake (alloc/settle.hpp, UVM_SETTLE=1, the default);
                           every other variant runs with UVM_SETTLE=0, the driver as it is
  torch_memory_saver       the original, as the bench runs it (if installed)

    python bench/probes/first_release_probe.py [--cycles 6] [--variants ...]

Managed memory: none (CUDA VMM and plain allocations only)."""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time

VARIANTS = {
    "as the bench": {},
    "raw 2 MiB before sleep": {"raw": "before_sleep"},
    "raw 2 MiB after wake": {"raw": "after_wake"},
    "raw 2 MiB 0.05 s after wake": {"raw": "after_wake", "raw_delay": 0.05},
    "raw 2 MiB 0.3 s after wake": {"raw": "after_wake", "raw_delay": 0.3},
    "raw 2 MiB mid-decode": {"raw": "mid_decode"},
    "raw 2 MiB mid-decode on a thread": {"raw": "mid_decode_thread"},
    "polls after wake: create+release": {"poll": "create"},
    "polls after wake: create+map+release": {"poll": "map"},
    "no decode": {"no_decode": True},
    "1 s idle before sleep": {"idle_sleep": 1.0},
    "0.5 s idle before wake": {"idle_wake": 0.5},
    "uvm settles after wake": {"settle": True},
    "torch_memory_saver": {"peer": True},
}
RAW_BYTES = 2 << 20


class CUmemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class CUmemAllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", CUmemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class CUmemAccessDesc(ctypes.Structure):
    _fields_ = [("location", CUmemLocation), ("flags", ctypes.c_int)]


class RawAllocation:
    """2 MiB of device memory mapped with the driver's VMM calls, outside uvm and torch: whether a
    release that is no one's first call waits too, and in which call."""

    def __init__(self, device: int):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.prop = CUmemAllocationProp(type=1, location=CUmemLocation(type=1, id=device))  # pinned, on the device
        self.access = CUmemAccessDesc(location=CUmemLocation(type=1, id=device), flags=3)  # read-write
        self.base = ctypes.c_uint64()
        self.check("cuMemAddressReserve", self.cuda.cuMemAddressReserve(ctypes.byref(self.base), ctypes.c_size_t(RAW_BYTES),
                                                                       ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_ulonglong(0)))
        self.handle = None
        self.map()

    @staticmethod
    def check(name: str, result: int):
        if result != 0:
            raise RuntimeError(f"{name} failed: CUresult {result}")

    def map(self):
        handle = ctypes.c_uint64()
        self.check("cuMemCreate", self.cuda.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(RAW_BYTES), ctypes.byref(self.prop),
                                                        ctypes.c_ulonglong(0)))
        self.check("cuMemMap", self.cuda.cuMemMap(self.base, ctypes.c_size_t(RAW_BYTES), ctypes.c_size_t(0), handle,
                                                  ctypes.c_ulonglong(0)))
        self.check("cuMemSetAccess", self.cuda.cuMemSetAccess(self.base, ctypes.c_size_t(RAW_BYTES), ctypes.byref(self.access),
                                                              ctypes.c_size_t(1)))
        self.handle = handle

    def poll(self, with_map: bool) -> float:
        """Makes 2 MiB and gives it back (mapped in between, or not): ms."""
        start = time.perf_counter()
        if with_map:
            self.map()
            self.release()
        else:
            handle = ctypes.c_uint64()
            self.check("cuMemCreate", self.cuda.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(RAW_BYTES),
                                                            ctypes.byref(self.prop), ctypes.c_ulonglong(0)))
            self.check("cuMemRelease", self.cuda.cuMemRelease(handle))
        return (time.perf_counter() - start) * 1e3

    def release(self) -> dict:
        """Unmaps and releases, each call timed (ms)."""
        start = time.perf_counter()
        self.check("cuMemUnmap", self.cuda.cuMemUnmap(self.base, ctypes.c_size_t(RAW_BYTES)))
        unmapped = time.perf_counter()
        self.check("cuMemRelease", self.cuda.cuMemRelease(self.handle))
        released = time.perf_counter()
        return {"raw unmap": (unmapped - start) * 1e3, "raw release": (released - unmapped) * 1e3}


def decode(graph, cache, state, raw: RawAllocation | None, when: str | None, row: dict):
    """The bench's decode steps; with `when` mid_decode*, the raw allocation is released (and made
    again) half-way, on this thread or on one of its own."""
    import torch
    import rl_bench as bench
    state.reset(cache)
    helper = None
    launches = []  # host seconds of each replay launched while the helper may be releasing
    for step in range(bench.STEPS):
        halfway = step == bench.STEPS // 2 and when in ("mid_decode", "mid_decode_thread")
        if halfway:
            torch.cuda.synchronize()  # half the steps have run on the GPU, not only been launched
        if halfway and when == "mid_decode":
            row.update(raw.release())
            raw.map()
        start = time.perf_counter()
        graph.replay()
        if helper is not None:
            launches.append(time.perf_counter() - start)
        if halfway and when == "mid_decode_thread":  # while the step just launched runs
            helper = threading.Thread(target=lambda: (row.update(raw.release()), raw.map()))
            helper.start()
    if helper is not None:
        helper.join()
        row["longest launch beside it"] = max(launches) * 1e3


def child(knobs: dict, cycles: int) -> list[dict]:
    import torch
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
    import rl_bench as bench

    torch.cuda.set_device(0)
    method = bench.Method("torch_memory_saver" if knobs.get("peer") else "uvm memory_saver")
    model, cache = method.build()
    state = bench.DecodeState()
    graph = bench.capture(model, cache, state)
    bench.decode(graph, cache, state)
    sleep_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) + cache.numel() * cache.element_size()
    raw = RawAllocation(0) if knobs.get("raw") or knobs.get("poll") else None
    if knobs.get("poll") == "map":
        raw.release()  # each poll maps and releases it

    def timed_ms(action) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        action()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    rows = []
    for _ in range(cycles):
        row = {}
        if knobs.get("idle_sleep"):
            torch.cuda.synchronize()
            time.sleep(knobs["idle_sleep"])
        if knobs.get("raw") == "before_sleep":
            row.update(raw.release())
        free_before = torch.cuda.mem_get_info()[0]
        row["pause kv_cache"] = timed_ms(lambda: method.saver.pause("kv_cache"))
        row["pause weights"] = timed_ms(lambda: method.saver.pause("weights"))
        # The bench's big claim: everything free, then freed (a pool of its own: see rl_bench.child).
        pool, holder = torch.cuda.MemPool(), []
        with torch.cuda.use_mem_pool(pool):
            holder.append(torch.empty(int(0.9 * sleep_bytes) + free_before - 512 * (1 << 20), dtype=torch.uint8, device="cuda"))
        holder[0].fill_(1)
        del holder, pool
        if knobs.get("idle_wake"):
            torch.cuda.synchronize()
            time.sleep(knobs["idle_wake"])
        row["wake"] = timed_ms(lambda: (method.saver.resume("weights"), method.saver.resume("kv_cache")))
        poller = stop = None
        if knobs.get("poll"):
            stop, polls = threading.Event(), []

            def polling():
                while not stop.wait(0.05):
                    polls.append(raw.poll(knobs["poll"] == "map"))
            poller = threading.Thread(target=polling)
            poller.start()
        if raw is not None and knobs.get("raw") in ("before_sleep", "after_wake"):
            if knobs["raw"] == "after_wake":
                time.sleep(knobs.get("raw_delay", 0.0))
                row.update(raw.release())
            raw.map()
        if not knobs.get("no_decode"):
            row["decode"] = timed_ms(lambda: decode(graph, cache, state, raw, knobs.get("raw"), row))
        if poller is not None:
            stop.set()
            poller.join()
            row["polls"], row["longest poll"], row["all polls"] = len(polls), max(polls, default=0.0), sum(polls)
        rows.append(row)
    return rows


def summary(name: str, rows: list[dict]) -> str:
    steady = rows[2:]  # the wait shows from the third cycle on
    cells = []
    for key in rows[0]:
        values = [r[key] for r in steady]
        cells.append(f"{key} {statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
    return f"| {name} | " + ", ".join(cells) + " |"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(VARIANTS[args.child], args.cycles)), flush=True)
        os._exit(0)  # as the RL bench: torch_memory_saver's torch mode aborts at teardown
    print("ms, steady cycles (third on): median (fastest-slowest)\n\n| variant | calls |\n|---|---|", flush=True)
    status = 0
    for name in [v.strip() for v in args.variants.split(",") if v.strip()]:
        if VARIANTS[name].get("peer") and importlib.util.find_spec("torch_memory_saver") is None:
            print(f"| {name} | not installed: left out |", flush=True)
            continue
        env = dict(os.environ, UVM_SETTLE="1" if VARIANTS[name].get("settle") else "0")
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--cycles", str(args.cycles), "--child", name],
                              capture_output=True, text=True, timeout=600, env=env)
        if proc.returncode != 0:
            print(f"| {name} | FAILED: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode} |", flush=True)
            status = 1
            continue
        print(summary(name, json.loads(proc.stdout.strip().splitlines()[-1])), flush=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
