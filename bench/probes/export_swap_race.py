"""Does the first export's swap (vmm_make_exportable: wait for the device, copy into exportable
memory, unmap the old, map the new at the same address) lose writes that another thread launches
meanwhile? Issue 73, item 2, asks for it to be shown either way. A writer thread adds 1 to a 64 MiB
int32 tensor in releasable memory, on a stream of its own, ADDS times; the main thread exports the
allocation (the swap) after a random delay into those adds; then every element must equal ADDS. Each
round ends with an offload and onload, which maps non-exportable memory again, so the next round's
export swaps again. Prints, per round, the delay, the export's status, the elements that differ, and
any CUDA error; the summary line says how many rounds lost writes or faulted.

    python bench/probes/export_swap_race.py [--rounds 40] [--adds 3000]

Managed memory: none (64 MiB of CUDA VMM memory)."""
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
    pointer = lib.uvm_malloc_releasable(nbytes, 0, None)
    assert pointer, lib.uvm_last_error()
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
    print(f"export swap race: {args.rounds} rounds of {args.adds} adds, {lost} lost writes, {faulted} faulted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
