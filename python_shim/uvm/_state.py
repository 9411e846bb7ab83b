"""The seed's module state (names as in Megatron-Core's `unified_memory`): whether the allocator was
built, why not, and the torch allocators over libuvm.so, kept for the life of the process — with the
hook that reports PyTorch's blocks to uvm (_torch_blocks.cpp), so that staged bytes die with the
tensor they were staged for when the caching allocator reuses its block.

The hook is the installed package's prebuilt one for this torch release, else one compiled against
the installed torch, and is armed only once a probe shows it reads this torch's trace entries right.
Without it uvm stays safe with less (require_block_hook): managed pools whose memory the driver
moves, and a refusal, naming why, of what would keep a copy that could outlive a block."""
from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import ctypes
import enum
import os
import sys
import threading
import warnings
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
_blocks_hook = None  # the loaded _torch_blocks.cpp, attached to torch's caching allocator and armed
_blocks_hook_path: Path | None = None
_blocks_unavailable: str | None = None  # why there is no armed hook (the allocator built without one)
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
    reports PyTorch's blocks to uvm (shipped, or built beside libuvm). Attempts once; later calls
    return at once. Records the state (_compilation_state) and, on failure, the reason
    (_compilation_error). Raises only UnifiedMemoryCompileTimeoutError, as the seed does. Without a
    hook it succeeds, says so once, and require_block_hook refuses what needs one."""
    global _compilation_state, _compilation_error, _alloc, _alloc_releasable, _mod
    with _state_lock:
        if _compilation_state is not CompilationState.UNATTEMPTED:
            return
        try:
            # With torch imported already, a hook to compile builds beside libuvm; else torch is
            # imported (seconds) only once libuvm is built, so that a build's timeout is the build's.
            torch_loaded = "torch" in sys.modules
            refusal = _torch_refusal() if torch_loaded else None
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as builder:
                hook = _find_hook(builder) if torch_loaded and refusal is None else None
                _mod = _lib.load(_lib.build_library())  # first, so ctypes users get the library regardless
                refusal = refusal if torch_loaded else _torch_refusal()
                if refusal:
                    raise UnifiedMemoryUnsupportedError(refusal)
                _attach_hook(hook or _find_hook(builder))
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


def _find_hook(builder: concurrent.futures.Executor) -> concurrent.futures.Future:
    """The block hook for the installed torch: the package's prebuilt one for its release, else one
    compiled against its headers (started on `builder`, beside libuvm's build: about 2 s). The
    future's result is a path, or the reason there is none (a str)."""
    import torch
    abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    shipped, why_not = _build.shipped_torch_hook(torch.__version__, abi)
    if os.environ.get("UVM_PREBUILT", "1") == "0":
        shipped, why_not = None, "UVM_PREBUILT=0 asks for a hook compiled here"
    done: concurrent.futures.Future = concurrent.futures.Future()
    if shipped is not None:
        done.set_result(shipped)
        return done
    torch_dir = Path(torch.__file__).resolve().parent
    if not (torch_dir / "include" / "c10" / "cuda" / "CUDACachingAllocator.h").is_file():
        done.set_result(f"{why_not}, and torch {torch.__version__} has no C++ headers to compile one against")
        return done

    def compile_here():
        try:
            return _build.build_torch_blocks(torch_dir, abi)
        except BuildTimeout:
            raise
        except BuildError as error:
            return f"{why_not}, and compiling one here failed: {error}"

    return builder.submit(contextvars.copy_context().run, compile_here)  # keeps this thread's compile timeout


def _attach_hook(hook: concurrent.futures.Future) -> None:
    """Attaches, probes and arms the hook; records why not where there is none or it reads this
    torch's trace entries wrong (then it stays attached and inert: torch cannot detach one)."""
    global _blocks_unavailable
    try:
        found = hook.result()
    except BuildTimeout as error:
        raise UnifiedMemoryCompileTimeoutError(str(error)) from None
    problem = found if isinstance(found, str) else _watch_blocks(found)
    if problem is not None:
        _blocks_unavailable = problem
        warnings.warn(f"uvm: {_NO_HOOK_CONSEQUENCES} Why: {problem}", RuntimeWarning, stacklevel=3)


_NO_HOOK_CONSEQUENCES = (
    "PyTorch's block hook is unavailable, so uvm cannot see a tensor's block handed to another tensor. "
    "Managed pools work, and an offload of their memory migrates it with the driver (strategy 'migrate', "
    "which keeps no copy that could outlive its block; slower to the host than 'staged'). Releasable pools, "
    "uvm.memory_saver in hook_mode 'torch', and offload strategies 'staged', 'mmap' and 'disk' are refused; "
    "memory_saver's hook_mode 'preload' needs no hook.")


def _watch_blocks(path: Path) -> str | None:
    """Attaches the hook at `path` to torch's caching allocator (whose device allocators exist once
    CUDA is initialized), checks on one tensor made and freed that it reads torch's trace entries
    right, then arms it: from then on every block handed out or taken back, in any pool, is
    reported. Returns None, or what went wrong."""
    global _blocks_hook, _blocks_hook_path
    import torch
    torch.cuda.init()
    try:
        hook = ctypes.CDLL(str(path))
        for name, restype, argtypes in (("uvm_torch_blocks_attach", ctypes.c_int, []),
                                        ("uvm_torch_blocks_probe", None, [ctypes.c_int]),
                                        ("uvm_torch_blocks_saw", ctypes.c_int,
                                         [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t]),
                                        ("uvm_torch_blocks_arm", ctypes.c_int, [ctypes.c_void_p] * 3)):
            entry = getattr(hook, name)
            entry.restype, entry.argtypes = restype, argtypes
    except (OSError, AttributeError) as error:
        return f"the block hook {path} cannot be loaded: {error}"
    hook.uvm_torch_blocks_attach()
    probe_bytes = 4099  # a size no rounding produces, on the current device
    hook.uvm_torch_blocks_probe(1)
    try:
        tensor = torch.empty(probe_bytes, dtype=torch.uint8, device="cuda")
        ptr = tensor.data_ptr()
        del tensor
    finally:
        hook.uvm_torch_blocks_probe(0)
    allocated, freed = hook.uvm_torch_blocks_saw(1, ptr, probe_bytes), hook.uvm_torch_blocks_saw(2, ptr, probe_bytes)
    if not (allocated and freed):
        return (f"the block hook {path} does not read torch {torch.__version__}'s trace entries right: for a "
                f"{probe_bytes}-byte tensor at 0x{ptr:x} it saw {'the' if allocated else 'no'} allocation and "
                f"{'the' if freed else 'no'} free (left attached and inert)")
    entry = lambda name: ctypes.cast(getattr(_mod, name), ctypes.c_void_p)
    _lib.check(_mod.uvm_report_blocks(1))  # every segment made from now on has its blocks reported
    if hook.uvm_torch_blocks_arm(entry("uvm_block_allocated"), entry("uvm_block_freed"), entry("uvm_last_error")):
        return f"{path} refused uvm's entry points"
    _blocks_hook, _blocks_hook_path = hook, Path(path)
    return None


def block_hook_status() -> str:
    """One line on the block hook, for `uvm doctor`."""
    if _blocks_hook is not None:
        return f"armed ({_blocks_hook_path})"
    if _blocks_unavailable is not None:
        return f"unavailable: {_blocks_unavailable}"
    return "not attached (no pool made yet)"


def require_block_hook(what: str) -> None:
    """Raises UnifiedMemoryUnsupportedError if the allocator was built without an armed block hook:
    `what` (e.g. "a releasable pool") could then lose bytes to a block handed to another tensor."""
    if _compilation_state is CompilationState.SUCCESS and _blocks_unavailable is not None:
        raise UnifiedMemoryUnsupportedError(f"{what} needs uvm's PyTorch block hook, which is unavailable here: "
                                            f"{_blocks_unavailable}. {_NO_HOOK_CONSEQUENCES}")


def moves_must_migrate() -> bool:
    """Whether offloads must leave moving to the driver: torch pools exist without a block hook."""
    return _compilation_state is CompilationState.SUCCESS and _blocks_unavailable is not None


def allocator(releasable: bool):
    """The torch allocator for a pool (after a successful compile_allocator)."""
    return _alloc_releasable if releasable else _alloc
