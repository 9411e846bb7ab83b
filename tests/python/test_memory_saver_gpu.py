"""GPU: uvm.memory_saver behaves like torch_memory_saver. Paused memory is free in mem_get_info and
can be allocated by plain torch at once; virtual addresses never change; CPU-backed tensors come back
bit-identical, neighbours and other tags are never touched; CUDA graphs replay bit-identically after
a resume. Each test runs in a child process (the memory saver's pools live for the process).
Releasable memory is device memory, not managed; the sizes stay ≤ 1 GiB all the same."""
import os

import pytest
from conftest import python

torch = pytest.importorskip("torch", reason="torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

PRELUDE = r"""
import ctypes, torch, uvm
from uvm.memory_saver import torch_memory_saver as saver
MiB = 1 << 20
def pattern(n, seed, device="cuda"):
    # int32 steps of 64 MiB, so that the temporaries stay small (a region would cache them too)
    out = torch.empty(n, dtype=torch.uint8, device=device)
    for start in range(0, n, 64 * MiB):
        count = min(64 * MiB, n - start)
        index = torch.arange(start, start + count, device=device, dtype=torch.int64)
        out[start:start + count] = ((index * 131 + seed * 17 + 1) % 251).to(torch.uint8)
    return out
def free():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]
"""


def run(body: str, timeout: float = 300):
    result = python(PRELUDE + body, timeout=timeout)
    assert result.stdout.strip().endswith("ok"), result.stdout + result.stderr
    return result


@pytest.mark.parametrize("backup", [True, False])
def test_pause_frees_the_memory_for_mem_get_info_and_resume_keeps_addresses(backup):
    run(f"""
backup = {backup}
with saver.region(tag="weights", enable_cpu_backup=backup):
    w = pattern(512 * MiB, 1)
address = w.data_ptr()
before = free()
saver.pause("weights")
freed = free() - before
assert freed >= 0.9 * 512 * MiB, f"mem_get_info shows {{freed}} bytes freed of {{512 * MiB}}"
assert uvm.residency(tag="weights")["released_bytes"] >= 512 * MiB
paused = ctypes.c_size_t()
assert uvm.library().uvm_paused_count(-1, b"weights", ctypes.byref(paused)) == 0 and paused.value >= 1
saver.pause("weights")  # pausing again is harmless
saver.resume("weights")
assert free() <= before + 64 * MiB
saver.resume("weights")  # and so is resuming again
assert w.data_ptr() == address
if backup:
    assert torch.equal(w, pattern(512 * MiB, 1)), "the CPU-backed tensor came back different"
else:
    w.fill_(3)
    assert int(w.sum()) == 3 * 512 * MiB
print("ok")
""")


def test_other_tags_plain_tensors_and_unpaused_neighbours_are_untouched():
    run(r"""
plain_before = pattern(3 * MiB + 7, 9)
with saver.region(tag="kv"):
    kv = [pattern(n, i) for i, n in enumerate([512, 1000, 4 * MiB, 100_001])]
with saver.region(tag="weights", enable_cpu_backup=True):
    weights = [pattern(n, 10 + i) for i, n in enumerate([512, 1, 2 * MiB + 3, 64 * MiB])]
plain_after = pattern(5 * MiB, 8)
for cycle in range(3):
    saver.pause("kv")
    for i, t in enumerate(weights):  # still on the GPU and writable while kv is away
        assert torch.equal(t, pattern(t.numel(), 10 + i + cycle)), f"weights[{i}] changed in cycle {cycle}"
        t.copy_(pattern(t.numel(), 11 + i + cycle))
    saver.pause("weights")
    saver.resume("weights")
    saver.resume("kv")
    for i, t in enumerate(weights):
        assert torch.equal(t, pattern(t.numel(), 11 + i + cycle)), f"weights[{i}] lost in cycle {cycle}"
    assert torch.equal(plain_before, pattern(3 * MiB + 7, 9)) and torch.equal(plain_after, pattern(5 * MiB, 8))
print("ok")
""")


def test_the_freed_memory_is_allocatable_by_plain_torch_when_the_gpu_is_full():
    run(r"""
import time
expected = pattern(1024 * MiB, 4).cpu()
with saver.region(tag="model", enable_cpu_backup=True):
    model = torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
model.copy_(expected)
torch.cuda.synchronize()
torch.cuda.empty_cache()
ballast = torch.empty(free() - 256 * MiB, dtype=torch.uint8, device="cuda")  # the GPU is now full
saver.pause("model")
start = time.perf_counter()
claim = torch.empty(900 * MiB, dtype=torch.uint8, device="cuda")  # can only come from the paused memory
claim.fill_(1)
torch.cuda.synchronize()
print(f"claim of 900 MiB after pause: {(time.perf_counter() - start) * 1e3:.1f} ms")
del claim
torch.cuda.empty_cache()
saver.resume("model")
assert torch.equal(model.cpu(), expected)
del ballast
print("ok")
""")


def test_a_cuda_graph_replays_bit_identically_after_pause_and_resume():
    run(r"""
with saver.region(tag="weights", enable_cpu_backup=True):
    weight = torch.randn(1024, 1024, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
with saver.region(tag="kv"):
    cache = torch.zeros(256, 1024, device="cuda")
static_in = torch.randn(64, 1024, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
def step():
    hidden = torch.relu(static_in @ weight)  # an intermediate in the graph's (pausable) pool
    cache[:64].copy_(hidden)
    return (hidden @ weight.T).sum(dim=1)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    step()
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with saver.cuda_graph(graph, tag="graph"):
    out = step()
graph.replay()
first = out.clone()
first_cache = cache[:64].clone()
for cycle in range(3):
    saver.pause()
    filler = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda").fill_(cycle)  # reuse the freed memory
    del filler
    saver.resume()
    cache.zero_()  # dropped without backup: the caller refills it
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first), f"replay after resume differs in cycle {cycle}"
    assert torch.equal(cache[:64], first_cache)
print("ok")
""")


def test_nested_regions_and_disable_choose_where_each_tensor_goes():
    run(r"""
with saver.region(tag="default", enable_cpu_backup=True):
    model = pattern(8 * MiB, 1)
    with saver.region(tag="grad", enable_cpu_backup=False):
        grad = pattern(8 * MiB, 2)
        with saver.disable():
            plain = pattern(8 * MiB, 3)
    after_inner = pattern(8 * MiB, 4)
lib = uvm.library()
assert lib.uvm_allocation_info(plain.data_ptr(), None, None, None) != 0, "disable() still allocated from uvm"
lib.uvm_clear_last_error()
assert set(uvm.tags()) >= {"default", "grad"}
saver.pause()
saver.resume()
assert torch.equal(model, pattern(8 * MiB, 1)) and torch.equal(after_inner, pattern(8 * MiB, 4))
assert torch.equal(plain, pattern(8 * MiB, 3))
grad.fill_(0)
assert int(grad.sum()) == 0
print("ok")
""")


def test_get_cpu_backup_while_paused():
    run(r"""
with saver.region(enable_cpu_backup=True):
    x = torch.full((10, 20, 30), 1.5, device="cuda")
with saver.region(tag="nobackup"):
    y = torch.ones(100, device="cuda")
assert saver.get_cpu_backup(x) is None  # not paused
saver.pause()
backup = saver.get_cpu_backup(x)
assert backup.device.type == "cpu" and backup.shape == x.shape and backup.dtype == x.dtype
assert torch.equal(backup, torch.full((10, 20, 30), 1.5))
assert saver.get_cpu_backup(y) is None  # paused without a backup
assert torch.equal(saver.get_cpu_backup(x, zero_copy=True), backup)
saver.resume()
assert saver.get_cpu_backup(x) is None
try:
    saver.get_cpu_backup(x.transpose(0, 1))
except ValueError as error:
    assert "contiguous" in str(error)
else:
    raise AssertionError("a non-contiguous tensor was accepted")
print("ok")
""")


def test_resume_refuses_to_pass_the_memory_margin_and_can_be_retried():
    run(r"""
with saver.region(tag="big", enable_cpu_backup=True):
    big = pattern(256 * MiB, 5)
saver.pause("big")
saver.memory_margin_bytes = torch.cuda.mem_get_info()[1]  # more than the card has
try:
    saver.resume("big")
except MemoryError as error:
    assert "memory_margin_bytes" in str(error)
else:
    raise AssertionError("resume passed the margin")
saver.memory_margin_bytes = 0
saver.resume("big")
assert torch.equal(big, pattern(256 * MiB, 5))
print("ok")
""")


def test_retain_cpu_backup_keeps_the_pinned_memory_between_cycles():
    run(r"""
with saver.region(tag="w", enable_cpu_backup=True):
    w = pattern(64 * MiB, 6)
saver.pause("w"); saver.resume("w")
# Given back before resume returns, as the original: its page tables are device memory
# (torch_memory_saver's training_engine test checks that nothing moves after a resume).
assert uvm.staging()["capacity_bytes"] == 0, "the backup's pinned memory was kept after resume without retain"
assert saver.get_cpu_backup(w) is None
saver.retain_cpu_backup = True
saver.pause("w")
first = saver.get_cpu_backup(w, zero_copy=True).data_ptr()
saver.resume("w")
assert uvm.staging()["capacity_bytes"] >= 64 * MiB
assert torch.equal(w, pattern(64 * MiB, 6))
kept = saver.get_cpu_backup(w, zero_copy=True)  # the retained copy, where it was, as it was paused
assert kept.data_ptr() == first and torch.equal(kept, pattern(64 * MiB, 6).cpu())
assert uvm.kept_copies(tag="w")["retained_bytes"] == 64 * MiB
w.copy_(pattern(64 * MiB, 7))
saver.pause("w")  # written again in place
again = saver.get_cpu_backup(w, zero_copy=True)
assert again.data_ptr() == first and torch.equal(again, pattern(64 * MiB, 7).cpu())
del kept, again
saver.retain_cpu_backup = False
saver.resume("w")
assert torch.equal(w, pattern(64 * MiB, 7))
assert saver.get_cpu_backup(w) is None and uvm.staging()["capacity_bytes"] == 0
print("ok")
""")


def test_a_retained_backup_goes_with_its_tensor_and_an_mmap_one_with_a_resume_that_does_not_retain():
    run(r"""
saver.retain_cpu_backup = True
with saver.region(tag="p", enable_cpu_backup=True):
    p = pattern(32 * MiB, 8)
with saver.region(tag="m", enable_cpu_backup=True, cpu_backup_backend="mmap"):
    m = pattern(32 * MiB, 9)
saver.pause(); saver.resume()
assert torch.equal(p, pattern(32 * MiB, 8)) and torch.equal(m, pattern(32 * MiB, 9))
assert torch.equal(saver.get_cpu_backup(m), pattern(32 * MiB, 9).cpu())
assert uvm.kept_copies("all")["retained_bytes"] == 64 * MiB
del p
torch.cuda.synchronize()
assert uvm.kept_copies("all")["retained_bytes"] == 32 * MiB
assert uvm.staging()["capacity_bytes"] == 0, "a freed tensor's retained backup kept its pinned memory"
saver.retain_cpu_backup = False
saver.pause("m"); saver.resume("m")
assert saver.get_cpu_backup(m) is None and uvm.kept_copies("all")["retained_bytes"] == 0
assert torch.equal(m, pattern(32 * MiB, 9))
print("ok")
""")


def test_managed_backing_works_and_uvm_mem_get_info_counts_what_it_offloaded():
    run(r"""
saver.backing = "managed"
with saver.region(tag="m", enable_cpu_backup=True):
    m = pattern(128 * MiB, 7)
assert uvm.library().uvm_is_managed(m.data_ptr()) == 1
free_before, total = uvm.mem_get_info()
saver.pause("m")
free_after, _ = uvm.mem_get_info()
assert free_after - free_before >= 0.9 * 128 * MiB, (free_before, free_after)
saver.resume("m")
assert torch.equal(m, pattern(128 * MiB, 7))
print("ok")
""")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (this machine has fewer)")
def test_regions_on_two_devices_pause_and_resume_together():
    run(r"""
tensors = []
for d in (0, 1):
    torch.cuda.set_device(d)
    with saver.region(tag="t", enable_cpu_backup=True):
        tensors.append(pattern(256 * MiB, d, device=f"cuda:{d}"))
freed = [torch.cuda.mem_get_info(d)[0] for d in (0, 1)]
saver.pause("t")
for d in (0, 1):
    torch.cuda.synchronize(d)
    assert torch.cuda.mem_get_info(d)[0] - freed[d] >= 0.9 * 256 * MiB, f"cuda:{d} not freed"
saver.resume("t")
for d in (0, 1):
    assert torch.equal(tensors[d], pattern(256 * MiB, d, device=f"cuda:{d}"))
print("ok")
""")


@pytest.mark.parametrize("backend", ["mmap", "disk"])
def test_mmap_and_disk_backups_free_the_gpu_and_host_and_come_back_bit_identical(backend, tmp_path):
    """The original's two backends beside pinned: paused memory is free on the GPU; an mmap backup's
    host memory (RSS) goes back at resume, a disk backup's files exist only while paused and are the
    owner's alone; neighbours with no backup and other tags stay as they were; three cycles."""
    run(f"""
import os, stat, resource
backend = {backend!r}
disk_dir = {str(tmp_path / "backups")!r}
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
options = dict(enable_disk_backup=True) if backend == "disk" else dict(enable_cpu_backup=True, cpu_backup_backend="mmap")
if backend == "disk":
    saver.set_disk_backup_dir(disk_dir)
with saver.region(tag="weights", **options):
    w = pattern(384 * MiB, 1)
    small = pattern(7 * MiB + 12345, 2)
with saver.region(tag="kv"):
    kv = pattern(64 * MiB, 3)
address = w.data_ptr()
for cycle in range(3):
    rss_before, before = rss(), free()
    saver.pause("weights")
    freed = free() - before
    assert freed >= 0.9 * 384 * MiB, f"mem_get_info shows {{freed}} bytes freed"
    kept = uvm.kept_copies("all", "weights")
    if backend == "disk":
        files = [f for f in os.listdir(disk_dir) if f.endswith(".backup")]
        assert len(files) >= 2, files
        assert kept["disk_bytes"] >= 384 * MiB and kept["disk_files"] == len(files), kept
        for f in files:
            assert stat.S_IMODE(os.stat(os.path.join(disk_dir, f)).st_mode) == 0o600
        # uvm's bounce buffers (UVM_BACKUP_THREADS × 16 MiB, pinned) stay until resume; the backup is 391 MiB
        assert rss() - rss_before < 128 * MiB + 8 * 16 * MiB, "a disk backup held host memory"
    else:
        assert kept["pageable_bytes"] >= 384 * MiB, kept
    occupy = torch.empty(300 * MiB, dtype=torch.uint8, device="cuda")  # the freed memory is usable
    del occupy
    torch.cuda.empty_cache()
    saver.resume("weights")
    assert w.data_ptr() == address
    assert torch.equal(w, pattern(384 * MiB, 1)), f"cycle {{cycle}}: the backed-up tensor came back different"
    assert torch.equal(small, pattern(7 * MiB + 12345, 2))
    assert torch.equal(kv, pattern(64 * MiB, 3)), "another tag was touched"
    assert uvm.kept_copies("all", "weights") == dict(pinned_bytes=0, pageable_bytes=0, disk_bytes=0, disk_files=0,
                                                          retained_bytes=0)
    if backend == "disk":
        assert not [f for f in os.listdir(disk_dir) if f.endswith(".backup")]
    assert rss() - rss_before < 128 * MiB, f"host memory not given back: {{(rss() - rss_before) >> 20}} MiB more"
    w.add_(0)  # the program goes on using it
print("ok")
""")


def test_a_resume_with_no_room_raises_memory_error_and_stays_paused_and_resumable(tmp_path):
    """The original aborts the process when a resume finds the GPU full; uvm raises MemoryError,
    keeps every tensor paused with its backup, and resumes once there is room."""
    run(f"""
saver.set_disk_backup_dir({str(tmp_path / "backups")!r})
with saver.region(tag="weights", enable_disk_backup=True):
    w = pattern(256 * MiB, 5)
saver.pause("weights")
hog = []
try:
    while True:
        hog.append(torch.empty(64 * MiB, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    pass
try:
    saver.resume("weights")
except MemoryError as e:
    message = str(e)
else:
    raise AssertionError("resume with the GPU full did not raise")
assert "uvm_resume" in message, message
paused = ctypes.c_size_t()
assert uvm.library().uvm_paused_count(-1, b"weights", ctypes.byref(paused)) == 0 and paused.value >= 1
assert uvm.kept_copies("all", "weights")["disk_bytes"] >= 256 * MiB
del hog
torch.cuda.empty_cache()
saver.resume("weights")
assert torch.equal(w, pattern(256 * MiB, 5))
print("ok")
""")


def test_a_retained_disk_backup_keeps_its_files_between_cycles_and_they_go_at_a_resume_without_retaining_and_at_exit(tmp_path):
    """retain_cpu_backup with a disk backup: the files (and their blocks) stay from one cycle to the
    next, written again in place by each pause with the bytes of that moment; a resume without
    retaining removes them, and so does the end of the process."""
    disk_dir = tmp_path / "backups"
    run(f"""
import os
disk_dir = {str(disk_dir)!r}
saver.set_disk_backup_dir(disk_dir)
saver.retain_cpu_backup = True
def files():
    return sorted(f for f in os.listdir(disk_dir) if f.endswith(".backup"))
with saver.region(tag="weights", enable_disk_backup=True):
    w = pattern(96 * MiB, 1)
    small = pattern(3 * MiB + 4321, 2)
kept_files = None
for cycle in range(3):
    saver.pause("weights")
    kept_files = kept_files or files()
    assert len(kept_files) >= 2 and files() == kept_files, (cycle, kept_files, files())
    saver.resume("weights")
    assert files() == kept_files, "a retained disk backup lost its file"
    assert uvm.kept_copies("all", "weights")["retained_bytes"] >= 96 * MiB
    assert torch.equal(w, pattern(96 * MiB, 1 + cycle)), f"cycle {{cycle}}: the bytes of this pause did not come back"
    assert torch.equal(small, pattern(3 * MiB + 4321, 2))
    w.copy_(pattern(96 * MiB, 2 + cycle))  # the program changes them: the next pause writes them in place
saver.retain_cpu_backup = False
saver.pause("weights")
saver.resume("weights")
assert torch.equal(w, pattern(96 * MiB, 4))
assert files() == [], files()
saver.retain_cpu_backup = True
saver.pause("weights")
saver.resume("weights")
assert len(files()) >= 2  # kept at the end: the exit removes them
print("ok")
""")
    assert not [f for f in os.listdir(disk_dir) if f.endswith(".backup")], "the process left its disk backups behind"
    assert not [f for f in os.listdir(disk_dir) if f.endswith(".lock")], "the process left its lock behind"


def test_two_threads_in_disable_with_no_region_open_leave_in_any_order():
    """Issue 57 item 5: disable() was not counted among open regions, so with none open the first
    thread to leave destroyed its pool while the other still allocated into its own, and torch
    aborted the process. Each thread's pool now dies at the end of the last one's."""
    result = python(PRELUDE + r"""
import threading
entered, first_left = threading.Barrier(2), threading.Event()
kept = {}
def worker(name, leave_first):
    with saver.disable():
        kept[name] = torch.ones(1 << 20, device="cuda")
        entered.wait()
        if not leave_first:
            first_left.wait()
            kept[name + "-after"] = torch.ones(1 << 20, device="cuda")  # into its pool, the other's gone
    if leave_first:
        first_left.set()
threads = [threading.Thread(target=worker, args=("a", True)), threading.Thread(target=worker, args=("b", False))]
for t in threads: t.start()
for t in threads: t.join()
assert sorted(kept) == ["a", "b", "b-after"], kept
assert uvm._pools.waiting() == 0
print("ok")
""", check=False)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


def test_a_dropped_uvm_pool_goes_back_while_a_memory_saver_cuda_graph_lives():
    """Issue 57 item 6: a memory_saver CUDA graph holds its pool for the graph's life, which counted as
    an allocation under way, so every uvm pool dropped afterwards waited for the rest of the process."""
    run(r"""
import gc
graph = torch.cuda.CUDAGraph()
x = torch.ones(1 << 20, device="cuda")
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    y = x * 2  # warm-up outside the capture
torch.cuda.synchronize()
with saver.cuda_graph(graph, tag="graph"):
    y = x * 2
graph.replay()
pool = uvm.create_unified_mempool()
with torch.cuda.use_mem_pool(pool):
    t = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
del t, pool
gc.collect()
assert uvm._pools.waiting() == 0, f"{uvm._pools.waiting()} dropped pools wait"
del graph
print("ok")
""")


@pytest.mark.parametrize("backend", ["pinned", "mmap"])
def test_compressed_backups_take_less_host_memory_and_come_back_bit_identical(backend):
    run(f"""
saver.compress_backups = True
backend = {backend!r}
with saver.region(tag="weights", enable_cpu_backup=True, cpu_backup_backend=backend):
    w = torch.randn(256 * MiB // 2, dtype=torch.bfloat16, device="cuda") * 0.02
    b = pattern(8 * MiB + 123, 7)  # bytes that do not compress: kept as they are
with saver.region(tag="plain", enable_cpu_backup=True):  # pinned, as the default backend
    p = pattern(16 * MiB, 8)
expected_w, expected_b, expected_p = w.clone(), b.clone(), p.clone()
before = free()
saver.pause("weights")
saver.pause("plain")
assert free() - before >= 0.9 * 280 * MiB
raw, stored = ctypes.c_size_t(), ctypes.c_size_t()
lib = uvm.library()
assert lib.uvm_get_compressed_copies(-1, b"weights", ctypes.byref(raw), ctypes.byref(stored)) == 0
assert raw.value >= 264 * MiB, raw.value
assert stored.value <= 0.75 * 256 * MiB + 9 * MiB, (stored.value, raw.value)
# The setting is the process's: the other region's backup is compressed too (its bytes kept raw).
assert lib.uvm_get_compressed_copies(-1, b"plain", ctypes.byref(raw), None) == 0 and raw.value == 16 * MiB
saver.resume("weights")
saver.resume("plain")
assert torch.equal(w.view(torch.int16), expected_w.view(torch.int16)), "compressed weights came back different"
assert torch.equal(b, expected_b) and torch.equal(p, expected_p)
try:
    saver.compress_backups = False
except RuntimeError as e:
    assert "before the first region" in str(e)
else:
    raise AssertionError("compress_backups changed after the first region")
print("ok")
""")
