"""Offload/onload benchmark: how fast a model leaves the GPU and comes back.

A transformer-like model (64 layers of attention and MLP weights, biases and norms: 1,000+
parameters of mixed sizes, bf16) is allocated in a uvm pool. One cycle: offload, a plain allocation
claims the freed memory (proving it was reclaimable), free + empty_cache, onload, then a CUDA graph
captured before the first offload is replayed and must give the same checksums. Every method runs
in the same process, side by side:

  uvm auto / migrate / staged   uvm.offload(model, strategy=...) and uvm.onload(model)
  uvm pool                      uvm.offload(pool) and uvm.onload(pool): the pool's segments, no tensors
  uvm staged (no claim)          uvm staged with nothing allocated between offload and onload: the
                                onload into pages nobody else took (its spread is reported too)
  per-tensor prefetch           one cudaMemPrefetchAsync per parameter (Megatron's seed module)
  module.to()                   model.to('cpu') / model.to('cuda') on a plain copy (pointers change)
  pinned memcpy                 one cudaMemcpyAsync of the same bytes to/from cudaHostAlloc memory: the
                                limit. It frees nothing, so its cycle has no claim step (see below).

    python -m uvm bench [--sizes-mib 256,512,1024,2048,4096] [--small-mib 2048] [--cycles 3]
                  [--settle-s 0 [--settle-spin]] [--out DIR]

Two model shapes: "transformer" at each --sizes-mib, and "small" (--small-mib, 0 to skip): that many
bytes as 512 KiB tensors, what real models have thousands of (norms, biases, small projections).
PyTorch serves allocations up to 1 MiB from 2 MiB segments, so 2 GiB of them is 4,096 tensors in
1,024 uvm allocations.

Why pinned memcpy skips the claim: for about a second after a plain allocation of nearly the whole
card is freed, every host-to-device copy runs at half speed (27.6 against 55.4 GB/s on an H200;
bench/probes/claim_probe.py) while the driver takes the memory back. Measured after a claim, the limit
would read half of what the link does. --settle-s adds a pause (sleeping, or with --settle-spin
busy-waiting) after the claim, before each onload.

Writes results.json, results.md and offload_bandwidth.png (if matplotlib is there) to --out.
Managed memory stays at or under 25 % of the card: bigger sizes are refused.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

import uvm
from uvm import _lib

LAYERS = 64
MANAGED_SHARE = 0.25  # never more managed memory than this share of the card
METHODS = ["uvm auto", "uvm migrate", "uvm staged", "uvm staged (no claim)", "uvm pool", "per-tensor prefetch",
           "module.to()", "pinned memcpy"]
NO_CLAIM = "uvm staged (no claim)"
SMALL_TENSOR_BYTES = 512 << 10


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
                                capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return {"device": props.name, "memory_mib": props.total_memory >> 20, "driver": driver,
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "uvm": uvm.__version__,
            "python": platform.python_version(), "host": platform.node()}


class Model(torch.nn.Module):
    """Per layer: q, k, v, o (h×h) and an MLP (h×4h, 4h×h), all with biases, and two LayerNorms: 16
    parameters of three shapes; 64 layers plus an embedding and a final norm make 1,027."""

    def __init__(self, hidden: int, device):
        super().__init__()
        kw = {"device": device, "dtype": torch.bfloat16}
        self.embed = torch.nn.Embedding(4096, hidden, **kw)
        self.layers = torch.nn.ModuleList()
        for _ in range(LAYERS):
            layer = torch.nn.Module()
            for name in ("q", "k", "v", "o"):
                setattr(layer, name, torch.nn.Linear(hidden, hidden, **kw))
            layer.up = torch.nn.Linear(hidden, 4 * hidden, **kw)
            layer.down = torch.nn.Linear(4 * hidden, hidden, **kw)
            layer.norm1 = torch.nn.LayerNorm(hidden, **kw)
            layer.norm2 = torch.nn.LayerNorm(hidden, **kw)
            self.layers.append(layer)
        self.norm = torch.nn.LayerNorm(hidden, **kw)


class SmallTensors(torch.nn.Module):
    """`total_bytes` as 512 KiB bf16 parameters of random bits."""

    def __init__(self, total_bytes: int, device):
        super().__init__()
        count = max(1, total_bytes // SMALL_TENSOR_BYTES)
        self.tensors = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(SMALL_TENSOR_BYTES // 2, device=device, dtype=torch.bfloat16))
            for _ in range(count))


def build_model(shape: str, size_mib: int, device):
    if shape == "small":
        return SmallTensors(size_mib << 20, device)
    return Model(hidden_for(size_mib << 20), device)


def hidden_for(total_bytes: int) -> int:
    # 12 h² weights a layer, 2 bytes each, plus a 4096-row embedding; a multiple of 64.
    h = math.sqrt(total_bytes / (LAYERS * 24))
    return max(64, int(h) // 64 * 64)


def model_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def checksums(params):
    """Exact integer checksums of every parameter's bits (sum and sum of squares)."""
    out = []
    for p in params:
        bits = p.view(torch.int16).to(torch.int64)
        out.append(bits.sum())
        out.append((bits * bits).sum())
    return torch.stack(out)


