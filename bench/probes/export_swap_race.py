"""An export beside a thread that keeps writing: does it lose writes or the context? Issue 73, item 2.
The first export used to swap the allocation's memory for exportable memory (wait for the device,
copy, unmap, map new memory at the same address), which nothing ordered against kernels other
threads launch: on an H200 (2026-11-29) the second round faulted (cudaErrorIllegalAddress, the
context lost). Now only memory made exportable (uvm_set_thread_exportable) is exported, with no swap;
other memory is refused. A writer thread adds 1 to a 64 MiB int32 tensor in exportable releasable
memory, on a stream of its own, ADDS times; the main thread exports the allocation after a random
delay into those adds; then every element must equal ADDS. Each round ends with an offload and
onload (new memory, exportable again), so every round's export is of memory not exported before.
A last check exports memory not made exportable: refused, its bytes and the writer untouched.

    python bench/probes/export_swap_race.py [--rounds 40] [--adds 3000]

Managed memory: none (128 MiB of CUDA VMM memory)."""
from __future__ import annotations

import argparse
import ctypes
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python_shim"))
import torch  # noqa: E402

import uvm  # noqa: E402
from uvm import _lib  # noqa: E402


class _DeviceBytes:
    def __init__(self, pointer: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes // 4,), "typestr": "<i4", "data": (pointer, False),
                                         "version": 3, "strides": None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--adds", type=int, default=3000)
    args = parser.parse_args()
    lib = uvm.library()
    nbytes = 64 << 20
    torch.cuda.init()
    _lib.check(lib.uvm_set_thread_exportable(1))
    pointer = lib.uvm_malloc_releasable(nbytes, 0, None)
    _lib.check(lib.uvm_set_thread_exportable(0))
    assert pointer, lib.uvm_last_error()
    plain = lib.uvm_malloc_releasable(nbytes, 0, None)  # not made exportable
    assert plain, lib.uvm_last_error()
    x = torch.as_tensor(_DeviceBytes(pointer, nbytes), device="cuda:0")
    ranges = (_lib.Range * 1)()
    ranges[0].ptr, ranges[0].size = pointer, nbytes
    lost = faulted = 0
    for round_ in range(args.rounds):
        x.zero_()
        torch.cuda.synchronize()
        started = threading.Event()
        failure: list = []

        def write():
            stream = torch.cuda.Stream()
            try:
                with torch.cuda.stream(stream):
                    started.set()
                    for _ in range(args.adds):
                        x.add_(1)
                stream.synchronize()
            except Exception as error:  # noqa: BLE001 - reported below
                failure.append(repr(error))

        writer = threading.Thread(target=write)
        writer.start()
        started.wait()
        delay = random.uniform(0, 0.02)
        time.sleep(delay)
        handle = _lib.ShareHandle()
        status = lib.uvm_share_export(pointer, ctypes.byref(handle))
        message = lib.uvm_last_error().decode(errors="replace") if status else ""
        lib.uvm_clear_last_error()
        writer.join()
        try:
            torch.cuda.synchronize()
            wrong = int((x != args.adds).sum().item())
        except Exception as error:  # noqa: BLE001
            failure.append(repr(error))
            wrong = -1
        lost += wrong > 0
        faulted += bool(failure) or wrong < 0
        print(f"round {round_:3d}: delay {delay * 1e3:5.1f} ms, export {status} {message[:80]}, "
              f"elements not {args.adds}: {wrong}, errors: {failure[:1]}", flush=True)
        if failure:
            break
        _lib.check(lib.uvm_offload_ranges(ranges, 1, _lib.STRATEGIES["staged"], None))
        _lib.check(lib.uvm_onload_ranges(ranges, 1, None))
        torch.cuda.synchronize()
    handle = _lib.ShareHandle()
    refused = lib.uvm_share_export(plain, ctypes.byref(handle))
    message = lib.uvm_last_error().decode(errors="replace")
    lib.uvm_clear_last_error()
    print(f"memory not made exportable: export status {refused}: {message[:160]}")
    print(f"export beside a writer: {args.rounds} rounds of {args.adds} adds, {lost} lost writes, {faulted} faulted, "
          f"plain memory {'refused' if refused else 'EXPORTED'}")
    return 0 if not lost and not faulted and refused else 1


if __name__ == "__main__":
    sys.exit(main())
