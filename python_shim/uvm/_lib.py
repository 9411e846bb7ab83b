"""ctypes view of libuvm.so: one declaration per C entry (uvm.h), the one place a device argument
becomes uvm's int, and the one place a status becomes a Python exception."""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import threading

from . import _build, _runtime
from ._errors import BuildError, BuildTimeout, UnifiedMemoryCompileTimeoutError, UnifiedMemoryUnsupportedError

# The device sentinels (uvm.h, "Devices and locations"): -1 is the CPU for a location, every device
# for a selection.
UVM_LOCATION_CPU = -1
UVM_LOCATION_NONE = -2
UVM_ANY_DEVICE = -1
UVM_LIMIT_UNLIMITED = ctypes.c_size_t(-1).value
STRATEGIES = {"auto": 0, "migrate": 1, "staged": 2, "mmap": 3, "disk": 4}  # uvm_strategy
UVM_SHARE_HANDLE_BYTES = 64
BACKUPS = {"none": 0, "host": 1, "mmap": 2, "disk": 3}  # uvm_backup

(UVM_OK, UVM_ERROR_INVALID_ARGUMENT, UVM_ERROR_NOT_MANAGED, UVM_ERROR_UNSUPPORTED,
 UVM_ERROR_LIMIT_EXCEEDED, UVM_ERROR_CAPTURING, UVM_ERROR_CUDA, UVM_ERROR_OUT_OF_MEMORY,
 UVM_ERROR_NO_DEVICE, UVM_ERROR_INTERNAL, UVM_ERROR_IO, UVM_ERROR_SHARED) = range(12)


class Range(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class Allocation(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t), ("device", ctypes.c_int),
                ("releasable", ctypes.c_int)]


class AllocationState(ctypes.Structure):  # uvm_allocation_state
    _fields_ = [("base", ctypes.c_void_p), ("size", ctypes.c_size_t), ("device", ctypes.c_int),
                ("paused", ctypes.c_int), ("released", ctypes.c_int), ("backup", ctypes.c_int),
                ("compressed", ctypes.c_int)]


class Stats(ctypes.Structure):
    _fields_ = [("live_bytes", ctypes.c_size_t), ("peak_bytes", ctypes.c_size_t),
                ("live_allocations", ctypes.c_size_t), ("total_allocations", ctypes.c_uint64),
                ("total_frees", ctypes.c_uint64), ("limit_bytes", ctypes.c_size_t),
                ("host_resident_bytes", ctypes.c_size_t), ("bytes_to_device", ctypes.c_uint64),
                ("bytes_to_host", ctypes.c_uint64), ("bytes_discarded", ctypes.c_uint64),
                ("prefetch_calls", ctypes.c_uint64), ("spare_bytes", ctypes.c_size_t)]


class DeviceCaps(ctypes.Structure):
    _fields_ = [("managed_memory", ctypes.c_int), ("concurrent_managed_access", ctypes.c_int),
                ("pageable_memory_access", ctypes.c_int), ("discard_supported", ctypes.c_int),
                ("total_memory", ctypes.c_size_t)]


class Residency(ctypes.Structure):
    _fields_ = [("allocations", ctypes.c_size_t), ("live_bytes", ctypes.c_size_t),
                ("device_bytes", ctypes.c_size_t), ("host_bytes", ctypes.c_size_t),
                ("staged_bytes", ctypes.c_size_t), ("discarded_bytes", ctypes.c_size_t),
                ("released_bytes", ctypes.c_size_t)]


class KeptCopies(ctypes.Structure):
    _fields_ = [("pinned_bytes", ctypes.c_size_t), ("pageable_bytes", ctypes.c_size_t),
                ("disk_bytes", ctypes.c_size_t), ("disk_files", ctypes.c_size_t),
                ("retained_bytes", ctypes.c_size_t)]


class StagingInfo(ctypes.Structure):
    _fields_ = [("capacity_bytes", ctypes.c_size_t), ("staged_bytes", ctypes.c_size_t),
                ("registered_bytes", ctypes.c_size_t), ("host_alloc_bytes", ctypes.c_size_t),
                ("pageable_bytes", ctypes.c_size_t), ("pinning_bytes", ctypes.c_size_t),
                ("blocks", ctypes.c_size_t), ("configured_kind", ctypes.c_int)]


class OptionInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p), ("default_value", ctypes.c_char_p),
                ("meaning", ctypes.c_char_p)]


