"""libuvm_preload.so, the cudaMalloc interposer behind uvm.memory_saver's hook mode "preload"
(include/uvm_preload.h): where it is, the environment a child process needs to preload it, and a
ctypes view of it with torch_memory_saver's C names declared as the original declares them."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
from pathlib import Path

from . import _build, _lib


@functools.lru_cache(maxsize=None)
def in_process() -> ctypes.CDLL | None:
    """The process's symbols, declared, when it preloads the interposer; else None."""
    process = _lib.preloaded_process()
    return _declared(process) if process is not None else None


def library_path() -> Path:
    """The interposer beside the libuvm.so this process uses (built beside it if needed)."""
    _lib.library()
    try:
        return _build.preload_library(Path(_lib._so_path))
    except _build.BuildError as error:
        raise _lib.UnifiedMemoryUnsupportedError(f"building {_build.PRELOAD_NAME} failed: {error}") from None


@functools.lru_cache(maxsize=None)
def tms_package_file() -> str:
    """The switched torch_memory_saver's __file__ (found once: inspect reads every module's __file__,
    and the wheel's check hashes its sources): two folders below a folder holding uvm's interposer
    under torch_memory_saver's file names (_build.TMS_PRELOAD_NAMES), where slime's train actors look
    for the library to preload. The wheel's _prebuilt/ (the same path on every node of a cluster
    installed alike); else the folder of the interposer beside this process's libuvm.so (built if
    needed), given those names as links there, or in a folder of uvm's cache where that one is not
    writable."""
    shipped = _build.SHIPPED
    if all((shipped / name).is_file() for name in _build.TMS_PRELOAD_NAMES) and _build.shipped_manifest():
        return str(shipped / _build.TMS_PACKAGE_FILE)
    interposer = library_path()
    folder = interposer.parent
    try:
        _link_tms_names(folder, interposer)
    except OSError:
        digest = hashlib.sha256(str(interposer).encode()).hexdigest()[:16]
        folder = _build.configured_cache_dir() / "tms-preload" / digest
        folder.mkdir(parents=True, exist_ok=True)
        _link_tms_names(folder, interposer)
        libuvm = folder / "libuvm.so"  # the interposer opens the libuvm beside the name it was preloaded by
        if not libuvm.exists():
            libuvm.symlink_to(interposer.with_name("libuvm.so"))
    return str(folder / _build.TMS_PACKAGE_FILE)


def _link_tms_names(folder: Path, interposer: Path) -> None:
    for name in _build.TMS_PRELOAD_NAMES:
        link = folder / name
        if not link.exists():
            link.symlink_to(interposer if interposer.parent != folder else interposer.name)
    package = folder / _build.TMS_PACKAGE_FILE
    if not package.exists():
        package.parent.mkdir(exist_ok=True)
        package.write_text(_build.TMS_PACKAGE_TEXT)


@functools.lru_cache(maxsize=None)
def names() -> ctypes.CDLL:
    """torch_memory_saver's C names (tms_*) and the interposer's own: the preloaded library, or in
    hook mode "torch" the same library opened without interposing (its cudaMalloc unused). Opened
    and declared once."""
    process = in_process()
    if process is not None:
        return process
    path = library_path()
    opened = _declared(ctypes.CDLL(str(path)))
    reason = opened.uvm_preload_load_error()
    if reason:
        raise _lib.UnifiedMemoryUnsupportedError(f"{path}: {reason.decode()}")
    return opened


def tags(process: ctypes.CDLL) -> list[str]:
    """The tags the interposer allocated under."""
    found, index = [], 0
    while (name := process.uvm_preload_tag_name(index)) is not None:
        found.append(name.decode())
        index += 1
    return found


def cuda_runtime_in_use() -> str | None:
    """The CUDA runtime file this process has loaded, for a child to load the same: torch's, torch
    being imported for it if it is installed (its import loads the runtime by path; a child that
    opened another file of the same soname first would hold two runtimes)."""
    found = _mapped_cuda_runtime()
    if found is None:
        try:
            import torch  # noqa: F401
        except ImportError:
            return None
        found = _mapped_cuda_runtime()
    return found


def _mapped_cuda_runtime() -> str | None:
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                if "/libcudart.so" in path and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return None


@contextlib.contextmanager
def child_environment(interposer=None):
    """os.environ as a child process needs it to preload the interposer (`interposer`, default the
    one beside this process's libuvm.so): LD_PRELOAD first, the entries already there kept after it,
    the libuvm.so it must open, and the CUDA runtime this process uses; put back on exit."""
    interposer = str(interposer if interposer is not None else library_path())
    wanted = {"LD_PRELOAD": ":".join(filter(None, [interposer, os.environ.get("LD_PRELOAD", "")]))}
    if _lib._so_path is not None:
        wanted["UVM_PRELOAD_LIBUVM"] = _lib._so_path
    runtime = cuda_runtime_in_use()
    if runtime is not None:
        wanted["UVM_PRELOAD_CUDART"] = runtime
    before = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_SIGNATURES = {  # torch_memory_saver's declarations of its C names, and the interposer's own
    "tms_set_current_tag": (None, [ctypes.c_char_p]),
    "tms_get_current_tag": (ctypes.c_char_p, []),
    "tms_set_interesting_region": (None, [ctypes.c_bool]),
    "tms_get_interesting_region": (ctypes.c_bool, []),
    "tms_set_enable_cpu_backup": (None, [ctypes.c_bool]),
    "tms_get_enable_cpu_backup": (ctypes.c_bool, []),
    "tms_set_cpu_backup_backend": (None, [ctypes.c_char_p]),
    "tms_get_cpu_backup_backend": (ctypes.c_char_p, []),
    "tms_set_enable_disk_backup": (None, [ctypes.c_bool]),
    "tms_get_enable_disk_backup": (ctypes.c_bool, []),
    "tms_set_disk_backup_dir": (None, [ctypes.c_char_p]),
    "tms_pause": (ctypes.c_int, [ctypes.c_char_p]),
    "tms_resume": (ctypes.c_int, [ctypes.c_char_p]),
    "tms_set_retain_cpu_backup": (None, [ctypes.c_bool]),
    "tms_get_retain_cpu_backup": (ctypes.c_bool, []),
    "tms_get_cpu_backup_pointer": (ctypes.POINTER(ctypes.c_uint8), [ctypes.POINTER(ctypes.c_uint8), ctypes.c_uint64]),
    "uvm_preload_active": (ctypes.c_int, []),
    "uvm_preload_load_error": (ctypes.c_char_p, []),
    "uvm_preload_libuvm_path": (ctypes.c_char_p, []),
    "uvm_preload_set_region": (ctypes.c_int, [ctypes.c_int]),
    "uvm_preload_get_region": (ctypes.c_int, []),
    "uvm_preload_set_region_device": (ctypes.c_int, [ctypes.c_int]),
    "uvm_preload_get_region_device": (ctypes.c_int, []),
    "uvm_preload_pause": (ctypes.c_int, [ctypes.c_char_p]),
    "uvm_preload_resume": (ctypes.c_int, [ctypes.c_char_p]),
    "uvm_preload_tag_name": (ctypes.c_char_p, [ctypes.c_size_t]),
    "uvm_preload_live_allocations": (ctypes.c_size_t, []),
}


def _declared(handle: ctypes.CDLL) -> ctypes.CDLL:
    for name, (restype, argtypes) in _SIGNATURES.items():
        function = getattr(handle, name)
        function.restype, function.argtypes = restype, argtypes
    return handle
