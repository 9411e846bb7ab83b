"""uvm: CUDA unified-memory allocator — a drop-in for Megatron-Core's
`core.inference.unified_memory` (change one import), plus stats, limits and residency.

`import uvm` needs no torch; the torch helpers import it when called."""
from __future__ import annotations

import ctypes

from . import _build, _lib
from ._build import (CompilationState, UnifiedMemoryCompileTimeoutError, UnifiedMemoryUnsupportedError,
                     _compile_timeout, compile_allocator)
from ._lib import UVM_LOCATION_CPU, UVM_LOCATION_NONE, _get_ctypes_lib
from .torch import (advise_managed_module_parameters_preferred_location, advise_managed_tensor_accessed_by,
                    advise_managed_tensor_preferred_location, create_unified_mempool, discard_managed_tensor,
                    prefetch_managed_module_parameters, prefetch_managed_tensor, where)

__version__ = "0.1.0"

# The seed's module state lives in _build and _lib; these names read it there.
_STATE = {"_compilation_state": _build, "_compilation_error": _build, "_so_path": _build, "_alloc": _build,
          "_mod": _build, "_ctypes_lib": _lib, "_ctypes_lock": _lib}


def __getattr__(name):
    if name in _STATE:
        return getattr(_STATE[name], name)
    raise AttributeError(f"module 'uvm' has no attribute {name!r}")


def library() -> ctypes.CDLL:
    """libuvm.so as a ctypes.CDLL with every entry declared (builds it if needed; no torch)."""
    return _get_ctypes_lib()


def _device_or_current(device) -> int:
    if device is not None:
        return int(device)
    try:
        import torch
        return torch.cuda.current_device()
    except ImportError:
        return 0


def stats(device=None) -> dict:
    """uvm's counters for `device` (default: the current one): live, peak, limit, what moved where."""
    lib = _get_ctypes_lib()
    result = _lib.Stats()
    _lib.check(lib.uvm_get_stats(_device_or_current(device), ctypes.byref(result)), "uvm_get_stats")
    return {name: getattr(result, name) for name, _ in _lib.Stats._fields_}


def set_limit(limit_bytes: int | None, device=None) -> None:
    """Caps the live managed bytes uvm allocates on `device`. None restores the default (the device's
    total memory); a cap above it oversubscribes, which is the caller's explicit choice."""
    lib = _get_ctypes_lib()
    if limit_bytes is not None and limit_bytes <= 0:
        raise ValueError(f"limit_bytes must be > 0 or None, got {limit_bytes}")
    _lib.check(lib.uvm_set_limit(_device_or_current(device), limit_bytes or 0), "uvm_set_limit")


__all__ = [
    "CompilationState", "UnifiedMemoryUnsupportedError", "UnifiedMemoryCompileTimeoutError",
    "compile_allocator", "create_unified_mempool", "prefetch_managed_tensor",
    "advise_managed_tensor_preferred_location", "advise_managed_tensor_accessed_by",
    "prefetch_managed_module_parameters", "advise_managed_module_parameters_preferred_location",
    "discard_managed_tensor", "where", "stats", "set_limit", "library", "UVM_LOCATION_CPU",
    "UVM_LOCATION_NONE",
]
