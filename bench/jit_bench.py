"""JIT build time, side by side in one run: uvm's build (cold: empty cache; warm: cache hit) against
torch.utils.cpp_extension.load_inline of an equivalent minimal managed allocator (the seed's method).
Each measurement runs in a fresh process so no import or cache is shared. Writes a markdown table and
JSON (with device, driver, torch and CUDA versions) to $OUT or ./bench-out."""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("OUT", ROOT / "bench-out"))

UVM_COLD = """
import time, uvm._build as b
t = time.perf_counter(); b.build(); print(time.perf_counter() - t)
"""
UVM_WARM = UVM_COLD
SEED_SOURCE = r'''
#include <cuda_runtime_api.h>
#include <cstddef>
extern "C" {
void* managed_malloc(size_t size, int device, cudaStream_t) {
  void* p = nullptr; int prev = 0; cudaGetDevice(&prev); cudaSetDevice(device);
  if (cudaMallocManaged(&p, size, cudaMemAttachGlobal) != cudaSuccess) p = nullptr;
  cudaSetDevice(prev); return p;
}
void managed_free(void* p, size_t, int, cudaStream_t) { cudaFree(p); }
}
'''
SEED = """
import time
from torch.utils.cpp_extension import load_inline
t = time.perf_counter()
load_inline(name="seed_managed_alloc", cpp_sources=[%r], with_cuda=True, extra_ldflags=["-lcudart"],
            is_python_module=False, verbose=False)
print(time.perf_counter() - t)
""" % SEED_SOURCE


def timed(code: str, env: dict) -> float:
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                            text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return float(result.stdout.strip().splitlines()[-1])


def versions() -> dict:
    info = {"python": sys.version.split()[0]}
    try:
        import torch
        info.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                    device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
    except ImportError:
        info["torch"] = "not installed"
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    info["driver"] = smi.stdout.strip() or "unknown"
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True)
    info["nvcc"] = nvcc.stdout.strip().splitlines()[-1] if nvcc.returncode == 0 else "unknown"
    info["cpus"] = os.cpu_count()
    return info


def main(repeats: int = 3) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": str(ROOT / "python_shim"), "UVM_LIBRARY": ""}
    rows = {"uvm cold": [], "uvm warm": [], "load_inline cold": [], "load_inline warm": []}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as ext:
            rows["uvm cold"].append(timed(UVM_COLD, {**env, "UVM_CACHE_DIR": cache}))
            rows["uvm warm"].append(timed(UVM_WARM, {**env, "UVM_CACHE_DIR": cache}))
            rows["load_inline cold"].append(timed(SEED, {"TORCH_EXTENSIONS_DIR": ext}))
            rows["load_inline warm"].append(timed(SEED, {"TORCH_EXTENSIONS_DIR": ext}))
    median = {name: statistics.median(values) for name, values in rows.items()}
    info = versions()
    lines = [f"JIT build, median of {repeats} (fresh process each; {info.get('device')}, driver "
             f"{info['driver']}, torch {info.get('torch')} (CUDA {info.get('torch_cuda')}), {info['nvcc']}, "
             f"{info['cpus']} CPUs)", "", "| build | uvm | load_inline (seed) | uvm speed-up |",
             "| --- | --- | --- | --- |"]
    for kind in ("cold", "warm"):
        ours, seed = median[f"uvm {kind}"], median[f"load_inline {kind}"]
        lines.append(f"| {kind} | {ours * 1e3:.1f} ms | {seed * 1e3:.1f} ms | {seed / ours:.1f}x |")
    table = "\n".join(lines)
    print(table)
    (OUT / "jit_bench.md").write_text(table + "\n")
    (OUT / "jit_bench.json").write_text(json.dumps({"runs": rows, "median_s": median, "versions": info},
                                                   indent=2))


if __name__ == "__main__":
    main()
