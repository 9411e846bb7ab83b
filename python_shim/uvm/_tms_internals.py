"""torch_memory_saver's private names that its own example programs reach into —
`torch_memory_saver._impl._mem_pools`, `._with_region_config(...)` and `._binary_wrapper.cdll` (with
its tms_* names, in both hook modes) — so
that they run unchanged on uvm.memory_saver with only the import swapped. Not uvm's API: use
region(), pause() and resume()."""
from __future__ import annotations

from . import _lib, _preload


class PoolsByRegion(dict):
    """The region pools, keyed as the original keys them: (tag, enable_cpu_backup,
    enable_disk_backup, cpu backup backend or "", device). A pool taken out of here frees its memory
    once its last reference goes, as the original's does (uvm._pools: at a safe point)."""

    def __init__(self, lock):
        super().__init__()
        self._lock = lock


class _Names:
    """The original's C library as its callers see it: its tms_* names from uvm's interposer
    (preload/tms_names.cpp, declared as the original declares them), any other name from libuvm,
    which links the CUDA runtime (its tests call cudaHostGetFlags through this handle)."""

    def __init__(self):
        self._interposer = _preload.names()
        self._libuvm = _lib.library()

    def __getattr__(self, name: str):
        if name.startswith(("tms_", "uvm_preload_")):
            return getattr(self._interposer, name)
        return getattr(self._libuvm, name)


class _BinaryWrapper:
    """The original's handle on its C library."""

    @property
    def cdll(self):
        return _Names()


class Internals:
    """torch_memory_saver._impl: `region_config(tag, enable_cpu_backup, cpu_backup_backend,
    enable_disk_backup)` is memory_saver's, a region's settings without its pool."""

    def __init__(self, state, region_config):
        self._mem_pools = state.region_pools
        self._binary_wrapper = _BinaryWrapper()
        self._with_region_config = region_config
