"""Sending tensors in uvm's releasable memory to another process on the node through
torch.multiprocessing (a Queue, `reductions.reduce_tensor`, SGLang's MultiprocessingSerializer): the
receiver maps the same memory (uvm.h, "Sharing with other processes") and reads and writes the same
bytes. torch's own CUDA IPC (cudaIpcGetMemHandle) cannot export memory mapped through CUDA's
virtual memory management, so uvm's reducer takes over for tensors in releasable memory and hands
every other tensor to torch's. Managed memory cannot be sent: CUDA has no IPC for it.

As with torch's CUDA tensors, the sending process keeps the tensor alive while the receiver uses it.
While the receiver maps it, the sender cannot pause, offload or discard it (UVM_ERROR_SHARED, naming
the receiver's process): the receiver drops its tensor first. `install()` runs when uvm makes a pool
or a region; call it yourself for releasable memory made otherwise. Only memory made exportable can be
sent: inside `exportable()`, or a uvm.memory_saver region whose tag is shareable (env UVM_SHAREABLE,
`shareable_tags`).

A received tensor is on the sender's GPU (found by index, or by the UUID SGLang sends). Inside
`receive_on(device)` it is mapped for a peer GPU instead: the receiver's kernels on that GPU read and
write the sender's memory over NVLink or PCIe, with no copy.
"""
from __future__ import annotations

import contextlib
import ctypes
import sys
import threading

from . import _lib

_installed = False
_torch_reduce = None  # torch's reducer, or the patch of it installed before uvm's
_install_lock = threading.Lock()
_receiving = threading.local()  # .device: the GPU receive_on() maps on, in this thread


def install() -> None:
    """Registers uvm's reducer for torch.Tensor and torch.nn.Parameter with torch.multiprocessing's
    pickler, and as `torch.multiprocessing.reductions.reduce_tensor` (whose earlier value, torch's or
    a patch of it, handles every tensor that is not uvm's). Idempotent."""
    global _installed, _torch_reduce
    with _install_lock:
        if _installed:
            return
        import torch
        from multiprocessing.reduction import ForkingPickler
        from torch.multiprocessing import reductions
        _torch_reduce = reductions.reduce_tensor
        reductions.reduce_tensor = reduce_tensor
        for cls in (torch.Tensor, torch.nn.Parameter):
            ForkingPickler.register(cls, reduce_tensor)
        _installed = True



@contextlib.contextmanager
def exportable(on: bool = True):
    """Releasable memory this thread allocates inside (uvm's pools, uvm.memory_saver's regions) is
    made so that other processes can map it, at every map: its tensors can be sent. Memory made
    otherwise is refused when sent (naming this), and exportable from its next resume or onload on:
    uvm never swaps memory under work other threads may launch (uvm_set_thread_exportable in uvm.h).
    NCCL can map exportable memory into its peers: lift that before a pause (uvm.nccl)."""
    with _lib.thread_setting("exportable", 1 if on else 0):
        yield


def _uvm_storage(tensor):
    """The storage of a dense CUDA tensor that uvm allocated; None for anything else. Asks nothing of
    a tensor that is not strided and on a GPU (a sparse, nested, meta or fake tensor has no storage of
    its own to ask for: torch's reducer handles its layout), and never raises: whatever uvm cannot
    tell is not uvm's."""
    try:
        import torch
        if getattr(tensor, "layout", torch.strided) is not torch.strided or not tensor.is_cuda:
            return None
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
    except Exception:  # noqa: BLE001 - not uvm's to judge: the earlier reducer decides
        return None
    if pointer == 0:
        return None
    lib = _lib.library()
    base, size, device = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_int()
    if lib.uvm_allocation_info(pointer, ctypes.byref(base), ctypes.byref(size), ctypes.byref(device)) != _lib.UVM_OK:
        lib.uvm_clear_last_error()
        return None
    return storage


def reduce_tensor(tensor):
    """torch.multiprocessing's reduction of `tensor`: uvm's for a CUDA tensor in uvm memory (managed
    memory fails with UVM_ERROR_UNSUPPORTED naming it), torch's (or what was installed before uvm's)
    for any other, untouched. The arguments keep torch's rebuild_cuda_tensor layout, which SGLang and
    others rewrite in place (the device, at index 6, becomes the GPU's UUID on the way)."""
    storage = _uvm_storage(tensor)
    if storage is None:
        return _torch_reduce(tensor)
    if _pending_closes:
        close_pending()
    import torch
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError("Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd "
                           "does not support crossing process boundaries.  If you just want to transfer the data, "
                           "call detach() on the tensor before serializing (e.g., putting it on the queue).")
    # Everything that can fail runs before the export, so that no failure leaves an export behind.
    torch.cuda.current_stream(tensor.device).synchronize()  # the receiver reads what was written
    layout = (type(tensor), tensor.size(), tensor.stride(), tensor.storage_offset(), type(storage), tensor.dtype,
              tensor.device.index)
    tail = (storage.nbytes(), 0, tensor.requires_grad, None, None, None, False)
    handle = _lib.ShareHandle()
    _lib.check(_lib.library().uvm_share_export(storage.data_ptr(), ctypes.byref(handle)), "sending a uvm tensor")
    return (rebuild_tensor, layout + (bytes(handle.bytes),) + tail)