# uvm_pinned_kind, as env UVM_PINNED names it.
PINNED_KINDS = {0: "register", 1: "hostalloc", 2: "pageable"}


class MovePhase(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("bytes", ctypes.c_size_t), ("operations", ctypes.c_uint32),
                ("start", ctypes.c_double), ("seconds", ctypes.c_double)]


UVM_MOVE_PHASES = 8


class MoveReport(ctypes.Structure):
    _fields_ = [("call", ctypes.c_char_p), ("device", ctypes.c_int), ("status", ctypes.c_int),
                ("bytes", ctypes.c_size_t), ("seconds", ctypes.c_double), ("host_seconds", ctypes.c_double),
                ("phase_count", ctypes.c_size_t), ("phases", MovePhase * UVM_MOVE_PHASES)]


class ShareHandle(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * UVM_SHARE_HANDLE_BYTES)]


_size, _int, _ptr, _stream = ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p
SIGNATURES = {
    "uvm_status_string": (ctypes.c_char_p, [_int]),
    "uvm_last_error": (ctypes.c_char_p, []),
    "uvm_last_status": (_int, []),
    "uvm_last_error_index": (ctypes.c_int64, []),
    "uvm_last_cuda_error": (ctypes.c_int, []),
    "uvm_clear_last_error": (None, []),
    "uvm_version": (ctypes.c_char_p, []),
    "uvm_option_count": (_int, []),
    "uvm_get_option": (_int, [_int, ctypes.POINTER(OptionInfo)]),
    "uvm_check_options": (_int, []),
    "uvm_malloc": (_ptr, [_size, _int, _stream]),
    "uvm_malloc_releasable": (_ptr, [_size, _int, _stream]),
    "uvm_free": (None, [_ptr, _size, _int, _stream]),
    "uvm_set_default_advice": (_int, [_int]),
    "uvm_get_default_advice": (_int, []),
    "uvm_set_thread_tag": (_int, [ctypes.c_char_p]),
    "uvm_get_thread_tag": (ctypes.c_char_p, []),
    "uvm_set_thread_backup": (_int, [_int]),
    "uvm_get_thread_backup": (_int, []),
    "uvm_set_thread_compression": (_int, [_int]),
    "uvm_get_thread_compression": (_int, []),
    "uvm_set_thread_exportable": (_int, [_int]),
    "uvm_get_thread_exportable": (_int, []),
    "uvm_report_blocks": (_int, [_int]),
    "uvm_block_allocated": (_int, [_ptr, _size]),
    "uvm_block_freed": (_int, [_ptr, _size]),
    "uvm_is_managed": (_int, [_ptr]),
    "uvm_allocation_info": (_int, [_ptr, ctypes.POINTER(_ptr), ctypes.POINTER(_size), ctypes.POINTER(_int)]),
    "uvm_allocation_ranges": (_int, [_int, ctypes.c_char_p, ctypes.POINTER(Range), _size, ctypes.POINTER(_size)]),
    "uvm_list_allocations": (_int, [_int, ctypes.c_char_p, ctypes.POINTER(Allocation), _size, ctypes.POINTER(_size)]),
    "uvm_set_limit": (_int, [_int, _size]),
    "uvm_get_limit": (_int, [_int, ctypes.POINTER(_size)]),
    "uvm_get_stats": (_int, [_int, ctypes.POINTER(Stats)]),
    "uvm_reset_peak": (_int, [_int]),
    "uvm_device_count": (_int, []),
    "uvm_device_capabilities": (_int, [_int, ctypes.POINTER(DeviceCaps)]),
    "uvm_device_synchronize": (_int, [_int]),
    "uvm_prefetch": (_int, [_ptr, _size, _int, _stream]),
    "uvm_prefetch_ranges": (_int, [ctypes.POINTER(Range), _size, _int, _stream]),
    "uvm_advise_preferred_location": (_int, [_ptr, _size, _int]),
    "uvm_advise_accessed_by": (_int, [_ptr, _size, _int]),
    "uvm_discard": (_int, [_ptr, _size, _stream]),
    "uvm_discard_ranges": (_int, [ctypes.POINTER(Range), _size, _stream]),
    "uvm_get_compressed_copies": (_int, [_int, ctypes.c_char_p, ctypes.POINTER(_size), ctypes.POINTER(_size)]),
    "uvm_offload_ranges": (_int, [ctypes.POINTER(Range), _size, _int, _stream]),
    "uvm_onload_ranges": (_int, [ctypes.POINTER(Range), _size, _stream]),
    "uvm_offload_selection": (_int, [_int, ctypes.POINTER(ctypes.c_char_p), _size, _int, _stream, ctypes.POINTER(_size)]),
    "uvm_onload_selection": (_int, [_int, ctypes.POINTER(ctypes.c_char_p), _size, _stream, ctypes.POINTER(_size)]),
    "uvm_discard_selection": (_int, [_int, ctypes.POINTER(ctypes.c_char_p), _size, _stream, ctypes.POINTER(_size)]),
    "uvm_begin_moves": (_int, [_size]),
    "uvm_end_moves": (_int, []),
    "uvm_fetch_ranges": (_int, [ctypes.POINTER(Range), _size, _stream, _ptr]),
    "uvm_drop_clean_ranges": (_int, [ctypes.POINTER(Range), _size, _stream]),
    "uvm_set_spare_limit": (_int, [_int, _size]),
    "uvm_get_spare_limit": (_int, [_int, ctypes.POINTER(_size)]),
    "uvm_get_staging": (_int, [ctypes.POINTER(_size), ctypes.POINTER(_size)]),
    "uvm_get_staging_info": (_int, [ctypes.POINTER(StagingInfo)]),
    "uvm_reserve_staging": (_int, [_size]),
    "uvm_prepare_pause": (_int, [_int, ctypes.c_char_p, _size, ctypes.POINTER(_size)]),
    "uvm_release_staging": (_int, []),
    "uvm_release_staging_async": (_int, []),
    "uvm_pause": (_int, [_int, ctypes.c_char_p]),
    "uvm_resume": (_int, [_int, ctypes.c_char_p]),
    "uvm_paused_count": (_int, [_int, ctypes.c_char_p, ctypes.POINTER(_size)]),
    "uvm_set_backup": (_int, [_int, ctypes.c_char_p, _int, _int, ctypes.POINTER(_size)]),
    "uvm_get_allocation_state": (_int, [_ptr, ctypes.POINTER(AllocationState)]),
    "uvm_set_allocation_tag": (_int, [_ptr, ctypes.c_char_p]),
    "uvm_set_retain_backups": (_int, [_int]),
    "uvm_get_retain_backups": (_int, []),
    "uvm_get_residency": (_int, [_int, ctypes.c_char_p, ctypes.POINTER(Residency)]),
    "uvm_get_kept_copies": (_int, [_int, ctypes.c_char_p, ctypes.POINTER(KeptCopies)]),
    "uvm_set_disk_backup_dir": (_int, [ctypes.c_char_p]),
    "uvm_get_disk_backup_dir": (_int, [ctypes.c_char_p, _size]),
    "uvm_mem_get_info": (_int, [_int, ctypes.POINTER(_size), ctypes.POINTER(_size), ctypes.POINTER(_size)]),
    "uvm_get_staged_copy": (_int, [_ptr, _size, ctypes.POINTER(_ptr)]),
    "uvm_tag_count": (_size, []),
    "uvm_tag_name": (ctypes.c_char_p, [_size]),
    "uvm_query_location": (_int, [_ptr, _size, ctypes.POINTER(_int), ctypes.POINTER(_int)]),
    "uvm_last_move": (_int, [_int, ctypes.POINTER(MoveReport)]),
    "uvm_trace_flush": (_int, []),
    "uvm_share_export": (_int, [_ptr, ctypes.POINTER(ShareHandle)]),
    "uvm_share_import": (_int, [ctypes.POINTER(ShareHandle), _int, ctypes.POINTER(_ptr)]),
    "uvm_share_close": (_int, [_ptr]),
    "uvm_share_importers": (_int, [_ptr, ctypes.POINTER(_int), _size, ctypes.POINTER(_size)]),
}

