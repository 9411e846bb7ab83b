"""uvm: CUDA unified-memory allocator — a drop-in for Megatron-Core's
`core.inference.unified_memory` (change one import), plus stats, limits and residency.

`import uvm` needs no torch; the torch helpers import it when called."""
from __future__ import annotations

import contextlib
import ctypes
import os

from . import _lib, _state
from ._errors import UnifiedMemoryCompileTimeoutError, UnifiedMemoryUnsupportedError
from ._lib import UVM_LOCATION_CPU, UVM_LOCATION_NONE, _get_ctypes_lib, library
from ._state import CompilationState, _compile_timeout, compile_allocator
from .torch import (advise_managed_module_parameters_preferred_location, advise_managed_tensor_accessed_by,
                    advise_managed_tensor_preferred_location, create_releasable_mempool,
                    create_unified_mempool, discard, release_pool,
                    discard_managed_tensor, offload, onload, prefetch_managed_module_parameters,
                    prefetch_managed_tensor, where)
from .streaming import Streamed, stream



def _release() -> str:
    """The release, read from uvm.h (UVM_VERSION_*), the one place it is written."""
    import re
    from . import _build
    try:
        header = (_build.source_root() / "include" / "uvm.h").read_text()
    except (OSError, _build.BuildError):
        return "unknown"
    parts = [re.search(rf"#define UVM_VERSION_{part} (\d+)", header) for part in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(part.group(1) for part in parts) if all(parts) else "unknown"


__version__ = _release()

# The seed's module state lives in _state and _lib; these names read it there.
_STATE = {"_compilation_state": _state, "_compilation_error": _state, "_alloc": _state, "_mod": _state,
          "_so_path": _lib, "_ctypes_lib": _lib, "_ctypes_lock": _lib}


def __getattr__(name):
    if name in _STATE:
        return getattr(_STATE[name], name)
    raise AttributeError(f"module 'uvm' has no attribute {name!r}")


def stats(device=None) -> dict:
    """uvm's counters for `device` (default: the current one): live, peak, limit, what moved where."""
    lib = library()
    result = _lib.Stats()
    _lib.check(lib.uvm_get_stats(_lib.device_ordinal(device), ctypes.byref(result)))
    return {name: getattr(result, name) for name, _ in _lib.Stats._fields_}


def set_limit(limit_bytes: int | None, device=None) -> None:
    """Caps the live managed bytes uvm allocates on `device`. None restores the default (the device's
    total memory); a cap above it oversubscribes, which is the caller's explicit choice
    (`uvm._lib.UVM_LIMIT_UNLIMITED`, 2**64 - 1, allows any size)."""
    if limit_bytes is not None:
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int):
            raise TypeError(f"limit_bytes must be an int number of bytes or None, not {type(limit_bytes).__name__}")
        if not 0 < limit_bytes <= _lib.UVM_LIMIT_UNLIMITED:
            raise ValueError(f"limit_bytes must be between 1 and 2**64 - 1 (or None for the default), "
                             f"got {limit_bytes}")
    lib = library()
    _lib.check(lib.uvm_set_limit(_lib.device_ordinal(device), limit_bytes or 0))


