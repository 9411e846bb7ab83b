"""The seed's module state (names as in Megatron-Core's `unified_memory`): whether the allocator was
built, why not, and the torch allocators over libuvm.so, kept for the life of the process."""
from __future__ import annotations

import contextlib
import enum
import threading

from . import _build, _lib
from ._errors import UnifiedMemoryCompileTimeoutError, UnifiedMemoryUnsupportedError


class CompilationState(enum.Enum):
    UNATTEMPTED = 0
    FAILURE = 1
    SUCCESS = 2


_compilation_state = CompilationState.UNATTEMPTED
_compilation_error: str | None = None
_alloc = None  # torch.cuda.memory.CUDAPluggableAllocator over uvm_malloc
_alloc_releasable = None  # the same over uvm_malloc_releasable (uvm.create_releasable_mempool)
_mod = None    # the loaded library (ctypes.CDLL); the seed's name for its compiled module
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
    """Builds libuvm.so and wraps it in a torch CUDAPluggableAllocator. Attempts once; later calls
    return at once. Records the state (_compilation_state) and, on failure, the reason
    (_compilation_error). Raises only UnifiedMemoryCompileTimeoutError, as the seed does."""
    global _compilation_state, _compilation_error, _alloc, _alloc_releasable, _mod
    with _state_lock:
        if _compilation_state is not CompilationState.UNATTEMPTED:
            return
        try:
            _mod = _lib.load(_lib.build_library())  # first, so ctypes users get the library regardless
            refusal = _torch_refusal()
            if refusal:
                raise UnifiedMemoryUnsupportedError(refusal)
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


def allocator(releasable: bool):
    """The torch allocator for a pool (after a successful compile_allocator)."""
    return _alloc_releasable if releasable else _alloc