class _Mapped:
    """The receiver's mapping of a sent allocation, closed (and the sender told) when the last tensor
    viewing it goes."""

    def __init__(self, pointer: int, nbytes: int, device: int):
        self.pointer = pointer
        # No "stream": the sender waited for its writes before sending (reduce_tensor).
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (pointer, False),
                                         "version": 3, "strides": None}
        self.device = device

    def __del__(self):
        _close_or_keep(self.pointer)


_pending_closes: list[int] = []  # mappings whose close had to wait, retried by close_pending()
_pending_lock = threading.Lock()
_told_close_failed = False


def _capturing() -> bool:
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - at exit torch may be half torn down: nothing captures then
        return False


def _close_or_keep(pointer: int) -> bool:
    """Closes a received mapping, or keeps its pointer for close_pending(): while this thread captures
    a CUDA graph (the close waits for the device, which would spoil the capture), or when the close
    fails (said once on stderr: a finalizer has no caller to raise to). A mapping never goes
    ownerless: until it is closed the sender cannot pause it."""
    global _told_close_failed
    if not _capturing():
        lib = _lib.library()
        if lib.uvm_share_close(pointer) == _lib.UVM_OK:
            return True
        message = lib.uvm_last_error().decode(errors="replace")
        lib.uvm_clear_last_error()
        if not _told_close_failed:
            _told_close_failed = True
            print(f"uvm: a received tensor's memory could not be closed ({message}); uvm tries again at the next "
                  f"tensor sent or received, or at uvm.sharing.close_pending()", file=sys.stderr)
    with _pending_lock:
        _pending_closes.append(pointer)
    return False


def close_pending() -> int:
    """Closes the received mappings whose close had to wait (their tensors died during a CUDA graph
    capture, or the close failed); returns how many still wait. Runs at every tensor sent or received
    through uvm, so a caller needs it only to let the sender pause sooner."""
    if _capturing():
        with _pending_lock:
            return len(_pending_closes)
    with _pending_lock:
        waiting = _pending_closes[:]
        _pending_closes.clear()
    for pointer in waiting:
        _close_or_keep(pointer)
    with _pending_lock:
        return len(_pending_closes)


def _device_index(device) -> int:
    """The device argument as a receiver's ordinal: an index, or a GPU's UUID (SGLang sends these)."""
    if isinstance(device, int):
        return device
    import torch
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == str(device):
            return index
    raise RuntimeError(f"no GPU of this process has UUID {device}")


@contextlib.contextmanager
def receive_on(device: int):
    """Tensors received in this block, in this thread, are mapped for GPU `device` (this process's
    index) instead of the sender's GPU: a peer of it, whose kernels then reach the sender's memory
    directly. A GPU that cannot reach it fails the receive with an error naming the call
    (cuMemSetAccess), the device and CUDA's error."""
    if not isinstance(device, int) or isinstance(device, bool) or device < 0:
        raise ValueError(f"receive_on: device must be a GPU index (an int >= 0), not {device!r}")
    outer = getattr(_receiving, "device", None)
    _receiving.device = device
    try:
        yield
    finally:
        _receiving.device = outer


def _receiving_device(sent_device) -> int:
    """The GPU a received tensor is mapped for: receive_on's, else the sender's."""
    chosen = getattr(_receiving, "device", None)
    return _device_index(sent_device) if chosen is None else chosen


def rebuild_tensor(tensor_cls, size, stride, offset, storage_cls, dtype, device, handle, storage_bytes,
                   storage_offset, requires_grad, _ref_counter, _ref_offset, _event, _event_sync):
    """The receiver's side of reduce_tensor: maps the sent memory for the sender's GPU (or
    receive_on's) and views it as the sent tensor."""
    import torch
    if _pending_closes:
        close_pending()
    index = _receiving_device(device)
    raw = _lib.ShareHandle()
    ctypes.memmove(raw.bytes, handle, len(handle))
    pointer = ctypes.c_void_p()
    with torch.cuda.device(index):
        _lib.check(_lib.library().uvm_share_import(ctypes.byref(raw), index, ctypes.byref(pointer)),
                   "receiving a uvm tensor")
        mapped = _Mapped(pointer.value, storage_bytes, index)
        flat = torch.as_tensor(mapped, device=f"cuda:{index}")  # holds `mapped` while any view lives
    tensor = flat.view(dtype).as_strided(size, stride, offset)
    if tensor_cls is torch.nn.Parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    tensor.requires_grad_(requires_grad)
    return tensor
