"""GPU: the installed wheel as a user has it (scripts/device_wheel.sh runs this with PATH holding only
its virtualenv's bin, no compiler and no CUDA_HOME): the block hook it ships for this torch is armed
after its probe and nothing is compiled; the libuvm.so it loads is the one for torch's CUDA runtime,
found where pip's torch put it, and the process holds that one runtime; a process with only NVIDIA's
CUDA 12 runtime wheel gets the CUDA 12 build and one with CUDA 13's the CUDA 13 build, each moving
bytes that come back whole; and without a hook uvm keeps every byte by migrating. Needs torch with
CUDA and GPU 0 (skipped with the reason otherwise); each child holds at most 64 MiB of managed memory."""
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import INSTALLED, ROOT, UVM_PATH, python

sys.path.insert(0, str(UVM_PATH))

torch = pytest.importorskip("torch", reason="torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)
if not INSTALLED:
    pytest.skip("tests the installed wheel (UVM_TEST_INSTALLED=1: scripts/device_wheel.sh)", allow_module_level=True)


def test_the_shipped_hook_for_this_torch_is_armed_beside_torchs_runtime_and_nothing_is_compiled(tmp_path):
    cache = tmp_path / "cache"
    code = """
import json, torch, uvm, uvm._lib as l, uvm._runtime as r, uvm._state as s
pool = uvm.create_unified_mempool()
print(json.dumps({"hook": str(s._blocks_hook_path), "status": s.block_hook_status(), "library": uvm._so_path,
                  "runtime": l.runtime_used.path if l.runtime_used else None,
                  "found_by": l.runtime_used.found_by if l.runtime_used else None,
                  "mapped": {str(k): sorted(v) for k, v in r.all_mapped().items()}, "torch": torch.__version__}))
"""
    found = json.loads(python(code, {"UVM_CACHE_DIR": str(cache)}).stdout.splitlines()[-1])
    minor = ".".join(found["torch"].split("+")[0].split(".")[:2])
    assert found["hook"].endswith(f"/uvm/_prebuilt/torch-{minor}/libuvm_torch_blocks.so") and found["status"].startswith("armed")
    assert found["library"].endswith(f"/uvm/_prebuilt/cuda{torch.version.cuda.split('.')[0]}/libuvm.so")
    assert list(found["mapped"]) == [torch.version.cuda.split(".")[0]] and len(found["mapped"][torch.version.cuda.split(".")[0]]) == 1
    assert not cache.exists() or not (cache / "builds.log").exists()  # no compiler ran


MOVE_BYTES = """
import ctypes, sys, uvm, uvm._lib as l
lib = uvm.library()
runtime = ctypes.CDLL(l.runtime_used.path)
n = 64 << 20
ptr = lib.uvm_malloc(n, 0, None)
assert ptr, lib.uvm_last_error()
pattern = bytes(range(256)) * (n // 256)
assert runtime.cudaMemcpy(ctypes.c_void_p(ptr), pattern, n, 1) == 0  # host to device
assert runtime.cudaDeviceSynchronize() == 0
ranges = (l.Range * 1)(l.Range(ptr, n))
l.check(lib.uvm_offload_ranges(ranges, 1, l.STRATEGIES[sys.argv[1]], None))
assert runtime.cudaDeviceSynchronize() == 0
l.check(lib.uvm_onload_ranges(ranges, 1, None))
back = ctypes.create_string_buffer(n)
assert runtime.cudaMemcpy(back, ctypes.c_void_p(ptr), n, 2) == 0  # device to host
print(uvm._so_path, l.runtime_used.path, back.raw == pattern, uvm.stats(0)["bytes_to_host"] >= n)
lib.uvm_free(ptr, n, 0, None)
"""


def _runtime_wheel(major: int) -> Path | None:
    pattern = "nvidia_cuda_runtime_cu12-*.whl" if major == 12 else "nvidia_cuda_runtime-13*.whl"
    found = sorted((ROOT / ".deps" / "wheels").glob(pattern))
    return found[0] if found else None


@pytest.mark.parametrize("major, strategy", [(12, "migrate"), (13, "staged")])
def test_each_cuda_runtime_gets_its_own_build_and_the_bytes_come_back(tmp_path, major, strategy):
    """No torch in these processes: what a ctypes user has. CUDA 12 has no discard, so its build
    migrates; CUDA 13's stages through pinned memory."""
    site = tmp_path / "site"
    if major == 12:
        wheel = _runtime_wheel(12)
        if wheel is None:
            pytest.skip("no nvidia-cuda-runtime-cu12 wheel in .deps/wheels")
        import subprocess
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                       check=True, timeout=300)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site) if major == 12 else "", str(UVM_PATH)])),
           "UVM_CACHE_DIR": str(tmp_path / "cache")}
    code = "import sys; sys.modules['torch'] = None; sys.argv = ['x', %r]\n" % strategy + MOVE_BYTES
    library, runtime, intact, moved = python(code, env).stdout.split()
    assert library.endswith(f"/uvm/_prebuilt/cuda{major}/libuvm.so")
    assert runtime.endswith(f"libcudart.so.{major}") and (major != 12 or runtime.startswith(str(site)))
    assert intact == "True" and moved == "True"


NO_HOOK = """
import warnings, torch, uvm, uvm._build as b
b.shipped_torch_hook = lambda version, abi: (None, "the test took this torch's hook away")
def no_compiler(*args, **kwargs):
    raise b.BuildError("the test has no compiler")
b.build_torch_blocks = no_compiler
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    pool = uvm.create_unified_mempool()
print("warned:", sum("block hook is unavailable" in str(w.message) for w in said))
N = 4 << 20
with torch.cuda.use_mem_pool(pool):
    keep = torch.full((N,), 3.0, device="cuda")
    old = torch.full((N,), 5.0, device="cuda")
uvm.offload([keep, old])  # auto: migrated by the driver, no copy kept
torch.cuda.synchronize()
del old
with torch.cuda.use_mem_pool(pool):
    new = torch.full((N,), 7.0, device="cuda")  # may take old's block
uvm.onload(keep)
torch.cuda.synchronize()
print("kept:", bool((keep == 3.0).all()), "new:", bool((new == 7.0).all()), "moved to host:", uvm.stats()["bytes_to_host"] >= N * 4)
try:
    uvm.create_releasable_mempool()
    print("releasable: made")
except uvm.UnifiedMemoryUnsupportedError as error:
    print("releasable: refused", "the test took this torch's hook away" in str(error))
"""


def test_without_a_hook_pools_migrate_every_byte_back_and_releasable_memory_is_refused(tmp_path):
    out = python(NO_HOOK, {"UVM_CACHE_DIR": str(tmp_path / "cache")}).stdout.splitlines()
    assert out[-3:] == ["warned: 1", "kept: True new: True moved to host: True", "releasable: refused True"]