_ctypes_lib: ctypes.CDLL | None = None
_ctypes_lock = threading.Lock()
_so_path: str | None = None  # the library loaded (the seed's name)


def build_library() -> str:
    """The libuvm.so to load, and its CUDA runtime opened: the one the interposer opened in a
    preloading process, UVM_LIBRARY, the installed package's build for the CUDA major this process
    runs (unless UVM_PREBUILT=0), else one compiled here. No torch needed. Raises UnifiedMemoryCompileTimeoutError or
    UnifiedMemoryUnsupportedError with the reason."""
    try:
        preloaded = _preloaded_libuvm()
        if preloaded is not None:
            return preloaded
        _runtime.check_supported_major()  # before anything is loaded or compiled for another major
        use_shipped = not os.environ.get("UVM_LIBRARY") and os.environ.get("UVM_PREBUILT", "1") != "0"
        shipped = _shipped_for_this_runtime() if use_shipped else None
        return str(shipped) if shipped is not None else str(_build.build())
    except BuildTimeout as error:
        raise UnifiedMemoryCompileTimeoutError(str(error)) from None
    except BuildError as error:
        raise UnifiedMemoryUnsupportedError(f"building libuvm.so failed: {error}") from None


runtime_used: _runtime.Runtime | None = None  # the CUDA runtime a shipped library was loaded beside