@contextlib.contextmanager
def tag(name: str | None):
    """Allocations this thread makes inside the block carry `name` ("weights", "kv_cache"), so that
    `offload(name)`, `onload(name)`, `discard(name)` and `residency(tag=name)` act on all of them.
    PyTorch reuses cached blocks within a pool, so give each tag its own pool:

        with uvm.tag("weights"), torch.cuda.use_mem_pool(weights_pool):
            model = build_model()
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"a tag is a str (or None for untagged), not {type(name).__name__}")
    with _lib.thread_setting("tag", None if name is None else name.encode()):
        yield


def tags() -> list[str]:
    """Every tag used in this process so far."""
    lib = library()
    return [lib.uvm_tag_name(i).decode() for i in range(lib.uvm_tag_count())]


def residency(device=None, tag: str | None = None) -> dict:
    """Where uvm last put the bytes of the allocations of `device` (default: the current one; "all"
    for every device) with `tag` (None: any; "": untagged): device_bytes, host_bytes (of which
    staged_bytes sit in uvm's pinned memory), discarded_bytes. cudaMemGetInfo cannot tell you this:
    it counts offloaded managed memory as used although any allocation can reclaim it."""
    lib = library()
    result = _lib.Residency()
    index = _lib.UVM_ANY_DEVICE if device == "all" else _lib.device_ordinal(device)
    _lib.check(lib.uvm_get_residency(index, None if tag is None else tag.encode(), ctypes.byref(result)))
    return {name: getattr(result, name) for name, _ in _lib.Residency._fields_}


def kept_copies(device=None, tag: str | None = None) -> dict:
    """The offloaded copies of the allocations of `device` (default: the current one; "all" for every
    device) with `tag`, by where they are kept: pinned_bytes (uvm's staging), pageable_bytes
    (strategy "mmap"), disk_bytes in disk_files files (strategy "disk"), and retained_bytes: copies
    a resume kept after bringing the bytes back (memory_saver's retain_cpu_backup)."""
    result = _lib.KeptCopies()
    index = _lib.UVM_ANY_DEVICE if device == "all" else _lib.device_ordinal(device)
    _lib.check(library().uvm_get_kept_copies(index, None if tag is None else tag.encode(), ctypes.byref(result)))
    return {name: getattr(result, name) for name, _ in _lib.KeptCopies._fields_}


def set_disk_backup_dir(path) -> None:
    """The directory strategy "disk" writes its files to (default: env UVM_DISK_BACKUP_DIR). It must
    exist, be writable, belong to this user and not be a tmpfs; else ValueError says which."""
    _lib.check(library().uvm_set_disk_backup_dir(os.fsencode(path)))


def disk_backup_dir() -> str | None:
    """The directory disk offloads go to, or None when none is set."""
    buffer = ctypes.create_string_buffer(4097)
    _lib.check(library().uvm_get_disk_backup_dir(buffer, len(buffer)))
    return os.fsdecode(buffer.value) or None


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of `device` (default: the current one), like torch.cuda.mem_get_info, with
    free counting what uvm knows any allocation can reclaim: managed bytes uvm offloaded or
    discarded, which the driver reports as used until someone allocates. An upper bound once
    another allocation has claimed some of them (uvm cannot see that). Memory of releasable pools
    is returned to the driver on offload, so the driver's figure already has it."""
    lib = library()
    free, total, reclaimable = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
    _lib.check(lib.uvm_mem_get_info(_lib.device_ordinal(device), ctypes.byref(free), ctypes.byref(total),
                                    ctypes.byref(reclaimable)))
    return min(free.value + reclaimable.value, total.value), total.value


def staging() -> dict:
    """The host memory uvm holds for staged offload: capacity_bytes, staged_bytes in use, and by how
    it was got (registered_bytes, host_alloc_bytes, pageable_bytes; pinning_bytes of the registered
    ones not pinned yet), in `blocks` host allocations; `kind` is what env UVM_PINNED asks for
    ("register", "hostalloc" or "pageable")."""
    info = _lib.StagingInfo()
    _lib.check(library().uvm_get_staging_info(ctypes.byref(info)))
    found = {name: getattr(info, name) for name, _ in _lib.StagingInfo._fields_ if name != "configured_kind"}
    found["kind"] = _lib.PINNED_KINDS.get(info.configured_kind, str(info.configured_kind))
    return found


def reserve_staging(nbytes: int) -> None:
    """Allocates pinned staging memory for a staged offload of up to `nbytes` ahead of need (at model
    load), so that the first offload pays no pinning (without it, that offload pins in steps while
    it copies, at a fraction of the steady speed: docs/measurements.md, "The first offload")."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be an int >= 0, not {nbytes!r}")
    _lib.check(library().uvm_reserve_staging(nbytes))


def prepare_pause(device="all", tag: str | None = None, max_bytes: int = 0) -> int:
    """Pins now the staging memory the next pause of the allocations of `device` ("all": every
    device) with `tag` (None: any) will copy into (those kept in pinned host memory, on their device,
    holding no copy), at most `max_bytes` more (0: no bound), so that a first pause runs as fast as
    the later ones; returns the bytes pinned. Call it from a thread of your own while the model loads
    (uvm.memory_saver does, at a region's end); release_staging() stops it after its batch."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"max_bytes must be an int >= 0, not {max_bytes!r}")
    index = _lib.UVM_ANY_DEVICE if device == "all" else _lib.device_ordinal(device)
    pinned = ctypes.c_size_t()
    _lib.check(library().uvm_prepare_pause(index, None if tag is None else tag.encode(), max_bytes,
                                           ctypes.byref(pinned)))
    return pinned.value


def release_staging() -> None:
    """Frees the pinned staging memory that holds no offloaded data."""
    _lib.check(library().uvm_release_staging())


def last_move(device=None) -> list[dict]:
    """What the last move this thread made (offload, onload, discard, prefetch) spent where, once its
    GPU work is done (waits for it): one dict per device it ran on (or for `device` only) with
    call, device, status, bytes, seconds (to the end of its GPU work), host_seconds (until the call
    returned), gbps, and phases: {name: {bytes, operations, start, seconds, gbps}} in order of start
    ("pin", "wait", "copy", "discard", "release", "map", "populate", "migrate"; phases overlap).
    [] if there is none. With env UVM_TRACE=<file>, every move is also written there as a Chrome
    trace (chrome://tracing, ui.perfetto.dev); Nsight Systems shows them as NVTX ranges."""
    lib = library()
    if device is not None:
        devices = [_lib.device_ordinal(device)]
    else:
        devices = _lib.last_moved_devices() or [_lib.UVM_ANY_DEVICE]
    reports = []
    for index in devices:
        report = _lib.MoveReport()
        _lib.check(lib.uvm_last_move(index, ctypes.byref(report)))
        if report.call:
            reports.append(_move_dict(report))
    return reports


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def _move_dict(report) -> dict:
    phases = {}
    for phase in report.phases[:report.phase_count]:
        phases[phase.name.decode()] = {"bytes": phase.bytes, "operations": phase.operations, "start": phase.start,
                                       "seconds": phase.seconds, "gbps": _gbps(phase.bytes, phase.seconds)}
    return {"call": report.call.decode(), "device": report.device,
            "status": library().uvm_status_string(report.status).decode(), "bytes": report.bytes,
            "seconds": report.seconds, "host_seconds": report.host_seconds,
            "gbps": _gbps(report.bytes, report.seconds), "phases": phases}


def trace_flush() -> None:
    """Writes every move recorded so far to the UVM_TRACE file, waiting for the GPU work still running
    (done at exit too). Nothing to do without UVM_TRACE."""
    _lib.check(library().uvm_trace_flush())


__all__ = [
    "CompilationState", "UnifiedMemoryUnsupportedError", "UnifiedMemoryCompileTimeoutError",
    "compile_allocator", "create_unified_mempool", "create_releasable_mempool", "release_pool", "prefetch_managed_tensor",
    "advise_managed_tensor_preferred_location", "advise_managed_tensor_accessed_by",
    "prefetch_managed_module_parameters", "advise_managed_module_parameters_preferred_location",
    "discard_managed_tensor", "where", "stats", "set_limit", "library", "UVM_LOCATION_CPU",
    "UVM_LOCATION_NONE", "offload", "onload", "discard", "tag", "tags", "residency", "kept_copies",
    "set_disk_backup_dir", "disk_backup_dir", "staging",
    "release_staging", "reserve_staging", "prepare_pause", "mem_get_info", "last_move", "trace_flush", "stream", "Streamed",
]