class GraphCheck:
    """A CUDA graph captured before any offload that reads every parameter; replayed after onload."""

    def __init__(self, params):
        self.params = params
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.reference = checksums(params).clone()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = checksums(params)

    def replay_matches(self) -> bool:
        self.graph.replay()
        torch.cuda.synchronize()
        return bool(torch.equal(self.output, self.reference))


def claim_freed_memory(bytes_hidden: int) -> bool:
    """A plain allocation of what cudaMemGetInfo reports free plus 95 % of the bytes it cannot see
    (offloaded managed memory); True if it succeeded."""
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    # Nothing hidden (module.to, memcpy): leave headroom for the context's own allocations.
    claim = free + int(0.95 * bytes_hidden) if bytes_hidden else free - (256 << 20)
    try:
        block = torch.empty(claim, dtype=torch.uint8, device="cuda")
        block[-1] = 1
        torch.cuda.synchronize()
        del block
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        torch.cuda.empty_cache()


class PinnedCopy:
    """One cudaMemcpyAsync of `nbytes` between a plain device buffer and cudaHostAlloc memory, straight
    through the CUDA runtime torch loaded (torch's own pinned copy_ measured half the H2D speed on an
    H200, so it would flatter everything compared with it)."""

    def __init__(self, nbytes: int):
        import ctypes
        self.cudart = ctypes.CDLL("libcudart.so.13")
        self.nbytes = ctypes.c_size_t(nbytes)
        self.device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        self.host = ctypes.c_void_p()
        assert self.cudart.cudaHostAlloc(ctypes.byref(self.host), self.nbytes, 0) == 0, "cudaHostAlloc failed"

    def _copy(self, dst, src, kind: int):
        import ctypes
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        assert self.cudart.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), self.nbytes, kind, stream) == 0

    def out(self):
        self._copy(self.host.value, self.device.data_ptr(), 2)  # cudaMemcpyDeviceToHost

    def back(self):
        self._copy(self.device.data_ptr(), self.host.value, 1)  # cudaMemcpyHostToDevice

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.cudart.cudaFreeHost(self.host)
        del self.device


def ranges_by_device(shim, obj, include_buffers: bool = True) -> dict[int, dict]:
    """What a move by tensors finds in Python before its first C call, with `shim` (a uvm.torch
    module): the byte ranges `obj` covers, grouped by device. An older tree's shim that had this
    as _ranges_by_device is asked for it directly."""
    if hasattr(shim, "_ranges_by_device"):
        return shim._ranges_by_device(obj, include_buffers)
    listed: list = []
    shim._list(obj, include_buffers, listed)
    into: dict = {}
    for _ in shim._gather(listed, into):
        pass
    return into


def timed(action) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    action()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def per_tensor_loop(params, location: int):
    lib = _lib.library()
    stream = torch.cuda.current_stream().cuda_stream
    for p in params:  # the seed's way: one driver call per parameter
        _lib.check(lib.uvm_prefetch(p.data_ptr(), p.numel() * p.element_size(), location, stream))


