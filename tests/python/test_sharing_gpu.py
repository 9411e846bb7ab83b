"""GPU (one device): tensors in uvm's releasable memory sent to another process through
torch.multiprocessing (uvm.sharing). A uvm.memory_saver region's tensor, in both hook modes, and a
releasable pool's tensor go through a Queue and through the pickled form SGLang's serializer sends
(the device rewritten to the GPU's UUID); the receiver reads the sender's bytes and its writes reach
the sender; while it maps them the sender's pause fails naming the receiver's process, and once it
drops them the pause, the resume and the bytes are whole. A managed tensor fails naming why. An
importer that crashes or exits without closing is counted out, and the offload goes through after;
an exporter that exits leaves its importer the bytes it maps. Only memory made exportable (a
shareable tag's region, uvm.sharing.exportable()) can be sent, and so mapped by NCCL; other memory is
refused naming how, swapped for nothing, and exportable from its next map. Each process holds at most
64 MiB of releasable memory."""
import os
import subprocess
import sys

import pytest
from conftest import UVM_PATH

torch = pytest.importorskip("torch", reason="torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

SCRIPT = r"""
import gc, io, pickle, sys, torch
import torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler
MiB = 1 << 20

def receiver(inbox, outbox):
    try:
        receive(inbox, outbox)
    except BaseException:  # the sender reports it, instead of waiting for an answer that never comes
        import traceback
        outbox.put(("error", traceback.format_exc()))

def answer(outbox):
    got = outbox.get(timeout=60)
    if isinstance(got, tuple) and got[0] == "error":
        raise AssertionError("the receiver failed:\n" + got[1])
    return got

def use(inbox, outbox):  # the tensors live in this frame only: its return drops them
    sent = inbox.get()
    rebuild, args = pickle.loads(inbox.get())  # SGLang's serialized form, as its ForkingPickler loads it
    tensors = [sent, rebuild(*args)]
    for tensor in tensors:
        outbox.put(("read", tensor.device.index, int(tensor.to(torch.int64).sum())))
    tensors[0][:MiB].fill_(7)  # the receiver writes
    torch.cuda.synchronize()
    outbox.put("written")
    assert inbox.get() == "drop"

def receive(inbox, outbox):
    use(inbox, outbox)
    gc.collect()
    outbox.put("dropped")
    assert inbox.get() == "exit"

def pattern(n, seed):
    index = torch.arange(n, device="cuda", dtype=torch.int64)
    return ((index * 131 + seed * 17 + 1) % 251).to(torch.uint8)

def sglang_form(tensor):  # what SGLang's MultiprocessingSerializer sends: the device as the GPU's UUID
    from torch.multiprocessing import reductions
    rebuild, args = reductions.reduce_tensor(tensor)
    args = (*args[:6], str(torch.cuda.get_device_properties(args[6]).uuid), *args[7:])
    return pickle.dumps((rebuild, args))

if __name__ == "__main__":
    import faulthandler
    faulthandler.dump_traceback_later(150, exit=True)  # a hang shows where, before the test's timeout
    import uvm
    from uvm.memory_saver import torch_memory_saver as saver
    assert saver.hook_mode == sys.argv[1], (saver.hook_mode, sys.argv[1])
    if sys.argv[2] == "region":
        saver.shareable_tags = {"weights"}
        with saver.region("weights", enable_cpu_backup=True):  # else a pause keeps no bytes
            weights = pattern(32 * MiB + 4096, 3)
    else:
        pool = uvm.create_releasable_mempool()
        with torch.cuda.use_mem_pool(pool), uvm.sharing.exportable():
            weights = pattern(32 * MiB + 4096, 3)
    expected = weights.clone()
    context = mp.get_context("spawn")
    inbox, outbox = context.Queue(), context.Queue()
    process = context.Process(target=receiver, args=(inbox, outbox), daemon=True)  # a failure here ends it
    process.start()
    inbox.put(weights)
    inbox.put(sglang_form(weights))
    total = int(expected.to(torch.int64).sum())
    assert answer(outbox) == ("read", 0, total)
    assert answer(outbox) == ("read", 0, total)
    assert answer(outbox) == "written"
    expected[:MiB].fill_(7)
    assert torch.equal(weights, expected), "the receiver's write did not reach the sender"
    if sys.argv[2] == "region":
        try:
            saver.pause("weights")
        except RuntimeError as error:
            assert f"mapped by process {process.pid}" in str(error), error
        else:
            raise AssertionError("a pause under a receiver's mapping went through")
    else:
        try:
            uvm.offload(weights)
        except RuntimeError as error:
            assert f"mapped by process {process.pid}" in str(error), error
        else:
            raise AssertionError("an offload under a receiver's mapping went through")
    assert torch.equal(weights, expected), "a refused pause moved bytes"
    inbox.put("drop")
    assert answer(outbox) == "dropped"
    before = torch.cuda.mem_get_info()[0]
    if sys.argv[2] == "region":
        saver.pause("weights")
        assert torch.cuda.mem_get_info()[0] - before >= 32 * MiB, "the pause freed nothing"
        saver.resume("weights")
    else:
        uvm.offload(weights)
        uvm.onload(weights)
    assert torch.equal(weights, expected), "bytes lost across the pause"
    inbox.put("exit")
    process.join(120)
    assert process.exitcode == 0, process.exitcode

    managed_pool = uvm.create_unified_mempool()
    with torch.cuda.use_mem_pool(managed_pool):
        managed = torch.ones(MiB, device="cuda")
    try:
        ForkingPickler.dumps(managed)
    except uvm.UnifiedMemoryUnsupportedError as error:
        assert "managed memory (cudaMallocManaged), which CUDA cannot share" in str(error), error
    else:
        raise AssertionError("a managed tensor was sent")
    print("shared")
"""

LIFECYCLE = r"""
import ctypes, os, signal, sys, time, torch
import torch.multiprocessing as mp
MiB = 1 << 20

def pattern(n):
    index = torch.arange(n, device="cuda", dtype=torch.int64)
    return ((index * 131 + 7) % 251).to(torch.uint8)

def importer(inbox, outbox, ending):  # maps the tensor and ends without dropping it
    tensor = inbox.get()
    outbox.put(int(tensor.to(torch.int64).sum()))
    inbox.get()
    if ending == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)  # no finalizer runs: the mapping is never closed

def exporter(inbox, outbox):  # sends a tensor and exits while the importer still maps it
    import uvm
    pool = uvm.create_releasable_mempool()
    with torch.cuda.use_mem_pool(pool), uvm.sharing.exportable():
        weights = pattern(16 * MiB)
    outbox.put(weights)
    assert inbox.get() == "mapped"

def importers_of(tensor):
    from uvm import _lib
    count = ctypes.c_size_t()
    _lib.check(_lib.library().uvm_share_importers(tensor.data_ptr(), None, 0, ctypes.byref(count)), "importers")
    return count.value

if __name__ == "__main__":
    import faulthandler
    faulthandler.dump_traceback_later(150, exit=True)
    import uvm
    context = mp.get_context("spawn")
    inbox, outbox = context.Queue(), context.Queue()
    ending = sys.argv[1]
    if ending in ("crash", "exit"):
        pool = uvm.create_releasable_mempool()
        with torch.cuda.use_mem_pool(pool), uvm.sharing.exportable():
            weights = pattern(16 * MiB)
        expected = weights.clone()
        process = context.Process(target=importer, args=(inbox, outbox, ending), daemon=True)
        process.start()
        inbox.put(weights)
        assert outbox.get(timeout=60) == int(expected.to(torch.int64).sum())
        assert importers_of(weights) == 1
        inbox.put("end")
        process.join(60)
        assert process.exitcode == (-signal.SIGKILL if ending == "crash" else 0), process.exitcode
        deadline = time.monotonic() + 60  # counted out when its socket closes: waited for, bounded
        while importers_of(weights):
            assert time.monotonic() < deadline, "a dead importer is still counted"
            time.sleep(0.01)
        uvm.offload(weights)
        uvm.onload(weights)
        assert torch.equal(weights, expected), "bytes lost across the offload"
    else:  # the exporter exits first
        process = context.Process(target=exporter, args=(inbox, outbox), daemon=True)
        process.start()
        mapped = outbox.get(timeout=60)
        expected = pattern(16 * MiB)
        assert torch.equal(mapped, expected)
        inbox.put("mapped")
        process.join(60)
        assert process.exitcode == 0, process.exitcode
        assert torch.equal(mapped, expected), "the bytes went with their exporter"
        mapped.fill_(9)  # still the importer's to write
        assert int(mapped.sum()) == 9 * 16 * MiB
        del mapped  # the close finds no exporter to tell, and returns
        import gc
        gc.collect()
        torch.cuda.synchronize()
    print("lifecycle ok")
"""

EXPORTABLE = r"""
import ctypes, os, sys, torch
from multiprocessing.reduction import ForkingPickler
MiB = 1 << 20
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuMemRetainAllocationHandle.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_void_p]
cuda.cuMemExportToShareableHandle.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_ulonglong]
cuda.cuMemRelease.argtypes = [ctypes.c_ulonglong]

def nccl_could_map(tensor):  # what NCCL does to register a peer's buffer: retain its memory, export it
    handle = ctypes.c_ulonglong()
    assert cuda.cuMemRetainAllocationHandle(ctypes.byref(handle), tensor.data_ptr()) == 0
    fd = ctypes.c_int(-1)
    exported = cuda.cuMemExportToShareableHandle(ctypes.byref(fd), handle.value, 1, 0) == 0  # a POSIX fd
    assert cuda.cuMemRelease(handle.value) == 0
    if exported:
        os.close(fd.value)
    return exported

if __name__ == "__main__":
    import uvm
    from uvm.memory_saver import torch_memory_saver as saver
    assert saver.hook_mode == sys.argv[1], (saver.hook_mode, sys.argv[1])
    saver.shareable_tags = {"kv"}
    with saver.region("weights", enable_cpu_backup=True):
        weights = torch.arange(16 * MiB, device="cuda", dtype=torch.int32)
    with saver.region("kv", enable_cpu_backup=True):
        kv = torch.arange(16 * MiB, device="cuda", dtype=torch.int32)
    expected = weights.clone()
    assert not nccl_could_map(weights), "memory of a tag not shareable can be exported: NCCL would map it"
    try:  # no swap under work other threads may launch (issue 73: it lost the context on an H200)
        ForkingPickler.dumps(weights)
    except uvm.UnifiedMemoryUnsupportedError as error:
        assert "was not made exportable" in str(error) and "UVM_SHAREABLE" in str(error), error
    else:
        raise AssertionError("memory not made exportable was sent")
    assert not nccl_could_map(weights), "the refused send swapped the memory"
    assert torch.equal(weights, expected), "the refused send changed bytes"
    saver.pause("weights")
    saver.resume("weights")
    assert nccl_could_map(weights), "memory refused once is not exportable from its next map"
    assert torch.equal(weights, expected), "bytes lost across the pause"
    ForkingPickler.dumps(weights)
    assert nccl_could_map(kv), "a shareable tag's memory cannot be exported"
    ForkingPickler.dumps(kv)
    saver.pause("kv")
    saver.resume("kv")
    assert nccl_could_map(kv), "a shareable tag's memory mapped at the resume cannot be exported"
    print("exportable only where asked")
"""


def run(tmp_path, hook_mode: str, kind: str, script_text: str = SCRIPT, expect: str = "shared"):
    sys.path.insert(0, str(UVM_PATH))
    from uvm import _preload
    import contextlib
    script = tmp_path / "share.py"
    script.write_text(script_text)
    env = {**os.environ, "PYTHONPATH": str(UVM_PATH)}
    preload = hook_mode == "preload"
    with _preload.child_environment() if preload else contextlib.nullcontext():
        if preload:
            env.update({name: os.environ[name] for name in ("LD_PRELOAD", "UVM_PRELOAD_LIBUVM", "UVM_PRELOAD_CUDART")
                        if name in os.environ})
        try:
            result = subprocess.run([sys.executable, str(script), *([kind] if script_text is LIFECYCLE
                                                                    else [hook_mode, kind])],
                                    env=env, capture_output=True, text=True, timeout=200)
        except subprocess.TimeoutExpired as hung:
            raise AssertionError(f"the sender hung:\n{hung.stdout}\n{hung.stderr}") from None
    assert result.returncode == 0 and expect in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("hook_mode", ["torch", "preload"])
def test_a_region_tensor_goes_to_another_process_and_pauses_only_once_it_is_dropped(tmp_path, hook_mode):
    run(tmp_path, hook_mode, "region")


@pytest.mark.parametrize("hook_mode", ["torch", "preload"])
def test_region_memory_is_exportable_only_where_asked_and_never_swapped(tmp_path, hook_mode):
    # NCCL maps a peer's buffer (user-buffer and graph registration) when its memory can be
    # exported; a pause gives that memory back and a resume maps new memory, so a mapping NCCL
    # kept would read and write the old memory: collectives after a resume gave wrong results. And
    # a swap to exportable memory at the send lost the context under another thread's kernel.
    run(tmp_path, hook_mode, "region", EXPORTABLE, "exportable only where asked")


def test_a_releasable_pool_tensor_goes_to_another_process(tmp_path):
    run(tmp_path, "torch", "pool")


@pytest.mark.parametrize("ending", ["crash", "exit"])
def test_an_importer_that_crashes_or_exits_without_closing_is_counted_out(tmp_path, ending):
    run(tmp_path, "torch", ending, LIFECYCLE, "lifecycle ok")


def test_an_exporter_that_exits_leaves_the_importer_its_bytes(tmp_path):
    run(tmp_path, "torch", "exporter-exits", LIFECYCLE, "lifecycle ok")
