"""Sending tensors in uvm's releasable memory to another process on the node through
torch.multiprocessing (a Queue, `reductions.reduce_tensor`, SGLang's MultiprocessingSerializer): the
receiver maps the same memory (uvm.h, "Sharing with other processes") and reads and writes the same
bytes. torch's own CUDA IPC (cudaIpcGetMemHandle) cannot export memory mapped through CUDA's
virtual memory management, so uvm's reducer takes over for tensors in releasable memory and hands
every other tensor to torch's. Managed memory cannot be sent: CUDA has no IPC for it.

As with torch's CUDA tensors, the sending process keeps the tensor alive while the receiver uses it.
While the receiver maps it, the sender cannot pause, offload or discard it (UVM_ERROR_SHARED, naming
the receiver's process): the receiver drops its tensor first. `install()` runs when uvm makes a pool
or a region; call it yourself for releasable memory made otherwise.

A received tensor is on the sender's GPU (found by index, or by the UUID SGLang sends). Inside
`receive_on(device)` it is mapped for a peer GPU instead: the receiver's kernels on that GPU read and
write the sender's memory over NVLink or PCIe, with no copy.
"""
from __future__ import annotations

import contextlib
import ctypes
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



def _releasable_base(tensor) -> int | None:
    """The base of the uvm allocation holding the tensor's storage, if uvm made it; None otherwise."""
    lib = _lib.library()
    base, size, device = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_int()
    pointer = tensor.untyped_storage().data_ptr()
    if lib.uvm_allocation_info(pointer, ctypes.byref(base), ctypes.byref(size), ctypes.byref(device)) != _lib.UVM_OK:
        lib.uvm_clear_last_error()
        return None
    return base.value


def reduce_tensor(tensor):
    """torch.multiprocessing's reduction of `tensor`: uvm's for a CUDA tensor in uvm memory (managed
    memory fails with UVM_ERROR_UNSUPPORTED naming it), torch's (or what was installed before uvm's)
    for any other. The arguments keep torch's rebuild_cuda_tensor layout, which SGLang and others
    rewrite in place (the device, at index 6, becomes the GPU's UUID on the way)."""
    if not tensor.is_cuda or tensor.untyped_storage().data_ptr() == 0 or _releasable_base(tensor) is None:
        return _torch_reduce(tensor)
    import torch
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError("Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd "
                           "does not support crossing process boundaries.  If you just want to transfer the data, "
                           "call detach() on the tensor before serializing (e.g., putting it on the queue).")
    storage = tensor.untyped_storage()
    handle = _lib.ShareHandle()
    _lib.check(_lib.library().uvm_share_export(storage.data_ptr(), ctypes.byref(handle)), "sending a uvm tensor")
    torch.cuda.current_stream(tensor.device).synchronize()  # the receiver reads what was written
    return (rebuild_tensor,
            (type(tensor), tensor.size(), tensor.stride(), tensor.storage_offset(), type(storage), tensor.dtype,
             tensor.device.index, bytes(handle.bytes), storage.nbytes(), 0, tensor.requires_grad,
             None, None, None, False))


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
        lib = _lib.library()
        if lib.uvm_share_close(self.pointer) != _lib.UVM_OK:
            lib.uvm_clear_last_error()  # a finalizer has no caller to tell; the exit unmaps it anyway


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