def settle(seconds: float, spin: bool):
    if not spin:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run_size(shape: str, size_mib: int, cycles: int, methods: list[str], pause, progress) -> list[dict]:
    total = torch.cuda.get_device_properties(0).total_memory
    if size_mib << 20 > MANAGED_SHARE * total:
        raise SystemExit(f"{size_mib} MiB is above {MANAGED_SHARE:.0%} of this card: refused (safety rule)")
    pool = uvm.create_unified_mempool(0)
    with torch.cuda.use_mem_pool(pool):
        model = build_model(shape, size_mib, "cuda")
    params = list(model.parameters())
    param_count = len(params)
    # What finding the model's ranges costs the Python shim (part of every by-tensor move).
    gather_s = min(timed(lambda: ranges_by_device(uvm.torch, model)) for _ in range(3))
    nbytes = model_bytes(model)
    check = GraphCheck(params)
    rows = []

    def measure(method, offload, onload, hidden, graph=True):
        """hidden: bytes the offload frees that mem_get_info cannot see; None: no claim step."""
        if method not in methods:
            return
        results = []
        first = method in ("uvm auto", "uvm staged", "uvm pool")  # NO_CLAIM runs after uvm staged: staging is warm
        if first:  # cycle 0 is then a first offload: no staging memory pinned, no preparation call
            torch.cuda.synchronize()
            uvm.release_staging()
            first = uvm.staging()["capacity_bytes"] == 0
        first_offload_s = None
        for cycle in range(cycles + 1):  # cycle 0 warms up (pinned staging is allocated there)
            t_off = timed(offload)
            if cycle == 0 and first:
                first_offload_s = t_off
            reclaimed = claim_freed_memory(hidden) if hidden is not None else None
            pause()
            t_on = timed(onload)
            ok = check.replay_matches() if graph else True
            if cycle > 0:
                results.append((t_off, t_on, reclaimed, ok))
            progress()
        off = statistics.median(nbytes / r[0] / 1e9 for r in results)
        on = statistics.median(nbytes / r[1] / 1e9 for r in results)
        rows.append({"shape": shape, "size_mib": size_mib, "bytes": nbytes, "params": param_count, "method": method,
                     "offload_gbps": round(off, 2), "onload_gbps": round(on, 2),
                     "reclaimed": None if hidden is None else all(r[2] for r in results), "graph_ok": all(r[3] for r in results) if graph else None,
                     "offload_s": [round(r[0], 5) for r in results], "onload_s": [round(r[1], 5) for r in results],
                     "first_offload_gbps": None if first_offload_s is None else round(nbytes / first_offload_s / 1e9, 2),
                     "ranges_found_ms": round(gather_s * 1e3, 2)})

    for strategy in ("auto", "migrate", "staged"):
        measure(f"uvm {strategy}", lambda s=strategy: uvm.offload(model, strategy=s), lambda: uvm.onload(model), nbytes)
    measure(NO_CLAIM, lambda: uvm.offload(model, strategy="staged"), lambda: uvm.onload(model), None)
    measure("uvm pool", lambda: uvm.offload(pool), lambda: uvm.onload(pool), nbytes)
    measure("per-tensor prefetch", lambda: per_tensor_loop(params, _lib.UVM_LOCATION_CPU),
            lambda: per_tensor_loop(params, 0), nbytes)
    del check, params
    # module.to() on a plain copy: pointers change, so no graph survives it.
    if "module.to()" in methods:
        with torch.no_grad():
            plain = build_model(shape, size_mib, "cuda")
        measure("module.to()", lambda: plain.to("cpu"), lambda: plain.to("cuda"), 0, graph=False)
        del plain
    if "pinned memcpy" in methods:
        with PinnedCopy(nbytes) as copy:
            measure("pinned memcpy", copy.out, copy.back, None, graph=False)
    del model
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def first_offload_text(row: dict) -> str:
    first = row.get("first_offload_gbps")
    return "–" if first is None else f"{first:.1f}"


def shape_of(row: dict) -> str:
    return row.get("shape", "transformer")  # results written before the small shape existed


