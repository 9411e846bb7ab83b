"""GPU: uvm's vLLM allocator (uvm.vllm.CuMemAllocator) where vLLM's own tests do not reach: a sleep
while another process maps a tensor is refused by name before anything sleeps; memory freed while
asleep is not lost and does not block the wake; a wake with the GPU full raises RuntimeError, leaves
everything asleep with its backups, and a retry works; every backup setting (kept, given back,
compressed) brings the bytes back over several cycles with writes between. vLLM's own allocator
tests (tests/peers/run_vllm_tests.sh) cover the rest of the contract, captured graphs included.
Each test runs in a child process (the allocator is a singleton). Releasable memory is device
memory, not managed; the sizes stay <= 1 GiB all the same."""
import os
import subprocess
import sys

import pytest
from conftest import UVM_PATH, python

torch = pytest.importorskip("torch", reason="torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

PRELUDE = r"""
import ctypes, gc, torch, uvm
from uvm.vllm import CuMemAllocator
MiB = 1 << 20
allocator = CuMemAllocator.get_instance()
def pattern(n, seed):
    index = torch.arange(n, device="cuda", dtype=torch.int64)
    return ((index * 131 + seed * 17 + 1) % 251).to(torch.uint8)
def asleep(tag):
    return [data.is_asleep for data in allocator.pointer_to_data.values() if data.tag == tag]
def free():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]
"""


def run(body: str, env: dict | None = None, timeout: float = 300):
    result = python(PRELUDE + body, env=env, timeout=timeout)
    assert result.stdout.strip().endswith("ok"), result.stdout + result.stderr
    return result


SHARED = PRELUDE + r"""
import sys
import torch.multiprocessing as mp

def receiver(inbox, outbox):
    weights = inbox.get()
    outbox.put(int(weights.to(torch.int64).sum()))
    assert inbox.get() == "drop"
    del weights
    gc.collect()
    outbox.put("dropped")
    assert inbox.get() == "exit"

if __name__ == "__main__":
    with allocator.use_memory_pool("weights"), uvm.sharing.exportable():
        weights = pattern(64 * MiB + 4096, 1)
    with allocator.use_memory_pool("kv_cache"):
        kv = pattern(32 * MiB, 2)
    expected = weights.clone()
    context = mp.get_context("spawn")
    inbox, outbox = context.Queue(), context.Queue()
    child = context.Process(target=receiver, args=(inbox, outbox), daemon=True)
    child.start()
    inbox.put(weights)
    assert outbox.get(timeout=120) == int(expected.to(torch.int64).sum())
    try:
        allocator.sleep(offload_tags=("weights",))
    except RuntimeError as error:
        message = str(error)
    else:
        raise AssertionError("a sleep under a receiver's mapping went through")
    assert "sleep of tag 'weights' refused" in message and f"mapped by process {child.pid}" in message, message
    assert not any(asleep("weights")) and not any(asleep("kv_cache")), "a refused sleep put a tag to sleep"
    assert torch.equal(weights, expected)
    inbox.put("drop")
    assert outbox.get(timeout=120) == "dropped"
    before = free()
    allocator.sleep(offload_tags=("weights",))
    assert free() - before >= 96 * MiB, "the sleep freed nothing"
    allocator.wake_up()
    assert torch.equal(weights, expected), "bytes lost across the sleep"
    inbox.put("exit")
    child.join(60)
    assert child.exitcode == 0, child.exitcode
    print("ok")
"""


def test_a_sleep_while_another_process_maps_a_tensor_is_refused_naming_it_and_nothing_sleeps(tmp_path):
    script = tmp_path / "shared.py"
    script.write_text(SHARED)
    env = {**os.environ, "PYTHONPATH": str(UVM_PATH)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


def test_memory_freed_while_asleep_is_not_lost_and_the_pools_go_back_while_asleep():
    run("""
with allocator.use_memory_pool("weights"):
    w1 = pattern(128 * MiB, 1)
    w2 = pattern(128 * MiB + 512, 2)
with allocator.use_memory_pool("kv_cache"):
    kv = pattern(64 * MiB, 3)
allocator.sleep(offload_tags=("weights",))
del w2, kv  # vLLM frees while asleep: a resized KV cache, a dropped LoRA
gc.collect()
allocator.wake_up()
assert torch.equal(w1, pattern(128 * MiB, 1)), "a neighbour of the freed tensor lost its bytes"
with allocator.use_memory_pool("weights"):
    w3 = pattern(64 * MiB, 4)  # a new pool of the tag, after the wake
allocator.sleep(offload_tags=("weights",))
allocator.wake_up(["weights"])
assert torch.equal(w1, pattern(128 * MiB, 1)) and torch.equal(w3, pattern(64 * MiB, 4))
allocator.sleep(offload_tags=("weights",))
kept = uvm.kept_copies("all", "vllm.weights")
assert kept["pinned_bytes"] >= 192 * MiB, kept
del w1, w3
gc.collect()
kept = uvm.kept_copies("all", "vllm.weights")
assert kept["pinned_bytes"] + kept["retained_bytes"] == 0, f"the backups of tensors freed while asleep stayed: {kept}"
allocator.release_pools()  # vLLM's worker at shutdown, asleep
torch.cuda.empty_cache()
count = ctypes.c_size_t()
for tag in (b"vllm.weights", b"vllm.kv_cache"):
    assert uvm.library().uvm_list_allocations(-1, tag, None, 0, ctypes.byref(count)) == 0 and count.value == 0, tag
live = uvm.stats(0)["live_bytes"]  # uvm's count, not the driver's free memory (kernels load, uvm keeps spares)
assert live == 0, f"the pools released while asleep kept {live} bytes"
print("ok")
""")


def test_a_wake_with_the_gpu_full_raises_runtime_error_stays_asleep_and_a_retry_works():
    run("""
with allocator.use_memory_pool("weights"):
    w = pattern(256 * MiB, 5)
allocator.sleep(offload_tags=("weights",))
hog = []
try:
    while True:
        hog.append(torch.empty(64 * MiB, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    pass
try:
    allocator.wake_up()
except RuntimeError as error:  # what vLLM's worker catches
    message = str(error)
else:
    raise AssertionError("a wake with the GPU full did not raise")
assert "wake_up of tag 'weights' failed" in message and "uvm_resume" in message, message
assert all(asleep("weights")), "a failed wake left some memory awake"
kept = uvm.kept_copies("all", "vllm.weights")
assert kept["pinned_bytes"] >= 256 * MiB, f"the backup is gone: {kept}"
del hog
torch.cuda.empty_cache()
allocator.wake_up()
assert torch.equal(w, pattern(256 * MiB, 5))
print("ok")
""")


@pytest.mark.parametrize("setting", ["kept", "given-back", "compressed-given-back", "mmap"])
def test_every_backup_setting_brings_the_bytes_back_over_cycles_with_writes_between(setting):
    env = {"UVM_VLLM_RETAIN_BACKUPS": "0" if "given-back" in setting else "1",
           "UVM_COMPRESS_BACKUPS": "1" if "compressed" in setting else "0",
           "UVM_VLLM_BACKUP": "mmap" if setting == "mmap" else "pinned"}
    run("""
with allocator.use_memory_pool("weights"):
    w = pattern(128 * MiB + 2, 6)
    neighbour = pattern(4096 + 3, 7)
with allocator.use_memory_pool("kv_cache"):
    kv = pattern(32 * MiB, 8)
for cycle in range(3):
    expected = w.clone()
    allocator.sleep(offload_tags=("weights",))  # level 1: weights kept, the KV cache dropped
    allocator.wake_up(["weights"])
    allocator.wake_up(["kv_cache"])
    assert torch.equal(w, expected), f"cycle {cycle}: weights changed"
    assert torch.equal(neighbour, pattern(4096 + 3, 7)), f"cycle {cycle}: a neighbour changed"
    if allocator._giving_back is not None:
        allocator._giving_back.join(60)
    w[cycle * MiB:(cycle + 1) * MiB].fill_(cycle)  # a write between cycles
    kv.fill_(cycle)
print("ok")
""", env=env)
