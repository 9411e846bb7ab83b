"""torch_memory_saver.utils, as uvm answers it: the environment helper its callers use, the platform
check (uvm runs on CUDA only), and where the interposer of hook mode "preload" is."""
from __future__ import annotations

import contextlib
import os


def is_xpu() -> bool:
    """Whether the device is an Intel GPU: never under uvm, which runs on CUDA only."""
    return False


@contextlib.contextmanager
def change_env(name: str, value: str):
    """Sets environment variable `name` to `value` inside; afterwards it is as before (absent stays
    absent)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


# The original's names for its two hook libraries; uvm's interposer serves "preload", and hook mode
# "torch" needs no library of its own (uvm.memory_saver registers a pluggable allocator).
PRELOAD_STEM = "torch_memory_saver_hook_mode_preload"


def get_binary_path_from_package(stem: str):
    """The library the original would load for `stem`: for hook mode "preload", uvm's interposer
    (built beside the libuvm.so this process uses if needed). Other stems have no uvm library."""
    if stem != PRELOAD_STEM:
        raise ValueError(f"uvm provides no {stem!r} library: hook mode \"torch\" needs none "
                         f"(only {PRELOAD_STEM!r}, uvm's cudaMalloc interposer)")
    from uvm import _preload
    return _preload.library_path()