def markdown(rows: list[dict]) -> str:
    """One row per shape, size and method, with ratios to the pinned memcpy of the same bytes."""
    lines = ["| model | params | method | offload GB/s | onload GB/s | offload vs pinned | onload vs pinned | "
             "reclaimed | graph replay | first offload GB/s (nothing pinned yet) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for shape, size in sorted({(shape_of(r), r["size_mib"]) for r in rows}, key=lambda k: (k[0] != "transformer", k)):
        group = [r for r in rows if r["size_mib"] == size and shape_of(r) == shape]
        pinned = next((r for r in group if r["method"] == "pinned memcpy"), {"offload_gbps": math.nan, "onload_gbps": math.nan})
        label = f"{size} MiB" if shape == "transformer" else f"{size} MiB {shape}"
        for r in group:
            graph = {True: "identical", False: "MISMATCH", None: "n/a (pointers change)" if r["method"] == "module.to()" else "n/a"}[r["graph_ok"]]
            lines.append(f"| {label} | {r['params']} | {r['method']} | {r['offload_gbps']:.1f} | {r['onload_gbps']:.1f} | "
                         f"{r['offload_gbps'] / pinned['offload_gbps']:.0%} | {r['onload_gbps'] / pinned['onload_gbps']:.0%} | "
                         f"{ {True: 'yes', False: 'NO', None: 'n/a'}[r['reclaimed']] } | {graph} | "
                         f"{first_offload_text(r)} |")
    return "\n".join(lines)


def goal_lines(rows: list[dict]) -> list[str]:
    lines = []
    big = [r for r in rows if shape_of(r) == "transformer"]
    if big:
        size = max(r["size_mib"] for r in big)
        by = {r["method"]: r for r in big if r["size_mib"] == size}
        if not {"uvm auto", "per-tensor prefetch", "pinned memcpy"} <= set(by):
            lines += [f"{m} at {size} MiB: offload {r['offload_gbps']:.1f} GB/s, onload {r['onload_gbps']:.1f} GB/s"
                      for m, r in by.items()]
        else:
            auto, loop, pinned = by["uvm auto"], by["per-tensor prefetch"], by["pinned memcpy"]
            lines += [f"{size} MiB, {auto['params']} parameters: uvm auto offload {auto['offload_gbps']:.1f} GB/s "
                      f"(goal >= 40), onload {auto['onload_gbps']:.1f} GB/s (goal >= 45)",
                      f"vs per-tensor prefetch: offload {auto['offload_gbps'] / loop['offload_gbps']:.1f}x (goal >= 5x), "
                      f"onload {auto['onload_gbps'] / loop['onload_gbps']:.1f}x",
                      f"vs pinned memcpy: offload {auto['offload_gbps'] / pinned['offload_gbps']:.0%} (goal >= 75%), "
                      f"onload {auto['onload_gbps'] / pinned['onload_gbps']:.0%} (goal >= 80%)"]
        if "uvm pool" in by and "uvm auto" in by:
            lines.append(f"{size} MiB: uvm.offload(pool) {by['uvm pool']['offload_gbps']:.1f} / "
                         f"{by['uvm pool']['onload_gbps']:.1f} GB/s against by tensors {by['uvm auto']['offload_gbps']:.1f} / "
                         f"{by['uvm auto']['onload_gbps']:.1f} (goal: no slower)")
    for r in rows:
        if r["method"] == NO_CLAIM and len(r.get("onload_s", [])) > 1:
            speeds = [r["bytes"] / s / 1e9 for s in r["onload_s"]]
            spread = (max(speeds) - min(speeds)) / statistics.median(speeds)
            lines.append(f"{r['size_mib']} MiB {shape_of(r)}, onload with no claim: {min(speeds):.1f}–{max(speeds):.1f} "
                         f"GB/s, median {r['onload_gbps']:.1f} (goal >= 48), spread {spread:.0%} of the median "
                         f"(goal <= 10%)")
        if r["method"] == "uvm auto" and "ranges_found_ms" in r:
            lines.append(f"{r['size_mib']} MiB {shape_of(r)}: the shim finds the {r['params']} tensors' ranges in "
                         f"{r['ranges_found_ms']:.1f} ms (part of each move by tensors)")
        if shape_of(r) == "small" and r["method"] in ("uvm auto", "uvm pool"):
            lines.append(f"small tensors, {r['params']} x 512 KiB, {r['method']}: offload {r['offload_gbps']:.1f} GB/s "
                         f"(goal >= 45), onload {r['onload_gbps']:.1f} GB/s (goal >= 40)")
    return lines


def plot(rows: list[dict], path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for axis, key, title in ((axes[0], "offload_gbps", "offload (GPU → host)"), (axes[1], "onload_gbps", "onload (host → GPU)")):
        for method in METHODS:
            points = sorted((r["size_mib"], r[key]) for r in rows if r["method"] == method and shape_of(r) == "transformer")
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("model size (MiB)")
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
    axes[0].set_ylabel("GB/s")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"uvm offload/onload bandwidth, {torch.cuda.get_device_name(0)}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


class Progress:
    """On a terminal, a bar (tqdm where installed) redrawn in place; elsewhere (a log file, a pipe)
    one plain line per cycle, so a log holds no carriage-return fragments."""

    def __init__(self, total: int, stream=None):
        self.stream = stream or sys.stderr
        self.done, self.total, self.bar = 0, total, None
        self.terminal = self.stream.isatty()
        if self.terminal:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc="offload/onload cycles", unit="cycle", file=self.stream)
            except ImportError:
                pass

    def __call__(self):
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.terminal:
            width = 40 * self.done // self.total
            print(f"\r[{'#' * width}{'.' * (40 - width)}] {self.done}/{self.total} cycles", end="", file=self.stream)
        else:
            print(f"cycle {self.done}/{self.total}", file=self.stream, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.terminal:
            print(file=self.stream)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mib", default="256,512,1024,2048,4096")
    parser.add_argument("--small-mib", type=int, default=2048,
                        help="bytes of the small-tensor model (512 KiB tensors); 0 skips it")
    parser.add_argument("--cycles", type=int, default=3, help="measured cycles per method (after one warm-up)")
    parser.add_argument("--methods", default=",".join(METHODS), help="a comma-separated subset of: " + ", ".join(METHODS))
    parser.add_argument("--settle-s", type=float, default=0.0,
                        help="pause between freeing the claim and the onload (see above)")
    parser.add_argument("--settle-spin", action="store_true", help="busy-wait the pause instead of sleeping")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device is present: the benchmark needs one")
        return 2
    runs = [("transformer", int(s)) for s in args.sizes_mib.split(",") if s.strip()]
    if args.small_mib > 0:
        runs.append(("small", args.small_mib))
    methods = [m.strip() for m in args.methods.split(",")]
    unknown = set(methods) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    os.makedirs(args.out, exist_ok=True)
    env = environment()
    print(f"device {env['device']} ({env['memory_mib']} MiB), driver {env['driver']}, torch {env['torch']} "
          f"(CUDA {env['torch_cuda']}), uvm {env['uvm']}")
    progress = Progress(len(runs) * len(methods) * (args.cycles + 1))
    rows = []
    for shape, size in runs:
        rows += run_size(shape, size, args.cycles, methods, lambda: settle(args.settle_s, args.settle_spin), progress)
    progress.close()
    table = markdown(rows)
    goals = goal_lines(rows)
    print(table)
    print("\n".join(goals))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"environment": env, "cycles": args.cycles, "settle_s": args.settle_s, "settle_spin": args.settle_spin,
                   "rows": rows, "goals": goals}, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table + "\n\n" + "\n".join(f"- {g}" for g in goals) + "\n")
    if plot(rows, os.path.join(args.out, "offload_bandwidth.png")):
        print(f"plot: {os.path.join(args.out, 'offload_bandwidth.png')}")
    bad = [r for r in rows if r["graph_ok"] is False or
           (r["method"].startswith("uvm") and r["method"] != NO_CLAIM and not r["reclaimed"])]
    for r in bad:
        print(f"FAILED: {r['method']} at {r['size_mib']} MiB ({shape_of(r)}): graph_ok={r['graph_ok']} reclaimed={r['reclaimed']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
