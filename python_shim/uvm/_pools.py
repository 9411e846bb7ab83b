"""The life of uvm's torch pools: a dropped pool gives its memory back, as a torch.cuda.MemPool does,
but never at a moment when that would abort the process.

When a MemPool dies, torch releases it and empties its cache; emptying asserts (aborting the
process) if any allocation into a pool or graph capture is under way on the device. A pool's last
reference can go at any moment: the garbage collector collects a reference cycle inside whatever
allocation triggers it, in any thread, perhaps inside `torch.cuda.use_mem_pool(other)`. So each
uvm pool's `__del__` looks first: when nothing uvm can see is allocating into a pool or capturing,
the pool dies at once (torch's own behaviour); otherwise `__del__` keeps it (Python lets a
finalizer keep its object) and it dies at the next safe point: the end of uvm's last allocation
into a pool (busy()), the next uvm pool made or dropped, or `uvm.release_pool()`. Pools of torch's
own that callers use directly are not seen (docs/python-api.md says so)."""
from __future__ import annotations

import contextlib
import sys
import threading
import weakref

_live = weakref.WeakSet()  # every uvm pool not yet dropped
_deferred: list = []       # dropped while unsafe (uvm's pools, and torch's that uvm made); they die at the next safe point
_lock = threading.RLock()  # re-entered when the collector drops a pool inside this module
_busy = 0                  # uvm's own allocations into pools and captures under way, in any thread (busy())
_pool_class = None


def make(allocator, device_index: int):
    """A torch.cuda.MemPool over `allocator` on `device_index` (the current device) whose memory goes
    back when it is dropped, at a safe point."""
    import torch
    with _lock:  # two threads' first pools make one class: a pool of another is not seen as uvm's
        return _make_locked(torch, allocator, device_index)


def _make_locked(torch, allocator, device_index: int):
    global _pool_class
    if _pool_class is None:
        class UnifiedMemoryPool(torch.cuda.MemPool):
            """A torch.cuda.MemPool of uvm's; dropping it is safe at any moment (see uvm._pools)."""

            def __del__(self):
                with _lock:  # the check and the death, with no uvm entry of a pool between them
                    if not _release_is_safe(self):
                        _deferred.append(self)  # kept: its finalizer will not run again
                        return
                    release_dropped_pools()

        _pool_class = UnifiedMemoryPool
    pool = _pool_class(allocator)
    pool.uvm_device = device_index  # for a reader of a pool (torch's own attribute is C++-side only)
    pool.uvm_graph_holds = 0        # CUDA graphs of uvm.memory_saver captured into it and still alive
    _live.add(pool)
    return pool


def is_uvm_pool(pool) -> bool:
    return _pool_class is not None and isinstance(pool, _pool_class)


@contextlib.contextmanager
def busy():
    """uvm allocates into a pool, or captures a graph, inside (uvm.memory_saver's regions, disable(),
    cuda_graph): no pool dies meanwhile, in any thread, and those dropped meanwhile die at its end.
    Entered under the lock that every release takes, so a release never falls between a check and
    the allocation it allowed."""
    global _busy
    with _lock:
        _busy += 1
    try:
        yield
    finally:
        with _lock:
            _busy -= 1
            if _busy == 0:
                release_dropped_pools()


def retire(pool) -> None:
    """Lets a pool uvm made (a torch.cuda.MemPool of torch's own, say) die now if that is safe, else at
    the next safe point. The caller holds no other reference."""
    with _lock:
        if not _release_is_safe(pool):
            _deferred.append(pool)
        del pool  # here, under the lock, when nothing keeps it


def hold_for_graph(pool, graph) -> None:
    """A CUDA graph captured into `pool` holds it (one more on its use count) while the graph lives:
    that hold is not an allocation under way, so it does not keep dropped pools waiting."""
    with _lock:
        pool.uvm_graph_holds += 1
    weakref.finalize(graph, _graph_gone, weakref.ref(pool))


def _graph_gone(pool_ref) -> None:
    with _lock:
        pool = pool_ref()
        if pool is not None:
            pool.uvm_graph_holds -= 1


def _release_is_safe(dying=None) -> bool:
    """Whether a pool may die now: this thread captures no graph, uvm allocates into no pool in any
    thread (busy()), and no uvm pool is being allocated into by anyone else (torch.cuda.use_mem_pool
    adds one to its use count). A pool counts itself once, plus one per live graph of
    uvm.memory_saver captured into it; a graph a caller captured into a uvm pool itself holds one
    more until it is reset, which delays the release of every dropped pool until then (safe, and
    rare). Pools of torch's own that callers use directly are not seen (docs/python-api.md)."""
    torch = sys.modules.get("torch")  # imported, since a pool exists; not imported again at exit
    try:
        if _busy or torch.cuda.is_current_stream_capturing():
            return False
        return all(pool.use_count() <= 1 + pool.uvm_graph_holds for pool in list(_live) if pool is not dying)
    except Exception:  # noqa: BLE001 - at interpreter exit torch may be half torn down: wait
        return False


def release_dropped_pools() -> int:
    """Lets every pool dropped at an unsafe moment die, if now is safe; returns how many still wait.
    They die under the lock, so no uvm entry of a pool starts between the check and their death."""
    with _lock:
        if _deferred and _release_is_safe():
            dying = _deferred[:]
            _deferred.clear()
            del dying  # each dies here (its memory goes back to torch's cache, then uvm)
        return len(_deferred)


def waiting() -> int:
    """How many dropped pools wait for a safe point."""
    with _lock:
        return len(_deferred)
