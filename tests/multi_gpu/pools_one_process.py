"""One process, one uvm pool per device (2+ GPUs): allocations land on the pool's device, the
caller's current device is kept, and each device's tensors offload and onload on their own."""
import ctypes
import re

import torch

import uvm

MiB = 1 << 20
count = torch.cuda.device_count()
assert count >= 2, "needs 2 GPUs"
torch.cuda.set_device(0)
cudart = ctypes.CDLL("libcudart.so.13")


def runtime_device() -> int:
    device = ctypes.c_int(-1)
    assert cudart.cudaGetDevice(ctypes.byref(device)) == 0
    return device.value


pools = [uvm.create_unified_mempool(device=i) for i in range(count)]
assert torch.cuda.current_device() == 0 and runtime_device() == 0
tensors = []
for i, pool in enumerate(pools):
    with torch.cuda.use_mem_pool(pool, device=i):
        tensors.append(torch.full((64 * MiB // 4,), float(i + 1), device=f"cuda:{i}"))
lib = uvm.library()
for i, t in enumerate(tensors):
    owner = ctypes.c_int(-1)
    assert lib.uvm_allocation_info(t.data_ptr(), None, None, ctypes.byref(owner)) == 0
    assert owner.value == i and t.device.index == i, (i, owner.value, t.device)
    assert uvm.stats(i)["live_bytes"] >= t.numel() * 4
assert torch.cuda.current_device() == 0 and runtime_device() == 0, "allocation changed the current device"

for strategy in ("staged", "migrate"):
    for i, t in enumerate(tensors):
        uvm.offload(t, strategy=strategy)
        assert uvm.residency(i)["host_bytes"] >= t.numel() * 4
        uvm.onload(t)
    for i, t in enumerate(tensors):
        torch.cuda.synchronize(i)
        assert torch.equal(t, torch.full_like(t, float(i + 1))), f"device {i} data changed ({strategy})"
assert torch.cuda.current_device() == 0 and runtime_device() == 0, "offload changed the current device"
# A tag on both devices moves in one call, one move per device on that device's stream; the current
# device is kept and both devices' moves are reported.
tagged = []
for i, pool in enumerate(pools):
    with uvm.tag("both-devices"), torch.cuda.use_mem_pool(pool, device=i):
        tagged.append(torch.full((16 * MiB // 4,), float(10 + i), device=f"cuda:{i}"))
assert uvm.offload("both-devices") >= sum(t.numel() * 4 for t in tagged)
assert sorted(move["device"] for move in uvm.last_move()) == list(range(count)), uvm.last_move()
assert all(move["call"] == "uvm_offload_selection" for move in uvm.last_move())
uvm.onload("both-devices")
for i, t in enumerate(tagged):
    torch.cuda.synchronize(i)
    assert torch.equal(t, torch.full_like(t, float(10 + i))), f"device {i}: a tag's bytes changed"
assert torch.cuda.current_device() == 0 and runtime_device() == 0, "a tag's move changed the current device"
# One call of ranges may not mix devices: each device's ranges go on a stream of that device.
lib_ranges = (uvm._lib.Range * 2)(uvm._lib.Range(tensors[0].data_ptr(), 4096), uvm._lib.Range(tensors[1].data_ptr(), 4096))
assert lib.uvm_offload_ranges(lib_ranges, 2, 0, None) == uvm._lib.UVM_ERROR_INVALID_ARGUMENT
message = lib.uvm_last_error().decode()
# The devices are named in address order, which the driver picks.
assert re.search(r"belong to devices [01] and [01]", message), message
print(f"ok: {count} pools, one per device; current device kept; offload/onload per device and by tag")