def _shipped_for_this_runtime():
    """The installed package's libuvm.so for the CUDA runtime this process uses (_runtime.choose),
    with that runtime opened; None where the package ships none (a source tree) or none for that
    major while a toolkit is here to compile one."""
    global runtime_used
    majors = _build.shipped_majors()
    if not majors:
        return None
    runtime = _runtime.choose(majors)
    if runtime is None:
        raise UnifiedMemoryUnsupportedError(
            f"no CUDA runtime found for the libuvm.so builds this installation carries (CUDA "
            f"{', '.join(map(str, sorted(majors)))}): install torch with CUDA, or NVIDIA's runtime wheel "
            "(pip install nvidia-cuda-runtime-cu12, or nvidia-cuda-runtime for CUDA 13), or a CUDA toolkit")
    library = _build.shipped_library(runtime.major)
    if library is None:
        try:
            _build.cuda_home()
            return None  # a toolkit is here: compile for it
        except BuildError:
            raise UnifiedMemoryUnsupportedError(
                f"this process uses the CUDA {runtime.major} runtime ({runtime.path}, {runtime.found_by}) and this "
                f"installation carries libuvm.so for CUDA {', '.join(map(str, sorted(majors)))} only") from None
    _runtime.load(runtime)
    runtime_used = runtime
    return library


_preloaded: list = []  # [preloaded_process()'s answer], once asked: what a process preloads is fixed at its start


def preloaded_process() -> ctypes.CDLL | None:
    """The process's own symbols when it preloads uvm's cudaMalloc interposer (its cudaMalloc is the
    one callers reach), else None."""
    if not _preloaded:
        try:
            process = ctypes.CDLL(None)
            active = process.uvm_preload_active()
        except (AttributeError, OSError):
            process, active = None, 0
        _preloaded.append(process if active else None)
    return _preloaded[0]


def _preloaded_libuvm() -> str | None:
    """The libuvm.so the interposer opened, when this process preloads it: the Python side must load
    that same library (one registry of allocations, one set of locks)."""
    process = preloaded_process()
    if process is None:
        return None
    process.uvm_preload_libuvm_path.restype = ctypes.c_char_p
    process.uvm_preload_load_error.restype = ctypes.c_char_p
    reason = process.uvm_preload_load_error()
    if reason is not None and _runtime.mapped() is None:
        # Preloaded with nothing named (slime's train actors): libuvm opens beside the CUDA runtime the
        # process loads, and none is loaded yet. The one torch will load, as library() chooses it.
        runtime = _runtime.choose(set(_runtime.MAJORS))
        if runtime is not None:
            _runtime.load(runtime)
            reason = process.uvm_preload_load_error()
    if reason is not None:
        raise UnifiedMemoryUnsupportedError(f"uvm's cudaMalloc interposer is preloaded but {reason.decode()}: start the "
                                            "process inside uvm.memory_saver.configure_subprocess(), or set "
                                            "UVM_PRELOAD_LIBUVM to the libuvm.so uvm uses")
    return process.uvm_preload_libuvm_path().decode()


def load(path: str) -> ctypes.CDLL:
    """Loads libuvm.so at `path` once per process (kept loaded for its life) and declares every
    entry. libcudart is found by soname, so a cudart the process already loaded (torch's) is reused."""
    global _ctypes_lib, _so_path
    with _ctypes_lock:
        if _ctypes_lib is None:
            lib = ctypes.CDLL(path)
            _runtime.check_one_runtime(path)
            for name, (restype, argtypes) in SIGNATURES.items():
                function = getattr(lib, name)
                function.restype, function.argtypes = restype, argtypes
            _ctypes_lib, _so_path = lib, path
            atexit.register(lib.uvm_trace_flush)  # with UVM_TRACE: moves whose GPU work was still running
        return _ctypes_lib


