"""GPU (one device): hook mode "preload". Each test runs a child started inside
uvm.memory_saver.configure_subprocess(), so uvm's cudaMalloc interposer is preloaded there, as in a
process SGLang starts. Checked: every memory_saver feature reaches uvm through the interposer; plain
cudaMalloc memory beside paused memory keeps its bytes; a process with the interposer and no region
behaves as one without it. Releasable device memory, not managed; sizes ≤ 1 GiB."""
import json
import os
import subprocess
import sys

import pytest
from conftest import UVM_PATH

torch = pytest.importorskip("torch", reason="torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

PRELUDE = r"""
import ctypes, json, os, torch
from uvm.memory_saver import torch_memory_saver as saver
MiB = 1 << 20
def pattern(n, seed):
    index = torch.arange(n, device="cuda", dtype=torch.int64)
    return ((index * 131 + seed * 17 + 1) % 251).to(torch.uint8)
def free():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]
process = ctypes.CDLL(None)
def warm_up(step):  # on a side stream, as torch wants before a capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
"""


def child(body: str, preload: bool = True, env: dict | None = None, timeout: float = 300):
    """Runs PRELUDE + body in a child, started inside configure_subprocess() when `preload`."""
    import contextlib
    sys.path.insert(0, str(UVM_PATH))
    from uvm import _preload
    full_env = {**os.environ, "PYTHONPATH": str(UVM_PATH), **(env or {})}
    with _preload.child_environment() if preload else contextlib.nullcontext():
        if preload:
            full_env.update({name: os.environ[name] for name in ("LD_PRELOAD", "UVM_PRELOAD_LIBUVM", "UVM_PRELOAD_CUDART")
                             if name in os.environ})
        result = subprocess.run([sys.executable, "-c", PRELUDE + body], env=full_env, capture_output=True, text=True,
                                timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_every_backup_kind_tag_retain_and_margin_through_the_interposer(tmp_path):
    out = child(f"""
assert saver.hook_mode == "preload"
saver.set_disk_backup_dir({str(tmp_path / 'disk')!r})
made = {{}}
for tag, options in (("pinned", dict(enable_cpu_backup=True)), ("mmap", dict(enable_cpu_backup=True, cpu_backup_backend="mmap")),
                     ("disk", dict(enable_disk_backup=True)), ("dropped", {{}})):
    with saver.region(tag, **options):
        made[tag] = pattern(64 * MiB + 4096, len(made))
expected = {{tag: tensor.clone() for tag, tensor in made.items()}}
addresses = {{tag: tensor.data_ptr() for tag, tensor in made.items()}}
assert process.uvm_preload_live_allocations() >= 4
before = free()
saver.pause("pinned")
assert free() - before >= 64 * MiB, "pinned pause freed nothing"
assert torch.equal(saver.get_cpu_backup(made["pinned"]).cuda(), expected["pinned"])
saver.pause()
assert free() - before >= 4 * 64 * MiB
saver.memory_margin_bytes = free() + (1 << 40)
try:
    saver.resume()
except MemoryError as error:
    assert "memory_margin_bytes" in str(error)
else:
    raise AssertionError("margin not checked")
saver.memory_margin_bytes = 0
saver.retain_cpu_backup = True
saver.resume()
for tag in ("pinned", "mmap", "disk"):
    assert made[tag].data_ptr() == addresses[tag] and torch.equal(made[tag], expected[tag]), tag
kept = saver.get_cpu_backup(made["pinned"], zero_copy=True)
assert kept is not None and torch.equal(kept.cuda(), expected["pinned"])
def backup_files():  # beside them, uvm keeps the lock that marks its directory as a live process's
    return [name for name in os.listdir({str(tmp_path / 'disk')!r}) if not name.endswith(".lock")]
assert backup_files(), "a retained disk backup keeps its file for the next pause"
saver.retain_cpu_backup = False
saver.pause("disk")
saver.resume("disk")  # without retaining: the file goes
assert torch.equal(made["disk"], expected["disk"])
assert backup_files() == [], backup_files()
made["dropped"].fill_(7)
assert int(made["dropped"].sum()) == 7 * made["dropped"].numel()
print("ok")
""")
    assert out.strip().endswith("ok")


def test_plain_cudaMalloc_memory_beside_paused_memory_keeps_its_bytes():
    """Another library's cudaMalloc (ctypes, outside every region) and torch tensors outside a
    region, made between region allocations, keep their bytes through pause and resume and stay
    usable while paused; cudaFree of a paused pointer frees it."""
    out = child("""
torch.cuda.init()
plain = []
def other_library(n, byte):
    pointer = ctypes.c_void_p()
    assert process.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(n)) == 0
    torch.cuda.synchronize()
    ctypes.CDLL("libcudart.so.13").cudaMemset(pointer, ctypes.c_int(byte), ctypes.c_size_t(n))
    plain.append((pointer.value, n, byte))
kept, dropped, outside = [], [], []
for index in range(4):
    other_library(8 * MiB + 512 * index, 0x40 + index)
    with saver.region("kv", enable_cpu_backup=True):
        kept.append(pattern(32 * MiB + 4096 * index, index))
    outside.append(pattern(16 * MiB, 10 + index))
    with saver.region("scratch"):
        dropped.append(pattern(32 * MiB, 20 + index))
expected_kept = [t.clone() for t in kept]
expected_outside = [t.clone() for t in outside]
victim = ctypes.c_void_p()
with saver.region("kv", enable_cpu_backup=True):
    assert process.cudaMalloc(ctypes.byref(victim), ctypes.c_size_t(6912)) == 0
saver.pause()
for t, e in zip(outside, expected_outside):
    t.add_(0)  # usable while paused
    assert torch.equal(t, e)
assert process.cudaFree(victim) == 0
saver.resume()
cudart = ctypes.CDLL("libcudart.so.13")
for pointer, n, byte in plain:
    host = (ctypes.c_uint8 * n)()
    assert cudart.cudaMemcpy(host, ctypes.c_void_p(pointer), ctypes.c_size_t(n), 2) == 0
    assert bytes(host) == bytes([byte]) * n, hex(pointer)
    assert process.cudaFree(ctypes.c_void_p(pointer)) == 0
for t, e in zip(kept, expected_kept):
    assert torch.equal(t, e)
for t, e in zip(outside, expected_outside):
    assert torch.equal(t, e)
print("ok")
""")
    assert out.strip().endswith("ok")


def test_cuda_graph_and_disable_in_preload_mode():
    out = child("""
with saver.region("weights", enable_cpu_backup=True):
    weight = torch.randn(1024, 1024, device="cuda")
static_in = torch.randn(64, 1024, device="cuda")
warm_up(lambda: (static_in @ weight).relu())
graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
with saver.cuda_graph(graph, pool=pool, tag="graph"):
    static_out = (static_in @ weight).relu() * 3
graph.replay()
expected = static_out.clone()
before = free()
saver.pause("graph")
saver.pause("weights")
assert free() > before
with saver.disable():
    scratch = torch.ones(256 * MiB, dtype=torch.uint8, device="cuda")
    assert process.uvm_preload_get_region() == 0
    del scratch
saver.resume()
graph.replay()
assert torch.equal(static_out, expected)
print("ok")
""")
    assert out.strip().endswith("ok")


NO_REGION = r"""
torch.manual_seed(0)
tensors = [torch.randn(n, device="cuda") for n in (1, 1000, 1 << 20, 3 << 20)]
sums = [float(t.sum()) for t in tensors]
static = torch.randn(256, 256, device="cuda")
warm_up(lambda: (static @ static).tanh())
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    out = (static @ static).tanh()
graph.replay()
del tensors
stats = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
torch.cuda.empty_cache()
print(json.dumps({"sums": sums, "graph": float(out.sum()), "stats": stats, "after_empty": torch.cuda.memory_reserved(),
                  "interposed": getattr(process, "uvm_preload_live_allocations", lambda: 0)()}))
"""


def test_no_region_behaves_as_without_the_interposer():
    with_it = json.loads(child(NO_REGION).strip().splitlines()[-1])
    without = json.loads(child(NO_REGION, preload=False).strip().splitlines()[-1])
    assert with_it == without
    assert with_it["interposed"] == 0


def test_a_c_callers_region_allocation_is_paused_by_the_default_tag():
    """Issue 57 item 4 on the GPU: tms_set_interesting_region(1), cudaMalloc, tms_pause("default") as a C
    program calls them through the process's symbols (the original's tag starts as "default")."""
    out = child(r"""
import uvm
torch.cuda.init()
process.tms_set_interesting_region(True)
pointer = ctypes.c_void_p()
assert process.cudaMalloc(ctypes.byref(pointer), 4 * MiB) == 0
process.tms_set_interesting_region(False)
before = free()
assert process.tms_pause(b"default") == 0
print(json.dumps({"freed": free() - before, "paused": uvm.residency(tag="default")["released_bytes"]}))
assert process.tms_resume(b"default") == 0
assert process.cudaFree(pointer) == 0
""")
    result = json.loads(out.strip().splitlines()[-1])
    assert result["paused"] >= 4 * (1 << 20), result


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (a region on cuda:0, a tensor on cuda:1)")
def test_a_tensor_on_another_device_inside_a_region_is_refused_naming_both():
    """Issue 57 item 8: it became a tagged segment of cuda:1's default pool; a later tensor outside any
    region reused its block and pause(tag) unmapped it under that tensor (an illegal address)."""
    out = child(r"""
import subprocess
with saver.region(tag="kv", enable_cpu_backup=True):
    kept = torch.ones(1 << 20, device="cuda:0")
    try:
        torch.empty(1 << 20, device="cuda:1")
        print("allowed")
    except RuntimeError as error:
        print("refused", "invalid device" in str(error).lower())
outside = torch.ones(1 << 20, device="cuda:1")
saver.pause("kv")
assert bool((outside == 1).all())  # untouched: never region memory
saver.resume("kv")
assert bool((kept == 1).all())
""")
    assert out.strip().splitlines()[0] == "refused True", out
