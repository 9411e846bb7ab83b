"""ctypes view of libuvm.so: one declaration per C entry (uvm.h), and the one place a status
becomes a Python exception."""
from __future__ import annotations

import ctypes
import threading

from . import _build

UVM_LOCATION_CPU = -1
UVM_LOCATION_NONE = -2
UVM_LIMIT_UNLIMITED = ctypes.c_size_t(-1).value
UVM_ANY_DEVICE = -1
STRATEGIES = {"auto": 0, "migrate": 1, "staged": 2}  # uvm_strategy

(UVM_OK, UVM_ERROR_INVALID_ARGUMENT, UVM_ERROR_NOT_MANAGED, UVM_ERROR_UNSUPPORTED,
 UVM_ERROR_LIMIT_EXCEEDED, UVM_ERROR_CAPTURING, UVM_ERROR_CUDA, UVM_ERROR_OUT_OF_MEMORY,
 UVM_ERROR_NO_DEVICE, UVM_ERROR_INTERNAL) = range(10)


class Range(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class Stats(ctypes.Structure):
    _fields_ = [("live_bytes", ctypes.c_size_t), ("peak_bytes", ctypes.c_size_t),
                ("live_allocations", ctypes.c_size_t), ("total_allocations", ctypes.c_uint64),
                ("total_frees", ctypes.c_uint64), ("limit_bytes", ctypes.c_size_t),
                ("host_resident_bytes", ctypes.c_size_t), ("bytes_to_device", ctypes.c_uint64),
                ("bytes_to_host", ctypes.c_uint64), ("bytes_discarded", ctypes.c_uint64),
                ("prefetch_calls", ctypes.c_uint64)]


class DeviceCaps(ctypes.Structure):
    _fields_ = [("managed_memory", ctypes.c_int), ("concurrent_managed_access", ctypes.c_int),
                ("pageable_memory_access", ctypes.c_int), ("discard_supported", ctypes.c_int),
                ("total_memory", ctypes.c_size_t)]


class Residency(ctypes.Structure):
    _fields_ = [("allocations", ctypes.c_size_t), ("live_bytes", ctypes.c_size_t),
                ("device_bytes", ctypes.c_size_t), ("host_bytes", ctypes.c_size_t),
                ("staged_bytes", ctypes.c_size_t), ("discarded_bytes", ctypes.c_size_t),
                ("released_bytes", ctypes.c_size_t)]


_size, _int, _ptr, _stream = ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p
SIGNATURES = {
    "uvm_status_string": (ctypes.c_char_p, [_int]),
    "uvm_last_error": (ctypes.c_char_p, []),
    "uvm_last_status": (_int, []),
    "uvm_clear_last_error": (None, []),
    "uvm_version": (ctypes.c_char_p, []),
    "uvm_malloc": (_ptr, [_size, _int, _stream]),
    "uvm_malloc_releasable": (_ptr, [_size, _int, _stream]),
    "uvm_free": (None, [_ptr, _size, _int, _stream]),
    "uvm_set_default_advice": (_int, [_int]),
    "uvm_get_default_advice": (_int, []),
    "uvm_set_thread_tag": (_int, [ctypes.c_char_p]),
    "uvm_get_thread_tag": (ctypes.c_char_p, []),
    "uvm_is_managed": (_int, [_ptr]),
    "uvm_allocation_info": (_int, [_ptr, ctypes.POINTER(_ptr), ctypes.POINTER(_size), ctypes.POINTER(_int)]),
    "uvm_allocation_ranges": (_int, [_int, ctypes.c_char_p, ctypes.POINTER(Range), _size, ctypes.POINTER(_size)]),
    "uvm_set_limit": (_int, [_int, _size]),
    "uvm_get_limit": (_int, [_int, ctypes.POINTER(_size)]),
    "uvm_get_stats": (_int, [_int, ctypes.POINTER(Stats)]),
    "uvm_reset_peak": (_int, [_int]),
    "uvm_device_count": (_int, []),
    "uvm_device_capabilities": (_int, [_int, ctypes.POINTER(DeviceCaps)]),
    "uvm_prefetch": (_int, [_ptr, _size, _int, _stream]),
    "uvm_prefetch_ranges": (_int, [ctypes.POINTER(Range), _size, _int, _stream]),
    "uvm_advise_preferred_location": (_int, [_ptr, _size, _int]),
    "uvm_advise_accessed_by": (_int, [_ptr, _size, _int]),
    "uvm_discard": (_int, [_ptr, _size, _stream]),
    "uvm_discard_ranges": (_int, [ctypes.POINTER(Range), _size, _stream]),
    "uvm_offload_ranges": (_int, [ctypes.POINTER(Range), _size, _int, _stream]),
    "uvm_onload_ranges": (_int, [ctypes.POINTER(Range), _size, _stream]),
    "uvm_get_staging": (_int, [ctypes.POINTER(_size), ctypes.POINTER(_size)]),
    "uvm_reserve_staging": (_int, [_size]),
    "uvm_release_staging": (_int, []),
    "uvm_get_residency": (_int, [_int, ctypes.c_char_p, ctypes.POINTER(Residency)]),
    "uvm_mem_get_info": (_int, [_int, ctypes.POINTER(_size), ctypes.POINTER(_size), ctypes.POINTER(_size)]),
    "uvm_get_staged_copy": (_int, [_ptr, _size, ctypes.POINTER(_ptr)]),
    "uvm_tag_count": (_size, []),
    "uvm_tag_name": (ctypes.c_char_p, [_size]),
    "uvm_query_location": (_int, [_ptr, _size, ctypes.POINTER(_int), ctypes.POINTER(_int)]),
}

_ctypes_lib: ctypes.CDLL | None = None
_ctypes_lock = threading.Lock()


def load(path: str) -> ctypes.CDLL:
    """Loads libuvm.so at `path` once per process (kept loaded for its life) and declares every
    entry. libcudart is found by soname, so a cudart the process already loaded (torch's) is reused."""
    global _ctypes_lib
    with _ctypes_lock:
        if _ctypes_lib is None:
            lib = ctypes.CDLL(path)
            for name, (restype, argtypes) in SIGNATURES.items():
                function = getattr(lib, name)
                function.restype, function.argtypes = restype, argtypes
            _ctypes_lib = lib
        return _ctypes_lib


def _get_ctypes_lib() -> ctypes.CDLL:
    """The seed's name: builds (or finds cached) libuvm.so and returns it as a ctypes.CDLL with
    argtypes and restype declared for every C entry. Needs no torch."""
    if _ctypes_lib is not None:
        return _ctypes_lib
    return load(_build.build_library())


def check(status: int, what: str) -> None:
    """Raises the exception that fits `status`, with uvm's own message; does nothing for UVM_OK."""
    if status == UVM_OK:
        return
    message = (_ctypes_lib.uvm_last_error() or b"").decode(errors="replace") or what
    if status in (UVM_ERROR_UNSUPPORTED, UVM_ERROR_NO_DEVICE):
        raise _build.UnifiedMemoryUnsupportedError(message)
    if status == UVM_ERROR_INVALID_ARGUMENT:
        raise ValueError(message)
    if status == UVM_ERROR_OUT_OF_MEMORY:
        raise MemoryError(message)
    raise RuntimeError(message)