def library() -> ctypes.CDLL:
    """libuvm.so as a ctypes.CDLL with argtypes and restype declared for every C entry: built (or
    found cached) and loaded on first use. Needs no torch. uvm.library() is this."""
    if _ctypes_lib is not None:
        return _ctypes_lib
    return load(build_library())


_get_ctypes_lib = library  # the seed's name (Megatron-Core's unified_memory), for its callers


def device_ordinal(device, *, cpu: bool = False) -> int:
    """A device argument as the int uvm takes: None is the current CUDA device (0 without torch); an
    int passes as given (the library validates it and names it in its error); "cuda", "cuda:N" or a
    torch.device give the ordinal; "cpu" gives UVM_LOCATION_CPU where `cpu` allows a location."""
    if device is None:
        try:
            import torch
        except ImportError:
            return 0
        if not torch.cuda.is_available():  # torch's own error here would name no way out
            raise UnifiedMemoryUnsupportedError(
                f"no CUDA device for uvm: this torch ({torch.__version__}) sees none (built without CUDA, "
                "no GPU, or CUDA_VISIBLE_DEVICES hides them); pass a device ordinal to use uvm without torch's")
        return torch.cuda.current_device()
    if isinstance(device, bool):
        raise TypeError("a device is an int ordinal, a str or a torch.device, not a bool")
    if isinstance(device, int):
        return device
    kind, _, index = str(device).partition(":")
    if kind == "cpu" and not index:
        if cpu:
            return UVM_LOCATION_CPU
        raise ValueError(f"a CUDA device is needed here, not {device!r}")
    if kind == "cuda" and (not index or index.isdigit()):
        return int(index) if index else device_ordinal(None)
    allowed = "a CUDA device or 'cpu'" if cpu else "a CUDA device"
    raise ValueError(f"device must be {allowed} (an int, 'cuda:N' or a torch.device), not {device!r}")


# The devices the last move through the Python API ran on, per thread (None: one C call, whose
# report uvm_last_move(UVM_ANY_DEVICE) gives), for uvm.last_move().
_moved = threading.local()


def note_moved(devices: list[int] | None) -> None:
    _moved.devices = devices


def last_moved_devices() -> list[int] | None:
    return getattr(_moved, "devices", None)


_EXCEPTIONS = {
    UVM_ERROR_UNSUPPORTED: UnifiedMemoryUnsupportedError,
    UVM_ERROR_NO_DEVICE: UnifiedMemoryUnsupportedError,
    UVM_ERROR_INVALID_ARGUMENT: ValueError,
    UVM_ERROR_OUT_OF_MEMORY: MemoryError,
    UVM_ERROR_IO: OSError,
}


def synchronize(device: int) -> None:
    """Waits for all work on `device` through uvm's C library, not torch's bindings: at interpreter
    exit Python ends a daemon thread that waits here cleanly, where one waiting inside
    torch.cuda.synchronize aborts the process (terminate called without an active exception)."""
    check(library().uvm_device_synchronize(device))


@contextlib.contextmanager
def thread_setting(name: str, value):
    """Inside, this thread's uvm_set_thread_<name>(value) holds (tag, backup, compression, exportable:
    what uvm_malloc records with each allocation); the setting before comes back after."""
    lib = library()
    previous = getattr(lib, f"uvm_get_thread_{name}")()
    setter = getattr(lib, f"uvm_set_thread_{name}")
    check(setter(value))
    try:
        yield
    finally:
        setter(previous)


def paused_count(tag: str) -> int:
    """How many live allocations of `tag`, on any device, uvm_pause has paused."""
    count = ctypes.c_size_t()
    check(library().uvm_paused_count(UVM_ANY_DEVICE, tag.encode(), ctypes.byref(count)))
    return count.value


def check(status: int, about: str = "") -> None:
    """Raises the exception that fits `status`, with uvm's own message (after `about`, if given);
    does nothing for UVM_OK."""
    if status == UVM_OK:
        return
    message = (_ctypes_lib.uvm_last_error() or b"").decode(errors="replace")
    message = message or _ctypes_lib.uvm_status_string(status).decode()
    raise _EXCEPTIONS.get(status, RuntimeError)(f"{about}: {message}" if about else message)
