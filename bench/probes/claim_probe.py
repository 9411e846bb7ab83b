"""Why did the benchmark's pinned memcpy onload run at half speed (27.5 GB/s on H200s whose pinned
H2D is 55 GB/s)? Its cycle has a plain allocation claim nearly all free memory, then frees it
(empty_cache) before the onload. This measures a pinned H2D copy of 4 GiB with and without that
claim step, as one call and as 64 MiB chunks over 4 streams, and after a pause. Plain device memory
only (no managed memory). Run: python3 bench/probes/claim_probe.py"""
import ctypes
import time

import torch

GiB = 1 << 30
nbytes = 4 * GiB
cudart = ctypes.CDLL("libcudart.so.13")
host = ctypes.c_void_p()
assert cudart.cudaHostAlloc(ctypes.byref(host), ctypes.c_size_t(nbytes), 0) == 0
device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
streams = [torch.cuda.Stream() for _ in range(4)]


def copy(dst, src, n, kind, stream):
    assert cudart.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(n), kind,
                                  ctypes.c_void_p(stream.cuda_stream)) == 0


def h2d(chunked: bool):
    if not chunked:
        copy(device.data_ptr(), host.value, nbytes, 1, streams[0])
        return
    chunk = 64 << 20
    for k, at in enumerate(range(0, nbytes, chunk)):
        copy(device.data_ptr() + at, host.value + at, chunk, 1, streams[k % 4])


def d2h():
    copy(host.value, device.data_ptr(), nbytes, 2, streams[0])


def gbps(action) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    action()
    torch.cuda.synchronize()
    return nbytes / (time.perf_counter() - start) / 1e9


def hold_claim():
    """A plain allocation of all but 256 MiB of the free memory, touched, and kept."""
    free, _ = torch.cuda.mem_get_info()
    block = torch.empty(free - (256 << 20), dtype=torch.uint8, device="cuda")
    block[-1] = 1
    torch.cuda.synchronize()
    return block


def claim():
    """The benchmark's claim step: the allocation, then freed and given back to the driver."""
    block = hold_claim()
    del block
    torch.cuda.empty_cache()


print(torch.cuda.get_device_name(0), torch.__version__)
for _ in range(2):
    print(f"no claim:            H2D one call {gbps(lambda: h2d(False)):5.1f}  chunked {gbps(lambda: h2d(True)):5.1f}"
          f"  D2H {gbps(d2h):5.1f} GB/s")
for _ in range(2):
    claim()
    one = gbps(lambda: h2d(False))
    again = gbps(lambda: h2d(False))
    claim()
    chunked = gbps(lambda: h2d(True))
    claim()
    out = gbps(d2h)
    claim()
    time.sleep(2)
    later = gbps(lambda: h2d(False))
    print(f"after claim+free:    H2D one call {one:5.1f} (next {again:5.1f}, after 2 s {later:5.1f})"
          f"  chunked {chunked:5.1f}  D2H {out:5.1f} GB/s")
block = hold_claim()
held = gbps(lambda: h2d(False))
del block
torch.cuda.empty_cache()
print(f"claim held (not freed): H2D one call {held:5.1f} GB/s")
cudart.cudaFreeHost(host)
