"""The seed's module state (names as in Megatron-Core's `unified_memory`): whether the allocator was
built, why not, and the torch allocators over libuvm.so, kept for the life of the process — with the
hook that reports PyTorch's blocks to uvm (_torch_blocks.cpp), so that staged bytes die with the
tensor they were staged for when the caching allocator reuses its block."""
from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import ctypes
import enum
import sys
import threading
from pathlib import Path

from . import _build, _lib
from ._errors import (BuildError, BuildTimeout, UnifiedMemoryCompileTimeoutError,
                      UnifiedMemoryUnsupportedError)


class CompilationState(enum.Enum):
    UNATTEMPTED = 0
    FAILURE = 1
    SUCCESS = 2


_compilation_state = CompilationState.UNATTEMPTED
_compilation_error: str | None = None
_alloc = None  # torch.cuda.memory.CUDAPluggableAllocator over uvm_malloc
_alloc_releasable = None  # the same over uvm_malloc_releasable (uvm.create_releasable_mempool)
_mod = None    # the loaded library (ctypes.CDLL); the seed's name for its compiled module
_blocks_hook = None  # the loaded _torch_blocks.cpp, attached to torch's caching allocator
_state_lock = threading.Lock()


@contextlib.contextmanager
def _compile_timeout(timeout_s: float):
    """Builds started inside this block (in this thread or task) give up after `timeout_s` seconds
    and raise UnifiedMemoryCompileTimeoutError. Unlike a SIGALRM timer it works in any thread."""
    with _build.compile_timeout_override(timeout_s):
        yield


def _torch_refusal() -> str | None:
    """Why a torch MemPool on uvm cannot work in this process, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (uvm.library() gives the C library without it)"
    if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        return f"torch {torch.__version__} has no torch.cuda.MemPool; upgrade torch (2.6 or later)"
    if not torch.cuda.is_available():
        return "no CUDA device or driver is visible to torch (torch.cuda.is_available() is False)"
    return None


def compile_allocator() -> None:
    """Builds libuvm.so and wraps it in a torch CUDAPluggableAllocator, and attaches the hook that
    reports PyTorch's blocks to uvm (both built at once). Attempts once; later calls return at
    once. Records the state (_compilation_state) and, on failure, the reason (_compilation_error).
    Raises only UnifiedMemoryCompileTimeoutError, as the seed does."""
    global _compilation_state, _compilation_error, _alloc, _alloc_releasable, _mod
    with _state_lock:
        if _compilation_state is not CompilationState.UNATTEMPTED:
            return
        try:
            # With torch imported already, the hook builds beside libuvm; else torch is imported
            # (seconds) only once libuvm is built, so that a build's timeout is the build's.
            torch_loaded = "torch" in sys.modules
            refusal = _torch_refusal() if torch_loaded else None
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as builder:
                hook = _start_hook_build(builder) if torch_loaded and refusal is None else None
                _mod = _lib.load(_lib.build_library())  # first, so ctypes users get the library regardless
                refusal = refusal if torch_loaded else _torch_refusal()
                if refusal:
                    raise UnifiedMemoryUnsupportedError(refusal)
                _watch_blocks(_hook_path(hook or _start_hook_build(builder)))
            import torch
            _alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib._so_path, "uvm_malloc", "uvm_free")
            _alloc_releasable = torch.cuda.memory.CUDAPluggableAllocator(_lib._so_path, "uvm_malloc_releasable",
                                                                         "uvm_free")
            _compilation_state = CompilationState.SUCCESS
        except UnifiedMemoryCompileTimeoutError as error:
            _compilation_state, _compilation_error = CompilationState.FAILURE, str(error)
            raise
        except UnifiedMemoryUnsupportedError as error:
            _compilation_state, _compilation_error = CompilationState.FAILURE, str(error)
        except Exception as error:  # the compiler or torch failing in a way we did not foresee
            _compilation_state = CompilationState.FAILURE
            _compilation_error = f"{type(error).__name__}: {error}"


def _start_hook_build(builder: concurrent.futures.Executor) -> concurrent.futures.Future:
    """Starts building _torch_blocks.cpp against the installed torch beside libuvm's build (its
    headers take about 2 s)."""
    import torch
    torch_dir = Path(torch.__file__).resolve().parent
    build = contextvars.copy_context().run  # the thread keeps this one's compile timeout
    return builder.submit(build, _build.build_torch_blocks, torch_dir, bool(torch._C._GLIBCXX_USE_CXX11_ABI))


def _hook_path(hook: concurrent.futures.Future) -> Path:
    try:
        return hook.result()
    except BuildTimeout as error:
        raise UnifiedMemoryCompileTimeoutError(str(error)) from None
    except BuildError as error:
        raise UnifiedMemoryUnsupportedError(f"building the hook that reports PyTorch's blocks to uvm failed "
                                            f"(without it, staged bytes could land on reused blocks): {error}") from None


def _watch_blocks(path: Path) -> None:
    """Attaches the hook to torch's caching allocator, whose device allocators exist once CUDA is
    initialized: from then on every block handed out or taken back, in any pool, is reported."""
    global _blocks_hook
    import torch
    torch.cuda.init()
    hook = ctypes.CDLL(str(path))
    hook.uvm_torch_watch_blocks.restype = ctypes.c_int
    hook.uvm_torch_watch_blocks.argtypes = [ctypes.c_void_p] * 3
    entry = lambda name: ctypes.cast(getattr(_mod, name), ctypes.c_void_p)
    _lib.check(_mod.uvm_report_blocks(1))  # every segment made from now on has its blocks reported
    if hook.uvm_torch_watch_blocks(entry("uvm_block_allocated"), entry("uvm_block_freed"), entry("uvm_last_error")):
        raise UnifiedMemoryUnsupportedError(f"{path} refused uvm's entry points")
    _blocks_hook = hook


def allocator(releasable: bool):
    """The torch allocator for a pool (after a successful compile_allocator)."""
    return _alloc_releasable if releasable else _alloc
